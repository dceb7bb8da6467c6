"""The measurement harness: real 2-process gloo jobs on CPU, and the GPU path with the
device logic mocked. Skipped where torch (the ``validation`` extra) is not installed."""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from pathlib import Path
from unittest import mock

import pytest

torch = pytest.importorskip("torch")

from validation.harness import launcher  # noqa: E402
from validation.harness.microbench import MicrobenchConfig, bus_bytes  # noqa: E402
from validation.harness.run import run_microbench_files, run_training_files  # noqa: E402
from validation.harness.training import STRATEGIES, TrainingConfig, layout_of, merge_ranks  # noqa: E402

pytestmark = pytest.mark.torch

TINY_SPEC = {
    "name": "tiny-gpt", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
    "vocab_size": 256, "seq_length": 32, "tied_embeddings": True, "source": "test",
}


def test_launcher_runs_a_two_process_gloo_job():
    results = launcher.launch(launcher.probe_rank, 2, 2.0)
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["world_size"] == 2 and r["backend"] == "gloo" and r["device"] == "cpu" for r in results)
    assert all(r["sum"] == 2.0 * (1 + 2) for r in results)
    assert all(r["threads"] == 1 for r in results)


def test_a_second_timed_job_waits_for_the_first():
    """Two harness jobs on one machine time their steps one after the other (the launcher's lock): while another
    job holds the lock, a launched job cannot finish, however fast its ranks would be (a one-rank job finishes in
    2-3 s unlocked); once it is released, it runs."""
    import threading

    results = []
    with launcher._one_timed_job_at_a_time():
        job = threading.Thread(target=lambda: results.extend(launcher.launch(launcher.probe_rank, 1, 2.0)))
        job.start()
        job.join(timeout=6.0)
        assert job.is_alive() and not results  # waiting for the lock
    job.join()
    assert results[0]["sum"] == 2.0


def test_launcher_reports_the_failing_rank():
    with pytest.raises(launcher.LaunchError, match="rank 1"):
        launcher.launch(_fail_on_rank_one, 2)


def _fail_on_rank_one(ctx):
    if ctx.rank == 1:
        raise RuntimeError("boom")
    return ctx.rank


def _abort_at_exit_on_rank_one(ctx):
    import atexit
    import os

    if ctx.rank == 1:
        atexit.register(os.abort)  # SIGABRT after the result is reported, as a gloo teardown crash
    return ctx.rank * 10


def _abort_once_on_rank_one(ctx, marker: str):
    import os

    if ctx.rank == 1 and not Path(marker).exists():
        Path(marker).write_text("aborted once")
        os.abort()  # killed before reporting, no Python error
    return ctx.rank


def _always_abort_on_rank_one(ctx):
    import os

    if ctx.rank == 1:
        os.abort()
    return ctx.rank


def test_a_crash_after_every_rank_reported_keeps_the_results():
    with pytest.warns(RuntimeWarning, match="teardown crash"):
        assert launcher.launch(_abort_at_exit_on_rank_one, 2) == [0, 10]


def test_a_rank_killed_before_reporting_restarts_the_job_once(tmp_path):
    marker = tmp_path / "marker"
    with pytest.warns(RuntimeWarning, match="starting the job again"):
        assert launcher.launch(_abort_once_on_rank_one, 2, str(marker)) == [0, 1]
    assert marker.read_text() == "aborted once"
    with pytest.raises(launcher.LaunchError, match="SIGABRT"), pytest.warns(RuntimeWarning):
        launcher.launch(_always_abort_on_rank_one, 2)


