"""Calibration: alpha-beta fits, the profile YAML, validate-runs on recorded files (no torch needed)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from hardware_specs.schema import Node
from simulator.cli import main
from simulator.cost.calibration import (
    build_profile,
    error_summary,
    fit_alpha_beta,
    gemm_speed_dips,
    load_profile_specs,
    predict_runs,
    read_microbench,
    read_runs,
    scenario_for_run,
    validate_profile,
    write_profile,
)
from simulator.errors import ConfigError

PEAK = 80e9          # flop/s
LAUNCH = 3e-6        # s
COPY_BW = 40e9       # bytes/s
EAGER_SUM = 20e-6    # s: sum().backward() of one element
EAGER_KERNEL = 11e-6  # s: what each of a linear's 3 kernels costs in an eager autograd step
LAWS = {"all_reduce": (120e-6, 1.5e9), "all_gather": (90e-6, 1.0e9), "reduce_scatter": (100e-6, 0.8e9),
        "broadcast": (60e-6, 2.0e9), "send_recv": (40e-6, 2.5e9)}
SIZES = [4096 * 4**i for i in range(8)]


def _eff(gflop: float) -> float:
    return float(np.interp(np.log10(gflop), [-3.5, -1, 1], [0.3, 0.8, 0.9]))


def _rows_with_stats(t: float) -> dict:
    return {"median_s": t, "p10_s": t * 0.95, "p90_s": t * 1.1, "min_s": t * 0.9, "mean_s": t, "reps": 5}


def _bus(name: str, size: float, world: int = 2) -> float:
    if name == "all_reduce":
        return 2 * (world - 1) / world * size
    if name in ("all_gather", "reduce_scatter"):
        return (world - 1) / world * size
    return size


def synthetic_microbench(folder: Path, world: int = 2, adam_slowdown: float | None = None,
                         warm_memory: bool = False) -> Path:
    """Harness-format files whose numbers follow known laws exactly (with ``adam_slowdown``, also
    fused-Adam rows that stream at COPY_BW / adam_slowdown). The memory-bound rows carry the
    harness's ``operand_copies`` column unless ``warm_memory`` (files from before 2026-12-06)."""
    micro = folder / "microbench"
    micro.mkdir(parents=True)
    gemm = []
    for rank in range(world):
        for m, n, k in [(64, 64, 64), (256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (2048, 2048, 1024)]:
            flops = 2.0 * m * n * k
            t = flops / (PEAK * _eff(flops / 1e9)) + LAUNCH
            for layout in ("nn", "nt", "tn"):
                gemm.append({"kind": "mm", "layout": layout, "precision": "fp32", "batch": 1, "m": m, "n": n, "k": k,
                             "gflop": flops / 1e9, **_rows_with_stats(t), "tflops": flops / t / 1e12, "rank": rank})
    memory = []
    for rank in range(world):
        kernels = (("copy", 1.0), ("gelu", 4.0)) + ((("adam", adam_slowdown),) if adam_slowdown else ())
        for kernel, slow in kernels:
            for n in (2**16, 2**20):
                nbytes = 8 * n
                t = LAUNCH + nbytes * slow / COPY_BW
                memory.append({"kernel": kernel, "precision": "fp32", "elements": n, "bytes": nbytes,
                               **({} if warm_memory else {"operand_copies": 8}),
                               **_rows_with_stats(t), "gb_per_s": nbytes / t / 1e9, "rank": rank})
        memory.append({"kernel": "tiny_add", "precision": "fp32", "elements": 1, "bytes": 12,
                       **({} if warm_memory else {"operand_copies": 1}),
                       **_rows_with_stats(LAUNCH), "gb_per_s": 0.0, "rank": rank})
        for name, t in (("tiny_linear_fwd_bwd", EAGER_SUM + 3 * EAGER_KERNEL), ("tiny_sum_bwd", EAGER_SUM)):
            memory.append({"kernel": name, "precision": "fp32", "elements": 1, "bytes": 0,
                           **({} if warm_memory else {"operand_copies": 1}),
                           **_rows_with_stats(t), "gb_per_s": 0.0, "rank": rank})
    coll = []
    for name, (alpha, beta) in LAWS.items():
        for size in SIZES:
            bb = _bus(name, size, world)
            coll.append({"collective": name, "world_size": world, "size_bytes": size, "bus_bytes": bb,
                         **_rows_with_stats(alpha + bb / beta)})
    for name, rows in (("gemm", gemm), ("memory", memory), ("collectives", coll)):
        with (micro / f"{name}.csv").open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    (micro / "microbench.json").write_text(json.dumps({
        "kind": "clustersim-harness-microbench", "started": "2026-01-01T00:00:00+00:00",
        "machine": {"hostname": "testhost", "cpu_model": "Test CPU", "cpu_cores": 2, "memory_bytes": 8 * 2**30,
                    "versions": {"torch": "x", "python": "3.11"}},
        "settings": {"world_size": world, "backend": "gloo", "device_type": "cpu", "threads_per_rank": 1}}))
    return folder


def test_alpha_beta_fit_recovers_exact_laws():
    for alpha, beta in LAWS.values():
        x = np.array(SIZES, dtype=float)
        fit = fit_alpha_beta(x, alpha + x / beta)
        assert fit.alpha_s == pytest.approx(alpha, rel=1e-9)
        assert fit.beta_bytes_per_s == pytest.approx(beta, rel=1e-9)
        assert fit.max_relative_residual < 1e-9
        plain = fit_alpha_beta(x, alpha + x / beta, relative=False)
        assert plain.alpha_s == pytest.approx(alpha, rel=1e-6) and plain.beta_bytes_per_s == pytest.approx(beta, rel=1e-9)


def test_alpha_beta_fit_keeps_latency_non_negative_and_rejects_bad_input():
    x = np.array([1e3, 1e6, 1e7])
    t = x / 1e9 - 5e-7  # a line through a negative latency: no alpha-beta model
    w = 1 / t  # relative weights
    (free_alpha, _), *_ = np.linalg.lstsq(np.column_stack([np.ones_like(x), x]) * w[:, None], t * w, rcond=None)
    assert free_alpha < 0  # the free fit goes negative ...
    fit = fit_alpha_beta(x, t)
    assert fit.alpha_s == 0.0  # ... so the line is refitted through the origin: weighted least squares slope
    assert 1 / fit.beta_bytes_per_s == pytest.approx(np.sum(x / t) / np.sum(x * x / (t * t)), rel=1e-12)
    with pytest.raises(ConfigError):
        fit_alpha_beta([], [])
    with pytest.raises(ConfigError):
        fit_alpha_beta([1, 2], [0.0, 1.0])


def test_profile_is_fitted_from_the_files_and_loads_as_specs(tmp_path):
    folder = synthetic_microbench(tmp_path / "m")
    profile = build_profile(read_microbench(folder), source_label="microbench")
    validate_profile(profile)
    acc = profile["node"]["accelerator"]
    # peak = the best measured GEMM rate (the largest shape, launch term included)
    big = 2.0 * 2048 * 2048 * 1024
    best = big / (big / (PEAK * _eff(big / 1e9)) + LAUNCH)
    assert acc["peak_tflops"]["fp32"] == pytest.approx(best / 1e12, rel=1e-4)
    eff = acc["efficiency"]
    # a CPU step pays the eager per-kernel overhead; the fits subtract only the bare add (LAUNCH)
    assert eff["kernel_launch_overhead_us"] == pytest.approx(EAGER_KERNEL * 1e6)
    assert "tiny_linear_fwd_bwd" in eff["fitted_on"]
    # the curve, net of the launch term, relative to that peak
    curve = {round(p["gflop"], 6): p["efficiency"] for p in eff["gemm_curve"]}
    for g in (2 * 64**3 / 1e9, 2 * 256**3 / 1e9, 2 * 1024**3 / 1e9):
        assert curve[round(g, 6)] == pytest.approx(PEAK * _eff(g) / best, rel=1e-3)
    assert acc["hbm_bandwidth_gb_per_s"] == pytest.approx(COPY_BW / 1e9, rel=0.01)
    # harmonic mean of copy (1x) and gelu (4x slower) over the copy peak: 2 / (1 + 4) = 0.4
    assert eff["memory_bound_efficiency"] == pytest.approx(0.4, rel=1e-3)
    assert "gemm.csv" in eff["fitted_on"] and "memory.csv" in eff["fitted_on"]
    assert "optimizer_efficiency" not in eff  # no adam rows: the planner uses memory_bound_efficiency
    node = profile["node"]
    assert node["gpus_per_node"] == 2 and node["intra_node"]["kind"] == "shm"
    for name, (alpha, beta) in LAWS.items():
        law = node["intra_node"]["collectives"][name]
        assert law["latency_us"] == pytest.approx(alpha * 1e6, rel=1e-4)
        assert law["bus_bandwidth_gb_per_s"] == pytest.approx(beta / 1e9, rel=1e-4)
        assert f"collective={name}" in law["fitted_on"] and "collectives.csv" in law["fitted_on"]
    path = write_profile(profile, tmp_path / "profile.yaml")
    node_spec, fabric_spec = load_profile_specs(path)
    assert node_spec.intra_node.collectives["send_recv"].latency_us == pytest.approx(40.0, rel=1e-4)
    assert fabric_spec.topology == "fat-tree"
    # no overlap.csv in these files: the slowdown is 0 and says it was not measured
    assert eff["overlap_compute_slowdown"] == 0.0
    assert eff["overlap_compute_slowdown_source"].startswith("not measured")


def test_collectives_are_fitted_on_the_after_compute_rows_when_present(tmp_path):
    folder = synthetic_microbench(tmp_path / "m")
    path = folder / "microbench" / "collectives.csv"
    with path.open() as fh:
        rows = list(csv.DictReader(fh))
    extra = []
    for r in rows:  # the same collectives issued after a kernel: 3x the latency, half the bandwidth
        alpha, beta = LAWS[r["collective"]]
        t = 3 * alpha + float(r["bus_bytes"]) / (beta / 2)
        extra.append({**r, "median_s": t, "p10_s": t, "p90_s": t, "min_s": t, "mean_s": t, "context": "after_compute"})
    for r in rows:
        r["context"] = "back_to_back"
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(extra[0]))
        w.writeheader()
        w.writerows(rows + extra)
    laws = build_profile(read_microbench(folder), source_label="m")["node"]["intra_node"]["collectives"]
    for name, (alpha, beta) in LAWS.items():
        assert laws[name]["latency_us"] == pytest.approx(3 * alpha * 1e6, rel=1e-4)
        assert laws[name]["bus_bandwidth_gb_per_s"] == pytest.approx(beta / 2 / 1e9, rel=1e-4)
        assert "context=after_compute" in laws[name]["fitted_on"]


