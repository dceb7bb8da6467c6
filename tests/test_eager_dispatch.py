"""The harness's eager-PyTorch mechanisms, priced only where the run says eager (``unfused_eager_kernels``, the
harness) or the profile was fitted on a CPU with the dispatch row: the per-kernel dispatch fitted from the harness
GPT's step at a tiny shape (``dispatch.csv``, simulator/cost/calibration.py ``fit_eager_dispatch``) and the
hand-written vocab-parallel cross-entropy's eager kernels (workloads/graph.py ``EAGER_VOCAB_CE_PASSES``)."""

from __future__ import annotations

import csv
import json

import pytest

from simulator.cost.calibration import _dispatch_run, _simulated_fwd_bwd_s, build_profile, read_microbench
from tests.test_calibration import EAGER_KERNEL, LAUNCH, synthetic_microbench
from workloads.graph import EAGER_VOCAB_CE_PASSES, ShardShape, head_work
from workloads.schema import TransformerSpec

HARNESS = {"name": "harness-gpt-4l-256h", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
           "vocab_size": 4096, "seq_length": 128, "tied_embeddings": True, "position_embedding": "learned",
           "norm": "layernorm", "linear_bias": True}
TINY = {**HARNESS, "name": "harness-gpt-dispatch", "hidden_size": 16, "vocab_size": 64, "seq_length": 8}


def _with_dispatch(folder, times_s, model=TINY, device_type="cpu"):
    micro = folder / "microbench"
    with (micro / "dispatch.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["kernel", "precision", "micro_batch_size", "tokens", "model", "median_s",
                                           "p10_s", "p90_s", "reps", "rank"])
        w.writeheader()
        for rank, t in enumerate(times_s):
            w.writerow({"kernel": "gpt_fwd_bwd", "precision": "fp32", "micro_batch_size": 1, "tokens": 8,
                        "model": json.dumps(model), "median_s": t, "p10_s": t, "p90_s": t, "reps": 5, "rank": rank})
    if device_type != "cpu":
        meta = json.loads((micro / "microbench.json").read_text())
        meta["settings"]["device_type"] = device_type
        (micro / "microbench.json").write_text(json.dumps(meta))
    return folder


def test_the_fitted_overhead_makes_the_simulated_tiny_step_the_measured_one(tmp_path):
    folder = _with_dispatch(synthetic_microbench(tmp_path / "m"), [2.0e-3, 3.0e-3])  # median 2.5 ms
    profile = build_profile(read_microbench(folder), source_label="microbench")
    eff = profile["node"]["accelerator"]["efficiency"]
    fitted_us = eff["kernel_launch_overhead_us"]
    assert fitted_us > EAGER_KERNEL * 1e6  # more than the one-element linear's bare op
    assert "dispatch.csv" in eff["fitted_on"] and "harness-gpt-dispatch" in eff["fitted_on"]
    # the simulator's forward + backward of the row's model at the fitted value is the measured median
    assert _simulated_fwd_bwd_s(profile, _dispatch_run(TINY, 1), fitted_us) == pytest.approx(2.5e-3, rel=1e-3)
    # and it scales with the measured time: the step is linear in the overhead, the slope the kernel count
    other = build_profile(read_microbench(_with_dispatch(synthetic_microbench(tmp_path / "n"), [5.0e-3])))
    base = _simulated_fwd_bwd_s(profile, _dispatch_run(TINY, 1), 0.0)
    kernels = (2.5e-3 - base) / (fitted_us * 1e-6)
    assert 100 < kernels < 200  # the tiny GPT's ~140 simulated kernels
    assert other["node"]["accelerator"]["efficiency"]["kernel_launch_overhead_us"] == pytest.approx(
        (5.0e-3 - base) / kernels * 1e6, rel=1e-3)


def test_without_the_row_or_on_a_gpu_the_one_element_linear_gives_it(tmp_path):
    plain = build_profile(read_microbench(synthetic_microbench(tmp_path / "a")))
    assert plain["node"]["accelerator"]["efficiency"]["kernel_launch_overhead_us"] == pytest.approx(EAGER_KERNEL * 1e6)
    gpu = build_profile(read_microbench(_with_dispatch(synthetic_microbench(tmp_path / "b"), [3e-3],
                                                       device_type="cuda")))
    eff = gpu["node"]["accelerator"]["efficiency"]
    assert "dispatch.csv" not in eff["fitted_on"]
    assert eff["kernel_launch_overhead_us"] == pytest.approx(LAUNCH * 1e6)  # a GPU keeps the bare launch


def test_a_step_faster_than_its_work_floors_at_the_bare_add(tmp_path):
    profile = build_profile(read_microbench(_with_dispatch(synthetic_microbench(tmp_path / "m"), [1e-9])))
    assert profile["node"]["accelerator"]["efficiency"]["kernel_launch_overhead_us"] == pytest.approx(LAUNCH * 1e6)


