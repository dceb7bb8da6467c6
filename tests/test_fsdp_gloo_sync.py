"""FSDP2 over gloo on a CPU reduce-scatters on the host: ``parallelism.zero3_reduce_overlap: false``.

torch 2.13: ``FSDPParamGroup.post_backward`` runs on the autograd thread (the caller's, on a CPU) and
``foreach_reduce`` calls the reduce-scatter without ``async_op`` (False: ``dist.reduce_scatter_single`` waits
for the work) inside a ``torch.cpu.Stream`` context that does nothing; the saved s12 traces have every gloo
reduce inside the main thread's ``FSDP::post_backward_reduce``. The harness's CPU fsdp runs set the field
(``scenario_for_run``); the planner then makes the backward wait for each reduce-scatter."""

from __future__ import annotations

import copy

import yaml

from simulator.cost.calibration import build_profile, read_microbench, scenario_for_run
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from tests.test_calibration import synthetic_microbench
from tests.test_fsdp_host import _harness_run


def test_the_harness_sets_it_for_cpu_fsdp_runs_only(tmp_path):
    profile = tmp_path / "p.yaml"
    assert scenario_for_run(_harness_run("fsdp", 3), profile)["parallelism"]["zero3_reduce_overlap"] is False
    assert "zero3_reduce_overlap" not in scenario_for_run(_harness_run("ddp", 0), profile)["parallelism"]
    on_gpu = {**_harness_run("fsdp", 3), "device_type": "cuda"}
    assert "zero3_reduce_overlap" not in scenario_for_run(on_gpu, profile)["parallelism"]


def _run(tmp_path, overlap: bool):
    path = tmp_path / "profile.yaml"
    if not path.exists():
        path.write_text(yaml.safe_dump(build_profile(read_microbench(synthetic_microbench(tmp_path / "m"))),
                                       sort_keys=False))
    raw = copy.deepcopy(scenario_for_run(_harness_run("fsdp", 3), path))
    raw["parallelism"]["zero3_reduce_overlap"] = overlap
    result = simulate(load_scenario(raw))
    return result, sorted(result.timeline, key=lambda e: (e.start_s, e.end_s))


def test_each_reduce_scatter_blocks_the_backward_exactly(tmp_path):
    """The toy harness fsdp step (4 blocks + the root, gathers blocking as well): one serial chain. Every task
    starts where the one before it ended, the step is the sum of its tasks, and after each block's backward
    come its gradients' copy-in, its reduce-scatter, then the next block's gather: the order torch runs them
    on the host (the next gather is prefetched before the block's backward there; the sum is the same)."""
    result, events = _run(tmp_path, overlap=False)
    assert {e.rank_class for e in events} == {"stage0"}
    for before, after in zip(events, events[1:], strict=False):
        assert after.start_s == before.end_s, (before.name, after.name)
    assert events[0].start_s == 0.0 and events[-1].end_s == result.step_time_s
    assert abs(sum(e.end_s - e.start_s for e in events) - result.step_time_s) < 1e-12
    names = [e.name for e in events if e.name.startswith("B.")]
    for layer in (3, 2, 1):
        at = names.index(f"B.mb0.c0.L{layer}")
        assert names[at + 1:at + 4] == [f"B.mb0.c0.L{layer}.grad_copy_in", f"B.mb0.c0.L{layer}.dp_grad_reduce_scatter",
                                        f"B.mb0.c0.L{layer - 1}.zero3_copy_in"]
    assert names[-2:] == ["B.mb0.c0.grad_copy_in", "B.mb0.c0.dp_grad_reduce_scatter"]  # the root's, last
    assert [e.name for e in events][-1] == "optimizer_step"


def test_overlapped_the_compute_runs_beside_a_reduce_scatter(tmp_path):
    """The default (a GPU's reduce-scatter stream): some compute runs while a reduce-scatter is in flight, so the
    step is shorter than the blocking one by exactly that overlap (the toy profile slows neither: no overlap.csv)."""
    blocking, _ = _run(tmp_path, overlap=False)
    overlapped, events = _run(tmp_path, overlap=True)
    reduces = [e for e in events if e.name.endswith("dp_grad_reduce_scatter")]
    beside = sum(max(0.0, min(r.end_s, c.end_s) - max(r.start_s, c.start_s))
                 for r in reduces for c in events if c.stream == "compute")
    assert beside > 0
    assert abs(blocking.step_time_s - overlapped.step_time_s - beside) < 1e-12
    # the breakdown: the same compute, the blocking run's data-parallel communication all exposed
    assert abs(overlapped.time_breakdown_s["compute"] - blocking.time_breakdown_s["compute"]) < 1e-12
    assert abs(blocking.time_breakdown_s["dp_comm"] - overlapped.time_breakdown_s["dp_comm"] - beside) < 1e-12


def test_the_harness_prices_ddps_bucket_copies_for_ddp_runs_only(tmp_path):
    """The harness's ddp is torch's DistributedDataParallel with gradient_as_bucket_view left False: its reducer
    copies each gradient into a bucket and back (ddp_bucket_copies: true); no other run sets it."""
    profile = tmp_path / "p.yaml"
    assert scenario_for_run(_harness_run("ddp", 0), profile)["parallelism"]["ddp_bucket_copies"] is True
    assert "ddp_bucket_copies" not in scenario_for_run(_harness_run("fsdp", 3), profile)["parallelism"]