def test_gpu_profiles_keep_the_bare_launch_cost():
    from simulator.cost.calibration import eager_kernel_overhead_s

    rows = [{"kernel": "tiny_linear_fwd_bwd", "median_s": 50e-6}, {"kernel": "tiny_sum_bwd", "median_s": 20e-6}]
    assert eager_kernel_overhead_s(rows, {"device_type": "cuda"}, 4e-6) == (4e-6, "kernel=tiny_add")
    assert eager_kernel_overhead_s(rows, {"device_type": "cpu"}, 1e-6)[0] == pytest.approx(10e-6)
    assert eager_kernel_overhead_s([], {"device_type": "cpu"}, 1e-6) == (1e-6, "kernel=tiny_add")  # older files


def test_collectives_that_a_line_misses_keep_their_measured_points(tmp_path):
    from simulator.cost.calibration import TABLE_RESIDUAL, fit_collectives

    # gloo-like: flat ~2 ms up to 256 KiB (one dip: noise), then growing; the line misses by > 25%
    sizes = [4096, 16384, 65536, 262144, 1048576, 4194304]
    times = [2.0e-3, 2.2e-3, 0.9e-3, 2.4e-3, 3.5e-3, 6.0e-3]
    rows = [{"collective": "all_reduce", "world_size": 2, "size_bytes": b, "bus_bytes": b, "context": "after_compute",
             **_rows_with_stats(t)} for b, t in zip(sizes, times, strict=True)]
    law = fit_collectives({"collectives": rows}, "m")["all_reduce"]
    assert law["measured_world_size"] == 2 and "isotonic" in law["source"]
    points = law["measured_points"]
    assert [p[0] for p in points] == sizes
    got = [p[1] for p in points]
    assert got == sorted(got)                                  # non-decreasing
    assert got[:3] == pytest.approx([1700.0] * 3, rel=1e-6)    # the dip pooled with its neighbours
    assert got[3:] == pytest.approx([2400.0, 3500.0, 6000.0])  # the rest as measured
    # exact laws (the synthetic files) stay a line
    exact = build_profile(read_microbench(synthetic_microbench(tmp_path / "m")))["node"]["intra_node"]["collectives"]
    assert all("measured_points" not in law for law in exact.values())
    assert TABLE_RESIDUAL == 0.25