def test_a_dispatch_row_without_a_json_model_is_a_config_error(tmp_path):
    from simulator.errors import ConfigError

    folder = _with_dispatch(synthetic_microbench(tmp_path / "m"), [3e-3])
    path = folder / "microbench" / "dispatch.csv"
    path.write_text(path.read_text().replace(json.dumps(TINY).replace('"', '""'), "not-json"))
    with pytest.raises(ConfigError, match="dispatch.csv"):
        build_profile(read_microbench(folder))


def _ce(tp: int, eager: bool):
    work = head_work(TransformerSpec.model_validate(HARNESS),
                     ShardShape(micro_batch=4, seq_length=128, tp=tp, precision="fp32", unfused_eager_kernels=eager,
                                vocab_padding_tp=0))
    name = "vocab_parallel_cross_entropy" if tp > 1 and eager else "cross_entropy"
    fwd = next(op for op in work.forward if op.name == name)
    bwd = next(op for op in work.backward if op.name == f"{name}.grad")
    return fwd, bwd


def test_the_eager_vocab_parallel_cross_entropy_counts_the_harness_ops():
    elements = 4 * 128 * 4096 // 2  # b·s·V/t fp32 logits on a rank
    fwd, bwd = _ce(2, True)
    c = EAGER_VOCAB_CE_PASSES
    assert fwd.bytes_moved == (c["forward_reads"] + c["forward_writes"]) * elements * 4 == 8 * elements * 4
    assert (fwd.kernels, bwd.kernels) == (5, 2)
    assert bwd.bytes_moved == 4 * elements * 4
    # a fused loss (Megatron-LM) and the single-rank F.cross_entropy keep 3 passes forward, 6 backward, one kernel each
    for tp, eager in ((2, False), (1, True), (1, False)):
        f, b = _ce(tp, eager)
        assert (f.bytes_moved, b.bytes_moved) == (3 * 4 * 4 * 128 * 4096 // tp, 6 * 4 * 4 * 128 * 4096 // tp)
        assert (f.kernels, b.kernels) == (1, 1)


def test_the_wait_at_all_reduces_is_added_to_each_group_collective_where_measured(tmp_path):
    """Rows of the collective-cadence benchmark (validation/harness/skew.py): the median wait for the last rank
    is every group collective's ``arrival_wait_us``, kept apart from the law's line and measured points (a
    collective right after another of its group does not pay it), not send_recv's; sync_jitter stays the barrier
    rows'; a GPU profile (NCCL: host clocks say nothing of device arrival) takes none."""
    import math

    folder = synthetic_microbench(tmp_path / "m")
    barrier = [{"world_size": 2, "segment_target_s": t, "gemms": 1, "segment_mean_s": t, "wait_mean_s": 0.01 * t,
                "relative_wait": 0.01, "reps": 10} for t in (0.004, 0.02, 0.08)]
    cadence = [{"method": "collective_cadence", "world_size": 2, "segment_target_s": t, "gemms": 4,
                "segment_mean_s": t, "wait_mean_s": w, "wait_median_s": 0.0, "relative_wait": w / t, "reps": 37,
                "collective": "all_reduce", "size_bytes": 524288}
               for t, w in ((0.004, 1.1e-3), (0.008, 1.2e-3), (0.016, 0.7e-3), (0.032, 1.3e-3))]
    fields = list(cadence[0])

    def write(rows, device_type="cpu"):
        with (folder / "microbench" / "skew.csv").open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=fields)
            writer.writeheader()
            writer.writerows(rows)
        meta = json.loads((folder / "microbench" / "microbench.json").read_text())
        meta["settings"]["device_type"] = device_type
        (folder / "microbench" / "microbench.json").write_text(json.dumps(meta))
        return build_profile(read_microbench(folder))["node"]

    before = write(barrier)  # files from before: no wait added
    after = write(barrier + cadence)
    wait_us = 1150.0  # the median of 1.1, 1.2, 0.7, 1.3 ms
    for node in (before, after):
        assert node["accelerator"]["efficiency"]["sync_jitter"] == pytest.approx(0.01 * math.sqrt(math.pi), abs=1e-4)
    laws0, laws1 = before["intra_node"]["collectives"], after["intra_node"]["collectives"]
    for name in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
        assert laws1[name]["arrival_wait_us"] == pytest.approx(wait_us, abs=1e-3)
        assert "arrival_wait_us" not in laws0[name]
        assert laws1[name]["latency_us"] == laws0[name]["latency_us"]
        assert laws1[name].get("measured_points") == laws0[name].get("measured_points")
        assert "method=collective_cadence" in laws1[name]["source"]
    assert laws1["send_recv"] == laws0["send_recv"]  # the pipeline's own dependency, already played
    gpu = write(barrier + cadence, device_type="cuda")["intra_node"]["collectives"]
    assert "arrival_wait_us" not in gpu["all_reduce"]
    assert gpu["all_reduce"]["latency_us"] == pytest.approx(laws0["all_reduce"]["latency_us"])


LOSS_RATE = 10e9  # bytes/s: F.cross_entropy forward + backward on the simulator's 3 + 6 passes (synthetic)
LOG_SOFTMAX_RATE = 20e9  # bytes/s: memory.csv's log_softmax rows (synthetic)


