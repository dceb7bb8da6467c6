"""Communication slowing overlapped compute (engine ``slowdown_while_contended`` / ``contends``,
planner ``accelerator.efficiency.overlap_compute_slowdown``): exact times on toy task graphs."""

from __future__ import annotations

import copy

import pytest

from simulator.engine.engine import Engine, Task
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from tests.test_simulate import T_AR, T_FC1_W, T_HEAD_W, T_LAYER, T_QKV_W, H, L, S, _tp_raw, toy_raw


def _run(*tasks: Task, capacity: float = 1.0) -> float:
    streams: dict[tuple[str, str], list[Task]] = {}
    for t in tasks:
        streams.setdefault((t.actor, t.stream), []).append(t)
    return Engine(lambda _port: capacity).run(streams)


def test_kernel_overlapped_for_part_of_its_length():
    # 10 s kernel, s = 1 (half speed while contended); a 4-byte flow at 1 B/s runs 0..4:
    # 4 s at half rate = 2 s of work, 8 s left at full rate -> ends at 12.
    k = Task("k", "r0", "compute", "compute", duration_s=10.0, slowdown_while_contended=1.0)
    c = Task("c", "r0", "dp", "dp_comm", demands={"r0:nic_tx": 4.0}, contends=True)
    assert _run(k, c) == 12.0
    assert (k.end_s, c.end_s) == (12.0, 4.0)


def test_contention_that_starts_and_ends_inside_the_kernel():
    # The flow waits for a 2 s task, then runs 3 s: kernel 0..2 full, 2..5 at 1/(1+0.5),
    # i.e. 2 s of work, then 10 - 2 - 2 = 6 s: ends at 11.
    k = Task("k", "r0", "compute", "compute", duration_s=10.0, slowdown_while_contended=0.5)
    wait = Task("wait", "r0", "dp", "other", duration_s=2.0)
    c = Task("c", "r0", "dp", "dp_comm", demands={"r0:nic_tx": 3.0}, contends=True)
    _run(k, wait, c)
    assert k.end_s == pytest.approx(11.0, rel=1e-12)
    assert c.end_s == 5.0


def test_kernel_inside_a_long_transfer_runs_slow_throughout():
    k = Task("k", "r0", "compute", "compute", duration_s=2.0, slowdown_while_contended=0.25)
    c = Task("c", "r0", "dp", "dp_comm", demands={"r0:nic_tx": 10.0}, contends=True)
    _run(k, c)
    assert k.end_s == pytest.approx(2.5, rel=1e-12)


def test_other_actors_and_non_contending_tasks_do_not_slow_a_kernel():
    k = Task("k", "r0", "compute", "compute", duration_s=2.0, slowdown_while_contended=1.0)
    elsewhere = Task("c1", "r1", "dp", "dp_comm", demands={"r1:nic_tx": 10.0}, contends=True)
    quiet = Task("c2", "r0", "dp", "dp_comm", demands={"r0:nic_tx": 10.0}, contends=False)
    _run(k, elsewhere, quiet)
    assert k.end_s == 2.0


def test_collective_over_a_rendezvous_contends_on_every_member():
    # Two actors meet in a collective at t = 1 (r1 arrives late); each one's kernel slows from then.
    late = Task("late", "r1", "dp", "other", duration_s=1.0)
    ar0 = Task("ar", "r0", "dp", "dp_comm", demands={"r0:nvl_tx": 2.0}, rendezvous="ar", rendezvous_size=2,
               contends=True)
    ar1 = Task("ar", "r1", "dp", "dp_comm", demands={"r1:nvl_tx": 2.0}, rendezvous="ar", rendezvous_size=2,
               contends=True)
    k0 = Task("k0", "r0", "compute", "compute", duration_s=4.0, slowdown_while_contended=1.0)
    k1 = Task("k1", "r1", "compute", "compute", duration_s=4.0, slowdown_while_contended=1.0)
    _run(late, ar0, ar1, k0, k1)
    assert (ar0.start_s, ar0.end_s) == (1.0, 3.0)  # both flows share nothing: 2 bytes at 1 B/s each
    # kernels: 1 s full, 2 s at half (1 s of work), 2 s left: end at 5.
    assert k0.end_s == pytest.approx(5.0) and k1.end_s == pytest.approx(5.0)


def test_a_transfer_moves_slower_while_its_actor_computes():
    # c = 1: the 4-byte flow (1 B/s) moves at 0.5 B/s while the 2 s kernel runs (1 byte by
    # t = 2), then 3 bytes at full rate: ends at 5. The kernel itself is not slowed (s = 0).
    k = Task("k", "r0", "compute", "compute", duration_s=2.0, slows_comm=True)
    c = Task("c", "r0", "dp", "dp_comm", demands={"r0:nic_tx": 4.0}, comm_slowdown_while_computing=1.0)
    _run(k, c)
    assert k.end_s == 2.0
    assert c.end_s == pytest.approx(5.0, rel=1e-12)