def _freed_memory_faults(keep: bool = False) -> int:
    """Minor page faults of 20 rounds of eight 4 MiB blocks allocated, touched and freed (after one round)."""
    import resource

    if keep:
        launcher.keep_freed_memory()

    def round_():
        blocks = [bytearray(4 << 20) for _ in range(8)]
        for b in blocks:
            b[::4096] = b"\x01" * len(range(0, len(b), 4096))

    round_()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        round_()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def _rank_freed_memory_faults(ctx) -> int:
    return _freed_memory_faults()


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="glibc's malloc (Linux) only")
def test_cpu_ranks_keep_freed_memory():
    """A CPU rank's malloc keeps what it frees (launcher.KEEP_FREED_MEMORY): the same rounds of large blocks fault
    their pages in again every round under glibc's defaults (a fresh interpreter) and not in a rank, nor in a fresh
    interpreter told to keep them. Fault counts, not times."""
    import subprocess
    import sys

    code = "import sys; from tests.test_harness import _freed_memory_faults as f; print(f(sys.argv[1] == 'keep'))"
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    default, keep = (int(subprocess.run([sys.executable, "-c", code, arg], capture_output=True, text=True,
                                        check=True, cwd=root, env=env).stdout) for arg in ("default", "keep"))
    in_rank = launcher.launch(_rank_freed_memory_faults, 1)[0]
    assert default > 20 * 1000, default  # 8 x 4 MiB = 8192 pages a round
    assert keep < 1000 and in_rank < 1000, (keep, in_rank)
    assert launcher.allocator_settings("cpu")["trim_threshold_bytes"] == launcher.KEEP_FREED_MEMORY[
        "trim_threshold_bytes"]
    assert "caching allocator" in launcher.allocator_settings("cuda")["host_malloc"]


