"""End to end on this machine (CPU, gloo, world size 2): measure, calibrate, predict.

The harness runs its quick microbenchmarks and the training strategies; the profile is fitted
on the microbenchmarks only; every training run is then predicted with the simulator. The
issue's targets are asserted, not widened: median |relative error| <= 15%, every run <= 30%.
A few minutes on a 2-core machine.
"""

from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")

# Opt-in: on a shared 2-core machine the measured step times of 2-process runs swing by 2x with
# the load of other processes (see issue 3's note), so this check is run on purpose, on a quiet
# machine, with CLUSTERSIM_E2E=1 — not on every CI run.
pytestmark = [
    pytest.mark.torch,
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("CLUSTERSIM_E2E") != "1", reason="set CLUSTERSIM_E2E=1 to run the harness loop"),
]

MEDIAN_TOLERANCE = 0.15
MAX_TOLERANCE = 0.30


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    from validation.harness.run import run_microbench_files, run_training_files

    out = tmp_path_factory.mktemp("harness")
    run_microbench_files(out, world_size=2, quick=True)
    run_training_files(out, world_size=2, quick=True)
    return out


def test_calibrated_predictions_meet_the_targets(measured, capsys):
    from simulator.calibration import error_summary, predict_runs, read_runs
    from simulator.cli import main

    profile = measured / "profile.yaml"
    assert main(["calibrate", "--from", str(measured), "--out", str(profile)]) == 0
    rows = predict_runs(read_runs(measured), profile)
    assert {r["strategy"] for r in rows} == {"single", "ddp", "fsdp", "pp_gpipe", "pp_1f1b", "tp"}
    summary = error_summary(rows)
    table = "\n".join(f"{r['strategy']:<9s} measured {r['measured_step_time_s'] * 1e3:8.1f} ms  predicted "
                      f"{r['predicted_step_time_s'] * 1e3:8.1f} ms  error {r['relative_error'] * 100:+6.1f}%"
                      for r in rows)
    (measured / "validate_runs.txt").write_text(table + "\n" + json.dumps(summary) + "\n")
    print(table)
    assert summary["median_abs_relative_error"] <= MEDIAN_TOLERANCE, table
    assert summary["max_abs_relative_error"] <= MAX_TOLERANCE, table


def test_compare_reads_a_real_harness_trace(measured, capsys):
    from simulator.cli import main
    from simulator.trace_compare import measured_breakdown

    profile = measured / "profile.yaml"
    if not profile.is_file():
        assert main(["calibrate", "--from", str(measured), "--out", str(profile)]) == 0
    trace = measured / "training" / "traces" / "ddp_rank0.json"
    b = measured_breakdown(trace)
    assert b.busy_s["compute"] > 0 and b.busy_s["all_reduce"] > 0 and b.duration_s > 0
    png = measured / "ddp.png"
    capsys.readouterr()
    assert main(["compare", "--trace", str(trace), "--profile", str(profile), "--json", "--plot", str(png)]) == 0
    doc = json.loads(capsys.readouterr().out)
    cats = {r["category"] for r in doc["rows"]}
    assert {"step", "compute", "all_reduce", "optimizer"} <= cats
    assert png.is_file()
