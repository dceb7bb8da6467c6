"""`python -m validation.calibrate_microbench` and `python -m validation.calibrate_collectives` print their
held-out tables and exit 1 when a figure is past its tolerance (the tolerances the tests enforce), 0 when
every one is met (issue 23: they printed misses and exited 0)."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd

from validation import calibrate_collectives as cc
from validation import calibrate_microbench as cm


def _run(module: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module], capture_output=True, text=True)


def test_microbench_exits_0_when_every_figure_is_met():
    # the MXFP8-over-bf16 grouped GEMM speedup is met on its held-out pairs since B200 has grouped-GEMM entries
    speedup = cm.mxfp8_speedup_table()
    assert speedup[speedup.heldout].error.abs().median() <= cm.MXFP8_SPEEDUP_MEDIAN
    out = _run("validation.calibrate_microbench")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert not [line for line in out.stdout.splitlines() if line.startswith("MISS:")]
    assert out.stdout.rstrip().endswith("PASS")


def test_microbench_misses_name_each_figure_past_tolerance():
    gemm = pd.DataFrame({"error": [0.01, -0.02, 0.31]})  # one row past 30%
    speedup = pd.DataFrame({"error": [0.01, 0.02, 0.5], "heldout": [True, True, False]})  # a fit pair off
    attention = pd.DataFrame({"accelerator": ["a", "a", "b"], "error": [0.07, -0.08, 0.01]})
    triton = pd.DataFrame({"error": [0.9]})
    in_step = pd.DataFrame({"accelerator": ["h200-sxm-141g"], "error": [-0.05]})
    text = "\n".join(cm.misses(gemm, speedup, attention, triton, in_step))
    assert "GEMM median / max |error| 2.0% / 31.0%" in text
    assert "attention a median |error| 7.5%" in text and "attention b" not in text
    assert "Triton A100 median |error| 90.0%" in text
    assert "FA3 in an H200 step: error -5.0%" in text
    assert "MXFP8" not in text
    speedup = pd.DataFrame({"error": [0.01, 0.2, 0.3], "heldout": [False, True, True]})
    text = "\n".join(cm.misses(gemm, speedup, attention, triton, in_step))
    assert "B200 MXFP8 grouped speedup held-out median |error| 25.0% > 15%" in text


def test_collectives_exit_1_while_the_cross_node_large_rows_miss(monkeypatch, capsys):
    # inside the node every figure is met; across nodes the >= 64 MiB rows are an unmet target (strict xfail in
    # tests/test_collectives_cross.py), and nothing else misses
    out = _run("validation.calibrate_collectives")
    assert out.returncode == 1 and out.stdout.rstrip().endswith("FAIL"), out.stdout[-2000:]
    assert [line for line in out.stdout.splitlines() if line.startswith("MISS:")] == [
        line for line in out.stdout.splitlines() if line.startswith("MISS: cross-node max |error| at >= 64 MiB")]
    assert not cc.misses(cc.heldout_table())
    table = cc.heldout_table()
    worse = table.assign(error=table.error * 1.6)  # the worst row (23.7%) past 30%
    assert any(m.startswith("max |error|") for m in cc.misses(worse))
    monkeypatch.setattr(cc, "heldout_table", lambda: worse)
    assert cc.main([]) == 1
    assert "MISS: max |error|" in capsys.readouterr().out