def test_kernel_and_transfer_slow_each_other_as_the_closed_form_says():
    # s = c = 1, both start at 0: each at half pace; the 2 s kernel ends at 4 (the flow has moved
    # 2 of 4 bytes), the flow's other 2 bytes take 2 s: 6 s = overlapped_pair_s(2, 4, 1, 1).
    from simulator.cost.interference import overlapped_pair_s

    k = Task("k", "r0", "compute", "compute", duration_s=2.0, slowdown_while_contended=1.0, slows_comm=True)
    c = Task("c", "r0", "dp", "dp_comm", demands={"r0:nic_tx": 4.0}, contends=True, comm_slowdown_while_computing=1.0)
    assert _run(k, c) == pytest.approx(6.0, rel=1e-12)
    assert k.end_s == pytest.approx(4.0, rel=1e-12)
    assert overlapped_pair_s(2.0, 4.0, 1.0, 1.0) == pytest.approx(6.0)
    # the other branch: the collective ends first (t_c(1+c) = 2 <= t_k(1+s) = 8)
    k2 = Task("k", "r0", "compute", "compute", duration_s=4.0, slowdown_while_contended=1.0, slows_comm=True)
    c2 = Task("c", "r0", "dp", "dp_comm", demands={"r0:nic_tx": 1.0}, contends=True, comm_slowdown_while_computing=1.0)
    assert _run(k2, c2) == pytest.approx(overlapped_pair_s(4.0, 1.0, 1.0, 1.0), rel=1e-12)
    assert c2.end_s == pytest.approx(2.0, rel=1e-12)


def test_a_collective_moves_at_its_slowest_members_pace():
    # r0 computes 0..2, r1 is idle: the shared flow (2 bytes per member at 1 B/s) still slows to
    # 1/(1+c) = 1/3 while r0 computes: 2/3 byte by t = 2, then 4/3 at full rate: ends at 10/3.
    ar0 = Task("ar", "r0", "dp", "dp_comm", demands={"r0:nvl_tx": 2.0}, rendezvous="ar", rendezvous_size=2,
               comm_slowdown_while_computing=2.0)
    ar1 = Task("ar", "r1", "dp", "dp_comm", demands={"r1:nvl_tx": 2.0}, rendezvous="ar", rendezvous_size=2,
               comm_slowdown_while_computing=2.0)
    k0 = Task("k0", "r0", "compute", "compute", duration_s=2.0, slows_comm=True)
    _run(ar0, ar1, k0)
    assert ar0.end_s == pytest.approx(10 / 3, rel=1e-12) and ar1.end_s == ar0.end_s


def test_closed_form_without_communication_slowdown_is_the_old_one():
    from simulator.cost.interference import exposed_comm_share

    for t_k, t_c, s in [(1.0, 3.0, 0.5), (3.0, 1.0, 0.5), (2.0, 2.0, 0.0), (1.0, 1.0, 2.0)]:
        assert exposed_comm_share(t_k, t_c, s, 0.0) == pytest.approx(max(0.0, t_c - t_k, t_c * s / (1 + s)) / t_c)


def _with_slowdown(raw: dict, slowdown: float, comm_slowdown: float = 0.0) -> dict:
    raw = copy.deepcopy(raw)
    raw["cluster"]["node"]["accelerator"]["efficiency"]["overlap_compute_slowdown"] = slowdown
    raw["cluster"]["node"]["accelerator"]["efficiency"]["overlap_comm_slowdown"] = comm_slowdown
    return raw


@pytest.mark.parametrize(("mode", "detail"), [("symmetric", False), ("symmetric", True), ("full", False), ("full", True)])
def test_tp_input_grad_overlap_with_a_slowed_wgrad_kernel(mode, detail):
    # test_simulate's TP toy with s = 1: a wgrad GEMM beside its input-gradient all-reduce runs at
    # half speed, so the pair takes max(t_ar, t_w + t_ar/2): QKV max(200, 150.3) -> exposed
    # max(t_ar - t_w, t_ar/2) = 100 us (was 99.34), FC1 100 us (was 65.78), head ~t_ar.
    s = 1.0
    exposed_share = s / (1 + s)
    per_mb = (2 * L * T_AR + 4 * T_AR + L * (max(T_AR - T_QKV_W, T_AR * exposed_share)
                                         + max(T_AR - T_FC1_W, T_AR * exposed_share))
              + max(T_AR - T_HEAD_W, T_AR * exposed_share))
    r = simulate(load_scenario(_with_slowdown(_tp_raw(overlap=True), s)), mode=mode, detail=detail)
    assert r.step_time_s == pytest.approx(3 * (1.5 * L * T_LAYER + per_mb), rel=1e-9)