def _with_loss(folder, slow: float = 1.0, gauge: bool = True, device_type: str = "cpu"):
    """loss.csv rows (validation/harness/loss.py) at the harness's shapes, the loss at LOSS_RATE and memory.csv's
    log_softmax at LOG_SOFTMAX_RATE; ``slow``: the host ran the loss rows (and their gauge) that much slower."""
    micro = folder / "microbench"
    rows = []
    for b in (1, 2, 4, 8):
        e = b * 128 * 4096
        loss_s, gauge_s = (2 * LAUNCH + 36 * e / LOSS_RATE) * slow, (LAUNCH + 8 * e / LOG_SOFTMAX_RATE) * slow
        for rank in (0, 1):
            rows.append({"kernel": "cross_entropy_fwd_bwd", "precision": "fp32", "micro_batch_size": b,
                         "elements": e, "bytes": "", "median_s": loss_s,
                         "over_gauge_median": loss_s / gauge_s if gauge else "", "rank": rank})
            if gauge:
                rows.append({"kernel": "log_softmax_gauge", "precision": "fp32", "micro_batch_size": b,
                             "elements": e, "bytes": 8 * e, "median_s": gauge_s, "over_gauge_median": "",
                             "rank": rank})
    with (micro / "loss.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    with (micro / "memory.csv").open() as fh:
        reader = csv.DictReader(fh)
        fields, memory = reader.fieldnames, list(reader)
    for n in (2**16, 2**20, 2**24):
        memory.append({**memory[0], "kernel": "log_softmax", "elements": n, "bytes": 8 * n, "median_s":
                       LAUNCH + 8 * n / LOG_SOFTMAX_RATE})
    with (micro / "memory.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        w.writerows(memory)
    meta = json.loads((micro / "microbench.json").read_text())
    meta.pop("memory", None)
    meta["settings"]["device_type"] = device_type
    (micro / "microbench.json").write_text(json.dumps(meta))
    return folder


def test_the_loss_kernel_runs_at_the_rate_loss_csv_measured(tmp_path):
    """loss.csv (F.cross_entropy forward + backward at the harness's logits shapes) sets the loss op's own
    efficiency: the simulated single-rank step at micro-batch 4 moves by exactly the loss's 36 bytes per logit
    at the measured rate instead of the memory-bound one; a host twice as slow while it timed the rows, as its
    log_softmax gauge says, fits the same rate; without the gauge the rows' own times count."""
    plain = build_profile(read_microbench(_with_loss(synthetic_microbench(tmp_path / "a"), gauge=False)))
    acc = plain["node"]["accelerator"]
    assert acc["efficiency"]["memory_kernels"]["by_kernel"]["cross_entropy"] == pytest.approx(
        LOSS_RATE / (acc["hbm_bandwidth_gb_per_s"] * 1e9), rel=2e-3)
    assert "loss.csv" in acc["efficiency"]["memory_kernels"]["fitted_on"]
    loaded = build_profile(read_microbench(_with_loss(synthetic_microbench(tmp_path / "b"), slow=2.0)))
    assert loaded["node"]["accelerator"]["efficiency"]["memory_kernels"]["by_kernel"]["cross_entropy"] == \
        pytest.approx(acc["efficiency"]["memory_kernels"]["by_kernel"]["cross_entropy"], rel=2e-3)
    unscaled = build_profile(read_microbench(_with_loss(synthetic_microbench(tmp_path / "c"), slow=2.0, gauge=False)))
    assert unscaled["node"]["accelerator"]["efficiency"]["memory_kernels"]["by_kernel"]["cross_entropy"] == \
        pytest.approx(acc["efficiency"]["memory_kernels"]["by_kernel"]["cross_entropy"] / 2, rel=2e-3)

    same_memory = _with_loss(synthetic_microbench(tmp_path / "d"), gauge=False)
    (same_memory / "microbench" / "loss.csv").unlink()
    without = build_profile(read_microbench(same_memory))
    assert "memory_kernels" not in without["node"]["accelerator"]["efficiency"]
    run = _dispatch_run(HARNESS, 4)
    launch_us = acc["efficiency"]["kernel_launch_overhead_us"]
    eff = without["node"]["accelerator"]["efficiency"]
    mem_bw = without["node"]["accelerator"]["hbm_bandwidth_gb_per_s"] * 1e9 * eff["memory_bound_efficiency"]
    e = 4 * 128 * 4096
    assert _simulated_fwd_bwd_s(plain, run, launch_us) - _simulated_fwd_bwd_s(without, run, launch_us) == \
        pytest.approx(36 * e / LOSS_RATE - 36 * e / mem_bw, rel=5e-3)

    gpu = build_profile(read_microbench(_with_loss(synthetic_microbench(tmp_path / "g"), device_type="cuda")))
    assert "memory_kernels" not in gpu["node"]["accelerator"]["efficiency"]  # a GPU's fused loss streams
