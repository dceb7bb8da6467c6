"""Every ``python -m validation.X`` that checks a target exits 1 when a figure is past it (issue 20:
``python -m validation.ds3lab`` printed NOT MET and exited 0). The fit printers, which report a
fit and have no target, are listed with why; any other module with a ``__main__`` must end in
``raise SystemExit(...)`` / ``sys.exit(...)`` of a status its checks set."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from validation import ds3lab
from validation import layout_ranking as lr

ROOT = Path(__file__).resolve().parents[1]
FIT_PRINTERS = {  # module -> why it has no pass/fail
    "calibrate_a100": "prints the A100 fit (its held-out figures are checked by tests/test_calibration_a100.py)",
    "calibrate_direct_conv": "prints (and with --write writes) the direct-convolution fit",
    "calibrate_efa": "prints (and with --write writes) the EFA collective laws",
    "calibrate_frameworks": "prints (and with --write writes) the framework profiles' fits",
    "memory_classifier_ceiling": "an analysis (how well any classifier could do), no target",
}


def _main_calls(path: Path) -> list[ast.AST]:
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            return node.body
    return []


def test_every_validation_main_exits_with_its_checks_status():
    mains = {p.stem if p.name != "__main__.py" else p.parent.name: p
             for p in [*ROOT.glob("validation/*.py"), *ROOT.glob("validation/*/__main__.py")]
             if p.name == "__main__.py" or _main_calls(p)}
    assert {"ds3lab", "deeppool_model", "layout_ranking", "modern", "calibrate_microbench", "calibrate_conv"} <= set(mains)
    for name, path in mains.items():
        if name in FIT_PRINTERS:
            continue
        text = path.read_text()
        last = ast.unparse(_main_calls(path)[-1]) if _main_calls(path) else text.rstrip().splitlines()[-1]
        assert "SystemExit(" in last or "sys.exit(" in last, f"validation/{name}: __main__ ends in {last!r}"


def _block(name: str, met: bool) -> dict:
    return {"case_set": name, "source": "s", "cases": [], "notes": [], "met": met,
            "median_abs_error_heldout": 0.1502, "heldout_rows": 24, "target_median_abs_error": 0.15,
            "max_abs_error_heldout": 0.3}


def test_ds3lab_exits_1_when_a_set_misses(monkeypatch, capsys):
    monkeypatch.setattr(ds3lab, "REPORTS", {"a": lambda: _block("a", True), "b": lambda: _block("b", False)})
    assert ds3lab.main() == 1
    out = capsys.readouterr().out
    assert "15.02% over 24 rows (target 15%)" in out and out.rstrip().endswith("FAIL: b past target")
    monkeypatch.setattr(ds3lab, "REPORTS", {"a": lambda: _block("a", True)})
    assert ds3lab.main() == 0
    assert capsys.readouterr().out.rstrip().endswith("PASS")


def test_layout_ranking_exits_1_when_the_heldout_spearman_misses(monkeypatch, capsys):
    import pandas as pd

    oom = {"n": 10, "accuracy": 0.95, "confusion": {}, "invalid": 0}
    rank = {"runs": 5, "mean_spearman": 0.70, "min_spearman": 0.5, "median_abs_error": 0.1, "unpredicted": 0,
            "mean_spearman_if_run": 0.7, "groups": {}, "table": pd.DataFrame()}
    monkeypatch.setattr(lr, "calibrated", lambda name: ([], None))
    monkeypatch.setattr(lr, "oom_report", lambda part, overhead: oom)
    monkeypatch.setattr(lr, "ranking_report", lambda *a, **k: rank)
    monkeypatch.setattr(lr, "memory_error", lambda oom, part: {"n": 0})
    assert lr._main(["--set", "hagemann"]) == 1
    out = capsys.readouterr().out
    assert "MISS: hagemann held-out mean Spearman 0.700 < 0.8" in out and out.rstrip().endswith("FAIL")
    assert lr._main(["--set", "hagemann", "--split", "all"]) == 0   # not the half the targets are set on
    rank["mean_spearman"] = 0.85
    assert lr._main(["--set", "hagemann"]) == 0


@pytest.mark.parametrize(("sets", "code"), [(["ds3lab_p2p"], 0), (["ds3lab_p2p", "ds3lab_gpt3xl_megatron_dp"], 1)])
def test_ds3lab_from_the_shell_exits_1_exactly_when_a_set_is_not_met(sets, code):
    """Real runs of the cheap sets from the shell (the whole script, parameter servers included, takes ~36
    CPU-s; every set's figures are checked in-process by tests/test_ds3lab*.py): exit 1 and a FAIL line naming
    the set when a block says NOT MET (the Megatron DP set today: a strict xfail in tests/test_ds3lab_dp.py),
    else 0 and PASS."""
    argv = [arg for name in sets for arg in ("--set", name)]
    out = subprocess.run([sys.executable, "-m", "validation.ds3lab", *argv], capture_output=True, text=True, cwd=ROOT)
    last = out.stdout.rstrip().splitlines()[-1]
    assert out.returncode == code, out.stderr[-2000:]
    assert (out.returncode == 1) == ("NOT MET" in out.stdout) == last.startswith("FAIL: "), out.stdout[-2000:]
    assert last == ("FAIL: ds3lab_gpt3xl_megatron_dp past target" if code else "PASS")