@pytest.mark.parametrize(("mode", "detail"), [("symmetric", False), ("symmetric", True), ("full", False), ("full", True)])
def test_tp_overlap_with_both_directions_of_slowdown_agrees_in_every_mode(mode, detail):
    # s = 1, c = 1: every overlapped pair takes overlapped_pair_s(t_w, t_ar, 1, 1).
    from simulator.cost.interference import overlapped_pair_s

    def exposed(t_w: float) -> float:
        return overlapped_pair_s(t_w, T_AR, 1.0, 1.0) - t_w

    per_mb = 2 * L * T_AR + 4 * T_AR + L * (exposed(T_QKV_W) + exposed(T_FC1_W)) + exposed(T_HEAD_W)
    r = simulate(load_scenario(_with_slowdown(_tp_raw(overlap=True), 1.0, 1.0)), mode=mode, detail=detail)
    assert r.step_time_s == pytest.approx(3 * (1.5 * L * T_LAYER + per_mb), rel=1e-9)


def test_overlapped_gradient_reduction_stretches_when_the_backward_slows_it():
    raw = toy_raw(2, nvl_gb_per_s=1, nvl_latency_us=1, dp=2, global_batch_size=2, overlap_grad_reduce=True,
                  gradient_bucket_mb=0.5)
    base = simulate(load_scenario(raw))
    slowed = simulate(load_scenario(_with_slowdown(raw, 0.0, 3.0)))
    assert slowed.step_time_s > base.step_time_s
    assert slowed.time_breakdown_s["compute"] == pytest.approx(base.time_breakdown_s["compute"], rel=1e-12)


def test_overlapped_gradient_reduction_slows_the_backward_it_hides_behind():
    raw = toy_raw(2, nvl_gb_per_s=1, nvl_latency_us=1, dp=2, global_batch_size=2, overlap_grad_reduce=True,
                  gradient_bucket_mb=0.5)
    base = simulate(load_scenario(raw)).step_time_s
    slowed = simulate(load_scenario(_with_slowdown(raw, 0.5))).step_time_s
    assert slowed > base
    single = toy_raw(1, global_batch_size=1)
    assert simulate(load_scenario(_with_slowdown(single, 0.5))).step_time_s == simulate(load_scenario(single)).step_time_s


def test_blocking_pipeline_sends_delay_the_sender():
    # pp = 2, 2 micro-batches, GPipe; a send of b·s·h bf16 = 131,072 B at 1 GB/s takes t_s = 131 us.
    # Overlapped (default) the first stage's second forward starts right after its first; blocking,
    # it waits for the first send, and the step grows by at least t_s.
    t_s = S * H * 2 / 1e9
    raw = toy_raw(2, nvl_gb_per_s=1, pp=2, global_batch_size=2, schedule="gpipe")
    overlapped = simulate(load_scenario(raw))
    blocking_raw = copy.deepcopy(raw)
    blocking_raw["parallelism"]["overlap_p2p_comm"] = False
    blocking = simulate(load_scenario(blocking_raw))
    assert blocking.step_time_s >= overlapped.step_time_s + t_s * (1 - 1e-9)
    assert blocking.step_time_s <= overlapped.step_time_s + 4 * t_s * (1 + 1e-9)  # at most one per send


def _sp_raw(tp_comm_overlap: bool) -> dict:
    raw = toy_raw(2, nvl_gb_per_s=50, nvl_latency_us=5, tp=2, global_batch_size=2, sequence_parallel=True,
                  overlap_grad_reduce=False)
    raw["parallelism"]["tp_comm_overlap"] = tp_comm_overlap
    return raw


def test_userbuffers_overlap_puts_each_tp_collective_beside_its_gemm():
    from workloads.graph import ShardShape, layer_work

    model = load_scenario(_sp_raw(True)).model
    work = layer_work(model, ShardShape(micro_batch=1, seq_length=S, tp=2, sequence_parallel=True,
                                        tp_comm_overlap=True))
    pairs = [(op.name, work.forward[i + 1].name) for i, op in enumerate(work.forward)
             if op.kind == "collective" and op.overlaps_next]
    assert pairs == [("attn_in.all_gather", "qkv"), ("attn_out.reduce_scatter", "attn_out"),
                     ("mlp_in.all_gather", "fc1"), ("mlp_out.reduce_scatter", "fc2")]
    back = [(op.name, work.backward[i + 1].name) for i, op in enumerate(work.backward)
            if op.kind == "collective" and op.overlap_knob == "tp_comm"]
    assert back == [("mlp_out.reduce_scatter.grad", "fc2.dgrad"), ("attn_out.reduce_scatter.grad", "attn_out.dgrad")]