def test_quick_microbenchmarks_write_files_with_expected_fields(tmp_path):
    cfg = MicrobenchConfig(gemm_shapes=[(64, 64, 64), (128, 128, 128)], bmm_shapes=[(4, 32, 32, 16)],
                           gemm_layouts=["nn", "tn"], attention_shapes=[(1, 2, 32, 16)],
                           memory_elements=[2**12, 2**14], memory_kernels=["copy", "gelu", "adam"],
                           collective_bytes=[4096, 65536], warmup=1, reps=3, min_sample_s=2e-4)
    meta = run_microbench_files(tmp_path, world_size=2, quick=True, config=cfg)
    folder = tmp_path / "microbench"
    for name in ("gemm.csv", "memory.csv", "collectives.csv", "microbench.json"):
        assert (folder / name).is_file()
    doc = json.loads((folder / "microbench.json").read_text())
    assert doc["machine"]["cpu_cores"] >= 1 and doc["machine"]["hostname"]
    assert doc["machine"]["versions"]["torch"] == torch.__version__
    assert doc["settings"]["backend"] == "gloo" and doc["settings"]["world_size"] == 2
    assert doc["settings"]["allocator"] == launcher.allocator_settings("cpu")
    assert doc["started"] and doc["finished"]
    gemm = doc["gemm"]
    assert len(gemm) == 2 * (2 * 2 + 1 + 2)  # 2 ranks x (2 shapes x 2 layouts + 1 bmm + sdpa fwd, fwd+bwd)
    assert {r["kind"] for r in gemm} == {"mm", "bmm", "sdpa", "sdpa_fwd_bwd"}
    assert {r["layout"] for r in gemm if r["kind"] == "mm"} == {"nn", "tn"}
    for row in gemm:
        assert row["precision"] == "fp32"
        assert row["p10_s"] <= row["median_s"] <= row["p90_s"]
        assert row["tflops"] > 0 and row["reps"] == 3
    kernels = {r["kernel"] for r in doc["memory"]}
    assert kernels == {"copy", "gelu", "adam", "tiny_add", "tiny_linear_fwd_bwd", "tiny_sum_bwd"}
    # memory-bound kernels cycle through operand copies, as the GEMMs do (the tiny rows: one set)
    assert all(r["operand_copies"] > 1 for r in doc["memory"] if not r["kernel"].startswith("tiny_"))
    assert all(r["operand_copies"] > 1 for r in gemm if r["kind"] == "mm")
    eager = {r["kernel"]: r["median_s"] for r in doc["memory"] if r["kernel"].startswith("tiny_") and r["rank"] == 0}
    assert min(eager.values()) > 0  # (autograd costs more, but rows timed apart are not compared: load reorders them)
    coll = doc["collectives"]
    assert {r["collective"] for r in coll} == {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv"}
    assert {r["context"] for r in coll} == {"back_to_back", "after_compute"}
    for row in coll:
        assert row["bus_bytes"] == pytest.approx(bus_bytes(row["collective"], row["size_bytes"], 2))
        if row["context"] == "back_to_back":
            assert row["median_s"] > 0 and row["busbw_gb_per_s"] > 0
        else:  # a pair's time less its kernel's: can round to 0 for a tiny message on a noisy host
            assert row["median_s"] >= 0
    overlap = doc["overlap"]  # one row per rank: a GEMM alone and beside queued all-reduces
    assert sorted(r["rank"] for r in overlap) == [0, 1] and (folder / "overlap.csv").is_file()
    for row in overlap:
        assert 0 <= row["valid_samples"] <= row["samples"]
        if row["valid_samples"]:
            assert row["gemm_alone_s"] > 0 and row["gemm_overlapped_s"] > 0
            assert row["compute_slowdown"] == pytest.approx(row["gemm_overlapped_s"] / row["gemm_alone_s"] - 1)
    header = (folder / "collectives.csv").read_text().splitlines()[0].split(",")
    assert {"collective", "size_bytes", "bus_bytes", "median_s", "p10_s", "p90_s"} <= set(header)
    assert meta["kind"] == "clustersim-harness-microbench"
    skew = doc["skew"]  # one row per segment length: the slowest rank's lead over the mean
    assert (folder / "skew.csv").is_file() and len(skew) == 2 + 2  # 2 barrier segments, 2 all-reduce cadences
    for row in skew:
        # the lead over the mean is a load-dependent measurement: only its sign is behaviour (it exceeded 1 at load ~10)
        assert row["world_size"] == 2 and row["segment_mean_s"] > 0 and row["relative_wait"] >= 0
    cadence = [r for r in skew if r.get("method") == "collective_cadence"]  # arrivals at all-reduces every 4, 16 ms
    assert [r["segment_target_s"] for r in cadence] == [0.004, 0.016] and all(r["reps"] == 12 for r in cadence)
    for row in cadence:
        assert row["wait_mean_s"] >= 0 and row["wait_median_s"] >= 0 and row["size_bytes"] == 512 * 1024
    # per rank: the harness GPT's fwd + bwd at a tiny shape (eager dispatch), back to back and with the caches emptied
    # between its ops
    dispatch = [r for r in doc["dispatch"] if r["kernel"] == "gpt_fwd_bwd"]
    assert (folder / "dispatch.csv").is_file() and sorted(r["rank"] for r in dispatch) == [0, 1]
    for row in dispatch:
        model = json.loads(row["model"])
        assert model["hidden_size"] == 16 and model["num_layers"] == 4
        # ~140 simulated kernels (each dispatched at least as a bare add is; not compared: timed apart)
        assert 0 < row["p10_s"] <= row["median_s"] <= row["p90_s"]
    cold = [r for r in doc["dispatch"] if r["kernel"] == "gpt_fwd_bwd_cold"]
    assert sorted(r["rank"] for r in cold) == [0, 1] and len(doc["dispatch"]) == 4
    for row in cold:
        assert json.loads(row["model"]) == json.loads(dispatch[0]["model"])  # the same step
        # 27 leaf modules' forwards and 52 parameters' gradients of the 4-layer model, 2 MiB each (4 x 128 x 1024 fp32)
        assert row["evictions"] == 79 and row["evict_bytes"] == 2 * 1024 * 1024 and row["reps"] == 3 * 3
        # a difference of timed calls and a ratio: load-dependent, so only its sign is asserted
        assert row["warm_hooked_median_s"] > 0 and row["over_warm_median"] > 0
    loss = doc["loss"]  # F.cross_entropy fwd + bwd at the harness's logits shapes, each beside a log_softmax gauge
    assert (folder / "loss.csv").is_file() and len(loss) == 2 * 2 * 4  # 2 ranks x 4 micro-batches x (loss, gauge)
    for ce, gauge in zip(loss[::2], loss[1::2], strict=True):
        assert (ce["kernel"], gauge["kernel"]) == ("cross_entropy_fwd_bwd", "log_softmax_gauge")
        assert ce["elements"] == gauge["elements"] == ce["micro_batch_size"] * 128 * 4096
        # 9 passes (priced) against the gauge's 2 over the same elements, plus the exp and log: slower on a quiet host,
        # but the two are timed apart, so on a loaded one the ratio can fall below 1 (0.98 at load ~10): only > 0 here
        assert ce["over_gauge_median"] > 0 and gauge["bytes"] == 8 * gauge["elements"]
    fsdp = {r["op"]: r for r in doc["fsdp"]}  # FSDP2's gather / reduce round trips beside the bare collectives
    assert (folder / "fsdp.csv").is_file() and set(fsdp) == {
        "fsdp_gather_round_trip", "bare_all_gather", "fsdp_fwd_bwd", "plain_fwd_bwd", "bare_reduce_scatter",
        "bare_all_reduce", "dispatch_gauge", "fsdp_gather_host", "fsdp_reduce_host"}
    block = fsdp["fsdp_gather_host"]  # the harness default's block: 12 tensors, 12h^2 + 13h parameters (h = 256)
    assert block["block_param_tensors"] == 12 and block["block_params"] == 12 * 256**2 + 13 * 256
    assert block["bytes"] == 4 * block["padded_elements"] and block["layers"] == 4 and block["reps"] == 5 * 3
    assert json.loads(fsdp["dispatch_gauge"]["model"]) == json.loads(dispatch[0]["model"])  # the dispatch row's step
    for name in ("fsdp_gather_round_trip", "bare_all_gather", "fsdp_fwd_bwd", "plain_fwd_bwd", "dispatch_gauge"):
        assert 0 < fsdp[name]["p10_s"] <= fsdp[name]["median_s"] <= fsdp[name]["p90_s"]
    # the sharded blocks run the unsharded ones' kernels and 8 gathers and 4 reduces besides: slower on any quiet host,
    # but timed apart, so not asserted (no timing comparison between separately timed rows: a loaded CI host reorders them)
    probe = doc["speed_probe"]  # one sample after each mm row (2 shapes x 2 layouts) and memory row (2 x 3)
    assert probe["samples"] == 2 * (2 * 2 + 2 * 3) and probe["shape_mnk"] == [512, 1024, 256]
    assert 0 < probe["p10_s"] <= probe["median_s"] <= probe["p90_s"]


def test_every_strategy_trains_and_agrees_on_the_loss(tmp_path):
    cfg = TrainingConfig(spec=TINY_SPEC, global_batch=8, micro_batch=4, pp_micro_batches=4,
                         warmup_steps=0, steps=2, profile_steps=1)
    doc = run_training_files(tmp_path, world_size=2, quick=True, config=cfg)
    runs = {r["strategy"]: r for r in doc["runs"]}
    assert set(runs) == set(STRATEGIES)
    # a freshly initialised model over a uniform-random batch: loss ~ ln(vocab)
    ref = runs["single"]["losses"]
    assert ref[0] == pytest.approx(math.log(256), rel=0.05)
    for name, run in runs.items():
        # step 0: the same weights and batch, so TP/PP/FSDP/DDP compute the very same loss
        assert run["losses"][0] == pytest.approx(ref[0], rel=1e-5, abs=1e-5), name
        # later steps: the same gradients and Adam updates, up to summation order (local learning
        # trains its first group on its own loss: another model from step 1 on)
        for got, want in zip(run["losses"][1:], ref[1:], strict=True):
            if name == "local_learning":
                assert got != pytest.approx(want, rel=1e-6) and math.isfinite(got), name
            else:
                assert got == pytest.approx(want, rel=1e-3), name
        # single pools its two independent copies' steps; a job's step is its slowest rank's
        assert run["steps_timed"] == (4 if name == "single" else 2) and run["step_time_s"] > 0
        assert run["speed_probe"]["samples"] == 2 * 2 and run["speed_probe"]["median_s"] > 0  # 1 per step and rank
        # getrusage of each rank's process over each timed step (Linux): CPU seconds and fault counts
        assert run["user_cpu_s_per_step"] > 0 and run["system_cpu_s_per_step"] >= 0, name
        assert run["minor_faults_per_step"] >= 0, name
        assert len(run["step_times_s_per_rank"]) == 2
        assert run["layout"] == layout_of(name, cfg, 2)
        assert run["model"]["hidden_size"] == 64
        assert run["traces"], name
        for trace in run["traces"]:
            data = json.loads((tmp_path / "training" / trace).read_text())
            names = {e.get("name", "") for e in data["traceEvents"]}
            assert any(n.startswith("ProfilerStep#") for n in names), trace
    assert runs["single"]["world_size"] == 1 and runs["ddp"]["world_size"] == 2
    assert runs["single"]["ranks_timed"] == 2  # every rank trains its own copy (same neighbours as the others)
    # ZeRO-3 and TP hold about half the parameters per rank; DDP all of them
    full = runs["ddp"]["local_params_per_rank"][0]
    assert runs["fsdp"]["local_params_per_rank"][0] < 0.6 * full
    assert runs["tp"]["local_params_per_rank"][0] < 0.75 * full
    assert (tmp_path / "training" / "runs.csv").is_file()


def test_a_job_step_is_its_slowest_rank_and_single_pools_independent_copies():
    cfg = TrainingConfig(spec=TINY_SPEC, warmup_steps=0, steps=2)

    def rec(strategy, rank, times, usage=None):
        return {"strategy": strategy, "rank": rank, "active": True, "losses": [1.0, 1.0], "step_times_s": times,
                "trace": None, "local_params": 10, "probe_samples_s": [0.003, 0.004], "probe_shape": [512, 1024, 256],
                **({"host_usage_per_step": usage} if usage is not None else {})}

    # (kernel-mode s, user-mode s, minor faults) per timed step of each rank
    per_rank = [[rec("single", 0, [0.10, 0.30], [(0.004, 0.09, 3000), (0.008, 0.28, 9000)]), rec("ddp", 0, [0.10, 0.30])],
                [rec("single", 1, [0.20, 0.40], [(0.005, 0.19, 4000), (0.020, 0.37, 1000)]), rec("ddp", 1, [0.20, 0.25])]]
    runs = {r["strategy"]: r for r in merge_ranks(per_rank, cfg, 2)}
    # the host's own work per step: medians over every rank's timed steps; runs recorded without it carry none
    assert runs["single"]["system_cpu_s_per_step"] == pytest.approx(0.0065)
    assert runs["single"]["user_cpu_s_per_step"] == pytest.approx(0.235)
    assert runs["single"]["minor_faults_per_step"] == pytest.approx(3500)
    assert "system_cpu_s_per_step" not in runs["ddp"]
    assert runs["ddp"]["step_times_s"] == [0.20, 0.30]
    assert runs["ddp"]["step_time_s"] == pytest.approx(0.25)
    assert sorted(runs["single"]["step_times_s"]) == [0.10, 0.20, 0.30, 0.40]
    assert runs["single"]["step_time_s"] == pytest.approx(0.25)
    assert runs["single"]["speed_probe"]["samples"] == 4
    assert runs["single"]["speed_probe"]["median_s"] == pytest.approx(0.0035)


def test_layouts_map_to_simulator_parallelism():
    cfg = TrainingConfig(spec=TINY_SPEC)
    assert layout_of("fsdp", cfg, 2)["zero_stage"] == 3
    assert layout_of("pp_gpipe", cfg, 2) | {} == {**layout_of("pp_gpipe", cfg, 2), "schedule": "gpipe", "pp": 2}
    assert layout_of("pp_1f1b", cfg, 2)["num_micro_batches"] == 4
    assert layout_of("tp", cfg, 2)["tp"] == 2
    with pytest.raises(ValueError):
        layout_of("zero9", cfg, 2)


# --------------------------------------------------------------------------- GPU path, mocked
def _fake_cuda(count: int):
    return [
        mock.patch.object(torch.cuda, "is_available", return_value=True),
        mock.patch.object(torch.cuda, "device_count", return_value=count),
        mock.patch.object(torch.distributed, "is_nccl_available", return_value=True),
    ]


def test_nccl_one_process_per_gpu_when_cuda_is_present():
    patches = _fake_cuda(4)
    for p in patches:
        p.start()
    try:
        choice = launcher.choose_device(2)
        assert (choice.backend, choice.device_type, choice.num_devices) == ("nccl", "cuda", 4)
        assert choice.device_for(1) == torch.device("cuda", 1)
        with pytest.raises(RuntimeError, match="one GPU per process"):
            launcher.choose_device(8)
        assert launcher.choose_device(2, device="cpu").backend == "gloo"
    finally:
        for p in patches:
            p.stop()


def test_cpu_when_no_cuda_and_clear_errors():
    with mock.patch.object(torch.cuda, "is_available", return_value=False):
        choice = launcher.choose_device(2)
        assert (choice.backend, choice.device_type) == ("gloo", "cpu")
        with pytest.raises(RuntimeError, match="no CUDA"):
            launcher.choose_device(2, device="cuda")
        with pytest.raises(RuntimeError, match="needs CUDA"):
            launcher.choose_device(2, backend="nccl")


def test_worker_initialises_nccl_on_its_own_gpu(tmp_path):
    """The rank side of the GPU path: set the device, init NCCL bound to it, run, report.

    ``_worker`` runs here in the test process, where a rank's process-wide settings would outlive
    the test: its environment (MASTER_PORT, RANK, WORLD_SIZE ...) is restored after, torch's thread
    count too, and its priority request is stubbed (a rank asks for nice -20: the test process, and
    every test after it, would keep it)."""
    choice = launcher.DeviceChoice("nccl", "cuda", 2)
    threads = torch.get_num_threads()
    try:
        with mock.patch.object(torch.cuda, "set_device") as set_device, \
             mock.patch.object(torch.distributed, "init_process_group") as init, \
             mock.patch.object(torch.distributed, "is_initialized", return_value=False), \
             mock.patch.object(launcher, "_raise_priority", return_value=True) as raise_priority, \
             mock.patch.dict(os.environ):
            launcher._worker(1, _return_ctx, (), 2, choice, 12345, 1, str(tmp_path), 60.0)
    finally:
        torch.set_num_threads(threads)
    raise_priority.assert_called_once_with()
    set_device.assert_called_once_with(torch.device("cuda", 1))
    args, kwargs = init.call_args
    assert args[0] == "nccl" and kwargs["rank"] == 1 and kwargs["world_size"] == 2
    assert kwargs["device_id"] == torch.device("cuda", 1)
    import pickle

    status, value = pickle.loads((tmp_path / "rank1.pkl").read_bytes())
    assert status == "ok" and value == {"rank": 1, "backend": "nccl", "cuda": True}


def _return_ctx(ctx):
    return {"rank": ctx.rank, "backend": ctx.backend, "cuda": ctx.is_cuda}


def test_training_measures_cuda_memory_when_on_gpu():
    from validation.harness.training import PeakMemory

    ctx = launcher.RankContext(0, 1, torch.device("cuda", 0), "nccl", "cuda", 1)
    with mock.patch.object(torch.cuda, "synchronize"), \
         mock.patch.object(torch.cuda, "reset_peak_memory_stats") as reset, \
         mock.patch.object(torch.cuda, "memory_allocated", return_value=100), \
         mock.patch.object(torch.cuda, "max_memory_allocated", return_value=5000):
        pm = PeakMemory(ctx)
        pm.start()
        got = pm.stop()
    reset.assert_called_once()
    assert got["peak_memory_bytes"] == 5000 and got["peak_memory_kind"] == "cuda_max_memory_allocated"


def test_cpu_peak_memory_is_recorded_or_explained():
    from validation.harness.training import PeakMemory

    ctx = launcher.RankContext(0, 1, torch.device("cpu"), "gloo", "cpu", 1)
    pm = PeakMemory(ctx)
    pm.start()
    blob = torch.ones(8 * 2**20)  # 32 MiB
    got = pm.stop()
    del blob
    if got["peak_memory_bytes"] is None:
        assert got["peak_memory_note"]
    else:
        assert got["peak_memory_bytes"] >= 16 * 2**20


def test_gpu_microbench_precisions_default_to_half_types():
    from validation.harness import microbench

    ctx = launcher.RankContext(0, 1, torch.device("cpu"), "gloo", "cuda", 1)  # cuda-typed ctx, cpu tensors
    cfg = MicrobenchConfig(gemm_shapes=[(16, 16, 16)], gemm_layouts=["nn"], bmm_shapes=[], attention_shapes=[],
                           warmup=0, reps=1, min_sample_s=0)
    with mock.patch.object(ctx.__class__, "sync", lambda self: None), \
            mock.patch.object(microbench, "last_level_cache_bytes", lambda is_cuda, device=None: 50 * 2**20):
        rows = microbench.bench_gemm(ctx, replace(cfg, precisions=None))
    assert [r["precision"] for r in rows] == ["fp32", "bf16", "fp16"]
    # operands cycle through copies that fill twice the (here: mocked 50 MiB) L2
    assert rows[0]["operand_copies"] == 64 and rows[1]["operand_copies"] == 64


def test_memory_kernels_cycle_through_warmed_operand_copies():
    """Each call of a cold memory-bound kernel runs on the next set (inputs, outputs, Adam
    states), every set touched once before timing; one set when cold is off or one fills the cache."""
    from validation.harness import microbench

    made = []
    real = microbench._memory_kernel

    def recording(name, n, device, dtype):
        fn, nbytes = real(name, n, device, dtype)
        index = len(made)
        calls = []
        made.append(calls)
        return (lambda: (calls.append(index), fn())[1]), nbytes

    with mock.patch.object(microbench, "_memory_kernel", recording):
        fn, nbytes, copies = microbench.memory_kernel_copies("add", 2**14, "cpu", torch.float32, 2**20)
        assert nbytes == 3 * 2**14 * 4 and copies == microbench.operand_copies(nbytes, 2**20) == 11
        assert [len(c) for c in made] == [1] * copies  # each set touched once already
        for _ in range(copies + 2):
            fn()
        assert [len(c) for c in made] == [3, 3] + [2] * (copies - 2)  # in turn
        made.clear()
        fn, _, copies = microbench.memory_kernel_copies("adam", 2**10, "cpu", torch.float32, 2**20, cold=False)
        assert copies == 1 and len(made) == 1
        made.clear()
        _, _, copies = microbench.memory_kernel_copies("copy", 2**10, "cpu", torch.float32, 1)
        assert copies == 1 and len(made) == 1


def test_operand_copies_fill_twice_the_cache_within_bounds():
    from validation.harness.microbench import operand_copies

    assert operand_copies(1024 * 1024, 32 * 2**20) == 64             # 1 MiB sets: 64 fill 64 MiB
    assert operand_copies(3 * 2**20, 32 * 2**20) == 22               # ceil(64 / 3)
    assert operand_copies(256 * 2**20, 32 * 2**20) == 1              # one set already exceeds the cache
    assert operand_copies(16 * 2**20, 512 * 2**20) == 32             # capped at 512 MiB of copies
    assert operand_copies(0, 32 * 2**20) == 1


def test_module_cli_help_does_not_need_a_run(capsys):
    from validation.harness.__main__ import main

    with pytest.raises(SystemExit):
        main(["--help"])
    assert "--world-size" in capsys.readouterr().out


def test_output_folder_layout_is_documented():
    from validation.harness import run

    doc = run.__doc__
    for name in ("manifest.json", "gemm.csv", "collectives.csv", "fsdp.csv", "runs.json", "traces"):
        assert name in doc
    assert Path(run.__file__).is_file()


def test_local_sgd_and_the_step_in_backward_train_as_their_references(tmp_path):
    # local SGD (H = 4) starts from DDP's weights on the same shards: the same loss at step 0,
    # another model once the replicas have drifted apart. The optimizer step in the backward is the
    # same Adam on the same gradients as the separate step: the same losses at every step.
    strategies = ["ddp", "local_sgd", "step_in_backward", "step_separate"]
    cfg = TrainingConfig(spec=TINY_SPEC, strategies=strategies, global_batch=8, micro_batch=4,
                         pp_micro_batches=4, warmup_steps=0, steps=2, profile_steps=0)
    runs = {r["strategy"]: r for r in run_training_files(tmp_path, world_size=2, quick=True, config=cfg)["runs"]}
    assert runs["local_sgd"]["losses"][0] == pytest.approx(runs["ddp"]["losses"][0], rel=1e-5)
    assert runs["local_sgd"]["losses"][1] != pytest.approx(runs["ddp"]["losses"][1], rel=1e-6)
    assert runs["step_in_backward"]["losses"] == pytest.approx(runs["step_separate"]["losses"], rel=1e-4)
    assert runs["step_in_backward"]["losses"][0] == pytest.approx(runs["ddp"]["losses"][0], rel=1e-5)
    assert runs["local_sgd"]["layout"]["strategy"]["local_steps"] == 4 and runs["local_sgd"]["steps_timed"] == 2
    assert runs["step_in_backward"]["steps_timed"] == 4  # two copies pooled, as single
    assert runs["step_in_backward"]["layout"]["optimizer_fusion"] == "backward"