def test_sync_jitter_is_the_relative_wait_over_the_expected_maximum(tmp_path):
    import math

    folder = synthetic_microbench(tmp_path / "m")
    eff = build_profile(read_microbench(folder), source_label="m")["node"]["accelerator"]["efficiency"]
    assert eff["sync_jitter"] == 0.0 and "not measured" in eff["sync_jitter_source"]  # no skew.csv
    rows = [{"world_size": 2, "segment_target_s": t, "gemms": 1, "segment_mean_s": t, "wait_mean_s": w * t,
             "relative_wait": w, "reps": 10} for t, w in ((0.004, 0.07), (0.02, 0.05), (0.08, 0.06))]
    with (folder / "microbench" / "skew.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    eff = build_profile(read_microbench(folder), source_label="m")["node"]["accelerator"]["efficiency"]
    assert eff["sync_jitter"] == pytest.approx(0.06 * math.sqrt(math.pi), abs=1e-4)  # median wait / e_2
    assert "skew.csv" in eff["sync_jitter_source"] and "3 segment lengths" in eff["sync_jitter_source"]
    # an overloaded host (the slowest of two ranks ~0.9 of a segment behind) gives a valid, capped profile
    for r in rows:
        r["relative_wait"] = 0.9
    with (folder / "microbench" / "skew.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    profile = build_profile(read_microbench(folder), source_label="m")
    eff = profile["node"]["accelerator"]["efficiency"]
    assert eff["sync_jitter"] == 1.0 and "capped at 1 from 1.5952" in eff["sync_jitter_source"]
    Node.model_validate(profile["node"])  # the bound the spec enforces (it failed calibrate with exit 2)


def test_overlap_slowdown_is_the_median_over_ranks(tmp_path):
    folder = synthetic_microbench(tmp_path / "m")
    rows = [{"rank": r, "collective": "all_reduce", "size_bytes": 2**24, "collectives_in_flight": 10, "m": 512,
             "n": 1024, "k": 1024, "valid_samples": v, "samples": 5, "gemm_alone_s": 0.01,
             "gemm_overlapped_s": 0.01 * (1 + x), "compute_slowdown": x}
            for r, (x, v) in enumerate([(0.2, 5), (0.4, 4), (0.3, 5), (9.0, 0)])]  # the last one: no valid sample
    with (folder / "microbench" / "overlap.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    eff = build_profile(read_microbench(folder), source_label="m")["node"]["accelerator"]["efficiency"]
    assert eff["overlap_compute_slowdown"] == pytest.approx(0.3)
    assert "overlap.csv" in eff["overlap_compute_slowdown_source"]
    assert "3 ranks" in eff["overlap_compute_slowdown_source"]
    assert eff["overlap_comm_slowdown"] == 0.0 and "not measured" in eff["overlap_comm_slowdown_source"]


def test_overlap_comm_slowdown_from_how_much_later_the_collectives_end(tmp_path):
    # GEMMs beside the all-reduces for T = 3 x 10 ms. A collective at 1/(1+c) pace during T ends
    # T·c/(1+c) later: c = 1 -> +15 ms, c = 0.5 -> +10 ms, c = 3 -> +22.5 ms; a faster run counts as 0.
    folder = synthetic_microbench(tmp_path / "m")
    rows = [{"rank": r, "collective": "all_reduce", "valid_samples": 5, "samples": 5, "gemms_per_sample": 3,
             "gemm_alone_s": 0.008, "gemm_overlapped_s": 0.01, "compute_slowdown": 0.25,
             "collectives_alone_s": 0.1, "collectives_with_gemms_s": 0.1 + extra}
            for r, extra in enumerate([0.015, 0.010, 0.0225, -0.002])]
    with (folder / "microbench" / "overlap.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    eff = build_profile(read_microbench(folder), source_label="m")["node"]["accelerator"]["efficiency"]
    assert eff["overlap_comm_slowdown"] == pytest.approx(np.median([1.0, 0.5, 3.0, 0.0]), abs=1e-4)
    assert "4 ranks" in eff["overlap_comm_slowdown_source"]
    # a collective that did not move at all while the GEMMs ran is capped as a stall
    from simulator.cost.calibration import MAX_COMM_SLOWDOWN, fit_overlap_comm_slowdown

    stalled = dict(rows[0], collectives_with_gemms_s=0.1 + 0.03)
    assert fit_overlap_comm_slowdown([stalled], "m")[0] == MAX_COMM_SLOWDOWN


def test_a_scenario_loads_the_profile(tmp_path):
    from simulator.scenario import load_scenario

    path = write_profile(build_profile(read_microbench(synthetic_microbench(tmp_path / "m"))), tmp_path / "p.yaml")
    sc = load_scenario({"model": {"name": "t", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                                  "vocab_size": 256, "seq_length": 32},
                        "cluster": {"profile": str(path), "num_gpus": 2},
                        "parallelism": {"dp": 2, "micro_batch_size": 2, "global_batch_size": 4},
                        "training": {"precision": "fp32"}})
    assert sc.node.gpus_per_node == 2 and sc.accelerator.peak_tflops["fp32"] > 0


RUN_MODEL = {"name": "tiny", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 256,
             "seq_length": 32, "tied_embeddings": True}


def _runs_doc(folder: Path) -> Path:
    from validation.harness.layouts import STRATEGIES, layout_of

    cfg = SimpleNamespace(global_batch=8, micro_batch=4, pp_micro_batches=4)
    runs = [{"strategy": s, "layout": layout_of(s, cfg, 2), "model": RUN_MODEL, "precision": "fp32",
             "optimizer": "adam", "step_time_s": 0.01 * (i + 1), "step_time_p10_s": 0.009 * (i + 1),
             "step_time_p90_s": 0.011 * (i + 1)} for i, s in enumerate(STRATEGIES)]
    path = folder / "training" / "runs.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"kind": "clustersim-harness-training", "machine": {"hostname": "h"}, "runs": runs}))
    return folder


def test_each_strategy_maps_to_its_scenario(tmp_path):
    doc = read_runs(_runs_doc(tmp_path / "r"))
    by = {r["strategy"]: scenario_for_run(r, "p.yaml") for r in doc["runs"]}
    assert by["single"]["cluster"]["num_gpus"] == 1
    assert by["ddp"]["parallelism"]["dp"] == 2 and by["ddp"]["parallelism"]["zero_stage"] == 0
    assert by["fsdp"]["parallelism"]["zero_stage"] == 3
    assert by["pp_gpipe"]["parallelism"]["pp"] == 2 and by["pp_gpipe"]["parallelism"]["schedule"] == "gpipe"
    assert by["pp_1f1b"]["parallelism"]["schedule"] == "1f1b"
    assert by["pp_1f1b"]["parallelism"]["micro_batch_size"] * 4 == by["pp_1f1b"]["parallelism"]["global_batch_size"]
    assert by["tp"]["parallelism"]["tp"] == 2
    assert by["local_learning"]["parallelism"]["pp"] == 2
    assert by["local_learning"]["strategy"] == {"kind": "local_learning", "sync_steps": True}
    assert all("strategy" not in s for name, s in by.items() if name != "local_learning")
    assert all(s["training"]["precision"] == "fp32" for s in by.values())


def test_calibrate_and_validate_runs_cli_on_recorded_files(tmp_path, capsys):
    folder = synthetic_microbench(tmp_path / "m")
    out = tmp_path / "profile.yaml"
    assert main(["calibrate", "--from", str(folder), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "all_reduce" in captured.out and "WARNING" not in captured.err  # a steady sweep: nothing flagged
    assert yaml.safe_load(out.read_text())["node"]["intra_node"]["kind"] == "shm"
    runs = _runs_doc(tmp_path / "r")
    png = tmp_path / "vr.png"
    assert main(["validate-runs", "--profile", str(out), "--runs", str(runs), "--json", "--plot", str(png)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["strategy"] for r in rows] == ["single", "ddp", "fsdp", "pp_gpipe", "pp_1f1b", "tp", "local_learning"]
    for r in rows:
        assert r["predicted_step_time_s"] > 0
        assert r["relative_error"] == pytest.approx((r["predicted_step_time_s"] - r["measured_step_time_s"])
                                                    / r["measured_step_time_s"])
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert main(["validate-runs", "--profile", str(out), "--runs", str(runs)]) == 0
    table = capsys.readouterr().out
    assert "median |error|" in table and "pp_gpipe" in table
    # an impossible tolerance fails with exit code 1; a bad one is a one-line error
    assert main(["validate-runs", "--profile", str(out), "--runs", str(runs), "--tolerance", "1e-9"]) == 1
    capsys.readouterr()
    assert main(["validate-runs", "--profile", str(out), "--runs", str(runs), "--tolerance", "abc"]) == 2
    assert "--tolerance" in capsys.readouterr().err


def test_predict_runs_rows(tmp_path):
    path = write_profile(build_profile(read_microbench(synthetic_microbench(tmp_path / "m"))), tmp_path / "p.yaml")
    rows = predict_runs(read_runs(_runs_doc(tmp_path / "r")), path, ["tp"])
    assert len(rows) == 1 and rows[0]["predicted_breakdown_s"]["tp_comm"] >= 0


def test_missing_inputs_are_config_errors(tmp_path, capsys):
    with pytest.raises(ConfigError, match="no gemm.csv"):
        read_microbench(tmp_path)
    with pytest.raises(ConfigError, match="runs.json"):
        read_runs(tmp_path)
    assert main(["calibrate", "--from", str(tmp_path / "nope")]) == 2
    assert main(["validate-runs", "--profile", str(tmp_path / "nope.yaml"), "--runs", str(tmp_path)]) == 2
    assert "file not found" in capsys.readouterr().err


def _drop_column(path: Path, column: str) -> None:
    rows = list(csv.DictReader(path.open()))
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, [c for c in rows[0] if c != column])
        writer.writeheader()
        writer.writerows({k: v for k, v in r.items() if k != column} for r in rows)


@pytest.mark.parametrize(("file", "column"), [("memory", "median_s"), ("gemm", "m"), ("collectives", "bus_bytes")])
def test_a_microbench_file_without_a_column_a_fit_needs_is_one_line_exit_2(tmp_path, file, column):
    """A harness file missing a column the fit reads: one line naming the file and the column, exit 2, no profile
    written (was a KeyError traceback, exit 1; newcomer4, thirteenth session)."""
    import subprocess
    import sys

    folder = synthetic_microbench(tmp_path / "m")
    _drop_column(folder / "microbench" / f"{file}.csv", column)
    out = tmp_path / "profile.yaml"
    run = subprocess.run([sys.executable, "-m", "simulator", "calibrate", "--from", str(folder), "--out", str(out)],
                         capture_output=True, text=True)
    assert run.returncode == 2 and "Traceback" not in run.stderr and not out.exists()
    assert f"{file}.csv: missing column '{column}'" in run.stderr and len(run.stderr.strip().splitlines()) == 1


def test_a_gemm_file_without_kind_is_refused_only_where_rows_are_batched(tmp_path):
    """Without ``kind``, rows of batch 1 are GEMMs (files of older harness versions); a batched row could be a bmm or
    attention row, which was fitted as a GEMM: refused, naming the column."""
    folder = synthetic_microbench(tmp_path / "m")
    gemm = folder / "microbench" / "gemm.csv"
    _drop_column(gemm, "kind")
    read_microbench(folder)  # every synthetic row has batch 1
    rows = list(csv.DictReader(gemm.open()))
    rows[0]["batch"] = "16"
    with gemm.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    with pytest.raises(ConfigError, match="missing column 'kind'"):
        read_microbench(folder)


def test_speed_probe_travels_from_the_files_to_the_profile_and_the_run_rows(tmp_path, capsys):
    """The profile records the probe; validate-runs reports each run's probe over the
    calibration's; the raw prediction is the same with or without it, and the prediction at
    the probe's speed is the raw one times that ratio (CPU runs only)."""
    folder = synthetic_microbench(tmp_path / "m")
    meta_path = folder / "microbench" / "microbench.json"
    meta = json.loads(meta_path.read_text())
    plain_profile = write_profile(build_profile(read_microbench(folder)), tmp_path / "plain.yaml")
    plain = predict_runs(read_runs(_runs_doc(tmp_path / "r0")), plain_profile)
    meta["speed_probe"] = {"median_s": 0.004, "p10_s": 0.0035, "p90_s": 0.005, "samples": 54, "shape_mnk": [512, 1024, 256]}
    meta_path.write_text(json.dumps(meta))
    profile = write_profile(build_profile(read_microbench(folder)), tmp_path / "p.yaml")
    assert yaml.safe_load(profile.read_text())["calibration"]["speed_probe"]["median_s"] == 0.004
    runs_folder = _runs_doc(tmp_path / "r")
    path = runs_folder / "training" / "runs.json"
    doc = json.loads(path.read_text())
    doc["runs"][0]["speed_probe"] = {"median_s": 0.005}   # single: the machine 25% slower
    doc["runs"][1]["speed_probe"] = {"median_s": 0.0041}  # ddp: within the note's 10%
    path.write_text(json.dumps(doc))
    rows = predict_runs(read_runs(runs_folder), profile)
    assert rows[0]["probe_slowdown"] == pytest.approx(1.25)
    assert rows[1]["probe_slowdown"] == pytest.approx(1.025)
    assert all(r["probe_slowdown"] is None for r in rows[2:])
    assert all(r["probe_slowdown"] is None for r in plain)
    for with_probe, without in zip(rows, plain, strict=True):  # the raw prediction ignores it
        assert with_probe["predicted_step_time_s"] == pytest.approx(without["predicted_step_time_s"])
    assert rows[0]["probe_adjusted_step_time_s"] == pytest.approx(1.25 * rows[0]["predicted_step_time_s"])
    measured = rows[0]["measured_step_time_s"]
    assert rows[0]["probe_adjusted_relative_error"] == pytest.approx(1.25 * rows[0]["predicted_step_time_s"] / measured - 1)
    assert all(r["probe_adjusted_step_time_s"] is None for r in rows[2:] + plain)
    assert error_summary(rows, "probe_adjusted_relative_error")["runs"] == 2
    assert main(["validate-runs", "--profile", str(profile), "--runs", str(runs_folder)]) == 0
    out = capsys.readouterr().out
    assert "note:" in out and "single x1.25" in out.split("note:")[1] and "ddp x" not in out.split("note:")[1]
    assert "at probe speed" in out
    # the tolerance judges the raw errors, or with --probe-adjusted the errors at the probe's speed
    adjusted = [abs(r["probe_adjusted_relative_error"]) for r in rows[:2]]
    raw = [abs(r["relative_error"]) for r in rows]
    between = f"{(max(adjusted) + max(raw)) / 2:.4f},{(max(adjusted) + max(raw)) / 2:.4f}"
    assert max(adjusted) != pytest.approx(max(raw), abs=1e-3)
    judged_raw = main(["validate-runs", "--profile", str(profile), "--runs", str(runs_folder), "--tolerance", between])
    judged_adj = main(["validate-runs", "--profile", str(profile), "--runs", str(runs_folder), "--tolerance", between,
                       "--probe-adjusted"])
    assert {judged_raw, judged_adj} == {0, 1}
    assert judged_adj == (0 if max(adjusted) < max(raw) else 1)
    assert main(["validate-runs", "--profile", str(plain_profile), "--runs", str(runs_folder), "--probe-adjusted"]) == 2


def test_the_runs_probe_median_says_how_the_machine_moved_and_names_the_runs_off_it():
    """probe_drift: the median of the runs' probe ratios, their range, and the runs whose own ratio lies >10% off
    that median (a sample right after that strategy's step reads its aftermath: step_in_backward read x1.44-2.37
    in loops whose other runs read x0.92-1.11)."""
    from simulator.commands.validate_runs import render_drift
    from simulator.cost.calibration import probe_drift

    rows = [{"strategy": s, "probe_slowdown": v} for s, v in
            [("single", 1.07), ("ddp", 1.07), ("fsdp", 0.98), ("pp_gpipe", 0.99), ("pp_1f1b", 0.97), ("tp", 0.89),
             ("step_in_backward", 1.95)]] + [{"strategy": "gpu_run", "probe_slowdown": None}]
    drift = probe_drift(rows)
    assert drift["runs"] == 7 and drift["median_probe_slowdown"] == pytest.approx(0.99)
    assert (drift["min_probe_slowdown"], drift["max_probe_slowdown"]) == (0.89, 1.95)
    assert [s for s, _ in drift["off_the_median"]] == ["tp", "step_in_backward"]
    text = "\n".join(render_drift(drift, 0.0018))
    assert "1.800 ms while calibrating" in text and "median x0.99" in text and "1% faster" in text
    assert "tp x0.89, step_in_backward x1.95" in text
    assert probe_drift([{"strategy": "single", "probe_slowdown": None}]) is None and render_drift(None, None) == []


def _host_trace(path: Path, events: list[tuple[str, float, float]], step_us: float) -> None:
    """A PyTorch-profiler-like Chrome trace of one step on one thread: (name, start us, duration us) cpu_ops."""
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0.0, "dur": step_us, "pid": 1, "tid": 1}]
    ev += [{"ph": "X", "cat": "cpu_op", "name": n, "ts": t, "dur": d, "pid": 1, "tid": 1} for n, t, d in events]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": ev}))


def test_traced_split_sets_the_one_device_runs_gemms_and_the_rest_beside_the_prediction(tmp_path, capsys):
    """validate-runs splits the traced step of each one-device run (no communication) into GEMMs and the rest, each
    beside the simulated step's kernels of those classes: a GEMM ratio away from 1 is drift of the host between the
    microbenchmarks and the runs (GEMMs are priced on rows of these shapes), the rest's shortfall the model's. Every
    rank's trace counts (each trains its own copy); runs on two devices and runs without traces are left out."""
    from simulator.cost.calibration import traced_split

    profile = write_profile(build_profile(read_microbench(synthetic_microbench(tmp_path / "m"))), tmp_path / "p.yaml")
    folder = _runs_doc(tmp_path / "r")
    path = folder / "training" / "runs.json"
    doc = json.loads(path.read_text())
    single = next(r for r in doc["runs"] if r["strategy"] == "single")
    single["traces"] = ["traces/single_rank0.json", "traces/single_rank1.json", "traces/missing.json"]
    single["system_cpu_s_per_step"], single["minor_faults_per_step"] = 0.006, 3800.0
    next(r for r in doc["runs"] if r["strategy"] == "ddp")["traces"] = ["traces/single_rank0.json"]  # two devices
    path.write_text(json.dumps(doc))
    # rank 0: a 1000 us GEMM, a 300 us GELU, a 10 us view in a 2000 us step (690 us between ops); rank 1: GEMM 1200
    _host_trace(folder / "training" / "traces" / "single_rank0.json",
                [("aten::mm", 0.0, 1000.0), ("aten::gelu", 1100.0, 300.0), ("aten::view", 1500.0, 10.0)], 2000.0)
    _host_trace(folder / "training" / "traces" / "single_rank1.json",
                [("aten::mm", 0.0, 1200.0), ("aten::gelu", 1300.0, 300.0), ("aten::view", 1700.0, 10.0)], 2200.0)
    runs = read_runs(folder)
    rows = predict_runs(runs, profile)
    split = traced_split(runs, profile, rows)
    assert [x["strategy"] for x in split] == ["single"] and split[0]["traces"] == 2
    x = split[0]
    assert x["gemm_traced_s"] == pytest.approx(1100e-6)  # the mean of the two ranks' GEMM self time
    assert x["rest_traced_s"] == pytest.approx(1000e-6)  # GELU 300 + view 10 + 690 between ops, on both ranks
    assert x["framework_python_traced_s"] == pytest.approx(700e-6)
    assert x["gemm_predicted_s"] > 0 and x["rest_predicted_s"] > 0
    step = rows[0]["predicted_step_time_s"]
    assert x["gemm_predicted_s"] + x["rest_predicted_s"] == pytest.approx(step, rel=0.05)  # the classes cover the step
    assert x["system_cpu_s_per_step"] == 0.006 and x["minor_faults_per_step"] == 3800.0
    assert main(["validate-runs", "--profile", str(profile), "--runs", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "traced steps of the runs on one device" in out and "GEMMs: traced at x" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("single ") and "ms x" in ln)
    assert f"x{1100e-6 / x['gemm_predicted_s']:.3f}" in line and line.rstrip().endswith("6.0 ms")
    assert main(["validate-runs", "--profile", str(profile), "--runs", str(folder), "--json"]) == 0
    by = {r["strategy"]: r for r in json.loads(capsys.readouterr().out)}
    assert by["single"]["traced_split"]["gemm_traced_s"] == pytest.approx(1100e-6)
    assert "traced_split" not in by["ddp"]


def _with_cold_dispatch(folder: Path, ratios: list[float], model: dict | None = None) -> Path:
    """Append ``gpt_fwd_bwd_cold`` rows (one per rank) with these ``over_warm_median`` to dispatch.csv."""
    from tests.test_eager_dispatch import TINY

    path = folder / "microbench" / "dispatch.csv"
    rows = list(csv.DictReader(path.open()))
    extra = ["warm_hooked_median_s", "over_warm_median", "evictions", "evict_bytes"]
    for rank, ratio in enumerate(ratios):
        rows.append({"kernel": "gpt_fwd_bwd_cold", "precision": "fp32", "micro_batch_size": 1, "tokens": 8,
                     "model": json.dumps(model or TINY, sort_keys=True), "median_s": 0.004, "p10_s": 0.003,
                     "p90_s": 0.005, "reps": 15, "rank": rank, "warm_hooked_median_s": 0.002,
                     "over_warm_median": ratio, "evictions": 79, "evict_bytes": 2097152})
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, list(rows[0]) + extra)
        writer.writeheader()
        writer.writerows(rows)
    return folder


def test_the_cold_dispatch_rows_scale_the_dispatch_fit(tmp_path):
    """dispatch.csv's gpt_fwd_bwd_cold rows (the dispatch row's step with the caches emptied between its ops, over
    the same step back to back, interleaved in one process) multiply the measured step the per-kernel overhead is
    fitted to: the median over ranks, floored at 1; rows of another model are not used; files without them fit as
    before."""
    from simulator.cost.calibration import _dispatch_run, _simulated_fwd_bwd_s, cold_dispatch_factor
    from tests.test_eager_dispatch import TINY, _with_dispatch

    def fitted(folder):
        profile = build_profile(read_microbench(folder))
        return profile, profile["node"]["accelerator"]["efficiency"]

    _, warm = fitted(_with_dispatch(synthetic_microbench(tmp_path / "w"), [2.0e-3, 3.0e-3]))
    profile, eff = fitted(_with_cold_dispatch(_with_dispatch(synthetic_microbench(tmp_path / "c"), [2.0e-3, 3.0e-3]),
                                              [2.2, 2.6]))
    # the step the overhead is fitted to: the warm median 2.5 ms x the ranks' median ratio 2.4 = 6 ms
    assert _simulated_fwd_bwd_s(profile, _dispatch_run(TINY, 1), eff["kernel_launch_overhead_us"]) == pytest.approx(
        6.0e-3, rel=1e-3)
    assert eff["kernel_launch_overhead_us"] > 2 * warm["kernel_launch_overhead_us"]
    assert "x2.400 (kernel=gpt_fwd_bwd_cold, 2 rank(s)" in eff["fitted_on"] and "= 6.000 ms" in eff["fitted_on"]
    # a ratio below 1 is the row's noise: emptying the caches cannot make the ops faster
    _, floored = fitted(_with_cold_dispatch(_with_dispatch(synthetic_microbench(tmp_path / "f"), [2.0e-3, 3.0e-3]),
                                            [0.9, 0.95]))
    assert floored["kernel_launch_overhead_us"] == pytest.approx(warm["kernel_launch_overhead_us"])
    assert "floored at 1" in floored["fitted_on"]
    # rows that timed another model say nothing of this one
    _, other = fitted(_with_cold_dispatch(_with_dispatch(synthetic_microbench(tmp_path / "o"), [2.0e-3, 3.0e-3]),
                                          [2.4, 2.4], model={**TINY, "hidden_size": 32}))
    assert other["kernel_launch_overhead_us"] == pytest.approx(warm["kernel_launch_overhead_us"])
    assert cold_dispatch_factor([{"kernel": "gpt_fwd_bwd", "over_warm_median": 3.0}]) is None


def test_the_optimizer_gets_the_fused_adam_rows_bandwidth(tmp_path):
    folder = synthetic_microbench(tmp_path / "m", adam_slowdown=2.0)
    eff = build_profile(read_microbench(folder), source_label="microbench")["node"]["accelerator"]["efficiency"]
    # adam streams at half the copy rate: 0.5 of it; the activation-kernel mean now counts it too
    assert eff["optimizer_efficiency"] == pytest.approx(0.5, rel=1e-3)
    assert eff["memory_bound_efficiency"] == pytest.approx(3 / (1 + 4 + 2), rel=1e-3)
    assert "kernel=adam" in eff["optimizer_efficiency_source"]


def test_optimizer_step_time_uses_the_optimizer_efficiency_when_given():
    from hardware_specs.schema import Accelerator
    from simulator.cost.compute import ComputeModel

    def accelerator(**extra):
        return Accelerator.model_validate(dict(
            name="toy", vendor="toy", peak_tflops={"fp32": 10.0}, hbm_gib=8, hbm_bandwidth_gb_per_s=100,
            tdp_watts=100, source="toy",
            efficiency=dict(gemm_curve=[{"gflop": 1, "efficiency": 0.5}], memory_bound_efficiency=0.2,
                            kernel_launch_overhead_us=10, source="toy", **extra)))

    params, per_param = 1e8, 32.0
    # 3.2 GB at 0.2 x 100 GB/s, plus one launch; at 0.5 x 100 GB/s with optimizer_efficiency 0.5
    assert ComputeModel(accelerator(), "fp32").optimizer_step_s(params, per_param) == pytest.approx(0.16 + 10e-6)
    tuned = ComputeModel(accelerator(optimizer_efficiency=0.5), "fp32")
    assert tuned.optimizer_step_s(params, per_param) == pytest.approx(0.064 + 10e-6)
    assert tuned.add_into_s(1e9) == pytest.approx(3e9 / 20e9 + 10e-6)  # other memory-bound kernels unchanged


def test_a_large_gemm_slower_than_a_smaller_one_is_flagged():
    """Efficiency rises with GEMM size until it saturates; a large shape below 70% of a smaller one's says the
    host slowed during the sweep (session 9: 1024^3 at 0.48 of peak after 512^3 at 0.98, both ranks)."""
    steady = [{"gflop": 0.0005, "efficiency": 0.6}, {"gflop": 0.27, "efficiency": 0.9},
              {"gflop": 2.1, "efficiency": 0.85}, {"gflop": 4.3, "efficiency": 0.99}]
    assert gemm_speed_dips(steady) == []  # a 6% dip is a shape's own wave quantisation, not flagged
    slowed = [{"gflop": 0.0005, "efficiency": 0.6}, {"gflop": 0.27, "efficiency": 0.977},
              {"gflop": 1.07, "efficiency": 0.482}, {"gflop": 4.3, "efficiency": 0.7}]
    dips = gemm_speed_dips(slowed)
    assert len(dips) == 1 and dips[0].startswith("1.07 GFLOP at efficiency 0.482") and "0.977" in dips[0]
    assert len(gemm_speed_dips(list(reversed(slowed)))) == 1  # read in size order whatever the list's order


def test_calibrate_warns_on_stderr_when_the_sweep_slowed(tmp_path, capsys):
    folder = synthetic_microbench(tmp_path / "m")
    gemm = folder / "microbench" / "gemm.csv" if (folder / "microbench").is_dir() else folder / "gemm.csv"
    rows = list(csv.DictReader(gemm.open()))
    largest = max((r for r in rows if r.get("kind", "mm") == "mm"),
                  key=lambda r: int(r["m"]) * int(r["n"]) * int(r["k"]))
    shape = (largest["m"], largest["n"], largest["k"])
    for r in rows:  # the largest shape measured at a third of its speed on every rank
        if (r["m"], r["n"], r["k"]) == shape and r.get("kind", "mm") == "mm":
            r["median_s"] = str(3 * float(r["median_s"]))
    with gemm.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    assert main(["calibrate", "--from", str(folder), "--out", str(tmp_path / "p.yaml"), "--json"]) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)  # --json stays one document
    assert captured.err.startswith("WARNING: 1 GEMM size(s) ran markedly slower than a smaller GEMM")


def test_calibrate_says_when_memory_rows_were_timed_on_one_warm_set(tmp_path, capsys):
    """Memory-bound rows timed back to back on one operand set (harness files from before
    2026-12-06) over-rate those kernels on a CPU whose L2 holds the set: the fit says which
    kind of rows it used, and calibrate warns on stderr for warm ones only."""
    cold = synthetic_microbench(tmp_path / "cold")
    warm = synthetic_microbench(tmp_path / "warm", warm_memory=True)
    assert main(["calibrate", "--from", str(cold), "--out", str(tmp_path / "c.yaml"), "--json"]) == 0
    out = capsys.readouterr()
    assert "memory-bound row" not in out.err
    assert "timed on rotating operand copies" in json.loads(out.out)["node"]["accelerator"]["efficiency"]["fitted_on"]
    assert main(["calibrate", "--from", str(warm), "--out", str(tmp_path / "w.yaml"), "--json"]) == 0
    out = capsys.readouterr()
    assert out.err.startswith("WARNING: 8 memory-bound row(s) were timed back to back on one warm operand set")
    assert "one warm operand set" in json.loads(out.out)["node"]["accelerator"]["efficiency"]["fitted_on"]
    # the same rows with cold_memory_operands turned off in the run's settings count as warm
    from simulator.cost.calibration import warm_memory_rows

    rows = read_microbench(cold)["memory"]
    assert warm_memory_rows(rows, {"cold_memory_operands": True}) == 0
    assert warm_memory_rows(rows, {"cold_memory_operands": False}) == 8