@pytest.mark.parametrize(("mode", "detail"), [("symmetric", False), ("symmetric", True), ("full", True)])
def test_userbuffers_overlap_hides_tp_time_the_same_in_every_mode(mode, detail):
    plain = simulate(load_scenario(_sp_raw(False)), mode=mode, detail=detail)
    ub = simulate(load_scenario(_sp_raw(True)), mode=mode, detail=detail)
    reference = simulate(load_scenario(_sp_raw(True)))
    assert ub.step_time_s == pytest.approx(reference.step_time_s, rel=1e-9)
    assert ub.step_time_s < plain.step_time_s
    assert ub.time_breakdown_s["tp_comm"] < plain.time_breakdown_s["tp_comm"]


def test_userbuffers_overlap_needs_sequence_parallel():
    from simulator.errors import ConfigError

    raw = toy_raw(2, tp=2, global_batch_size=1)
    raw["parallelism"]["tp_comm_overlap"] = True
    with pytest.raises(ConfigError, match="tp_comm_overlap"):
        simulate(load_scenario(raw))


def _moe_scenario(**par):
    return load_scenario({
        "model": {"name": "toy-moe", "num_layers": 2, "hidden_size": 1024, "num_attention_heads": 8,
                  "vocab_size": 1000, "seq_length": 2048, "gated_mlp": True, "ffn_hidden_size": 2048,
                  "moe": {"num_experts": 8, "top_k": 2}},
        "cluster": {"node": "dgx-h100", "fabric": "fat-tree", "num_gpus": 16},
        "parallelism": {"ep": 8, "micro_batch_size": 1, "global_batch_size": 32, **par},
        "training": {"attention": "flash"},
    })


@pytest.mark.parametrize("detail", [False, True])
def test_paired_moe_overlap_hides_all_to_alls_behind_the_pass(detail):
    # 16 GPUs: ep 8 spans a node, dp 2 across nodes. Overlapped, each pass exposes only
    # max(0, A - T) of its all-to-alls A (T: its kernels): here the pass's kernels are longer.
    plain = simulate(_moe_scenario(), detail=detail)
    paired = simulate(_moe_scenario(overlap_moe_comm=True), detail=detail)
    assert plain.time_breakdown_s["ep_comm"] > 0
    assert paired.time_breakdown_s["ep_comm"] == 0.0
    assert paired.time_breakdown_s["compute"] == pytest.approx(plain.time_breakdown_s["compute"], rel=1e-9)
    # the step shrinks by the all-to-alls, less what of the gradient all-reduce they used to hide
    assert plain.step_time_s - plain.time_breakdown_s["ep_comm"] <= paired.step_time_s < plain.step_time_s


def test_expected_maximum_of_normals_matches_known_values():
    import math

    from simulator.cost.jitter import expected_max_of_normals, sync_stretch

    assert expected_max_of_normals(1) == 0.0
    assert expected_max_of_normals(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-9)
    assert expected_max_of_normals(3) == pytest.approx(1.5 / math.sqrt(math.pi), rel=1e-9)  # 3/(2 sqrt(pi))
    assert expected_max_of_normals(8) == pytest.approx(1.4236, abs=1e-4)
    assert sync_stretch(0.1, 2) == pytest.approx(1 + 0.1 / math.sqrt(math.pi), rel=1e-9)
    assert sync_stretch(0.1, 1) == 1.0 and sync_stretch(0.0, 64) == 1.0


@pytest.mark.parametrize(("mode", "detail"), [("symmetric", False), ("symmetric", True), ("full", False)])
def test_sync_jitter_stretches_every_kernel_of_a_multi_rank_job(mode, detail):
    # the TP toy (2 ranks): with sigma = 0.1 every kernel takes 1 + 0.1 e_2 times as long; the
    # collectives do not change; a one-GPU job is not stretched.
    from simulator.cost.jitter import sync_stretch

    raw = _tp_raw(overlap=False)
    base = simulate(load_scenario(raw), mode=mode, detail=detail)
    jittered_raw = copy.deepcopy(raw)
    jittered_raw["cluster"]["node"]["accelerator"]["efficiency"]["sync_jitter"] = 0.1
    jittered = simulate(load_scenario(jittered_raw), mode=mode, detail=detail)
    k = sync_stretch(0.1, 2)
    assert jittered.time_breakdown_s["compute"] == pytest.approx(base.time_breakdown_s["compute"] * k, rel=1e-9)
    assert jittered.time_breakdown_s["tp_comm"] == pytest.approx(base.time_breakdown_s["tp_comm"], rel=1e-9)
    single = toy_raw(1, global_batch_size=1)
    single_jittered = copy.deepcopy(single)
    single_jittered["cluster"]["node"]["accelerator"]["efficiency"]["sync_jitter"] = 0.1
    assert simulate(load_scenario(single_jittered)).step_time_s == simulate(load_scenario(single)).step_time_s
