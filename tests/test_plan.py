"""The planner (simulator/strategies/spmd/plan.py): actors, task lists, and the bytes each collective moves.

Model used throughout ("small"): GPT, 4 layers, h = 256, 8 heads, s = 256, V = 1024, untied,
learned positions. Parameters: a layer 12h² + 13h = 789,760; embedding V·h + s·h = 327,680;
final norm 2h = 512 plus head V·h = 262,144: total 4·789,760 + 327,680 + 262,656 = 3,749,376.
"""

from __future__ import annotations

import pytest

from simulator.scenario import load_scenario
from simulator.strategies.spmd.plan import Planner
from workloads.counting import total_params

SMALL = dict(name="small-gpt", num_layers=4, hidden_size=256, num_attention_heads=8, vocab_size=1024,
             seq_length=256)
P_LAYER = 789_760
P_EMBED = 327_680
P_HEAD = 262_656
P_TOTAL = 4 * P_LAYER + P_EMBED + P_HEAD
ACT = 256 * 256 * 2  # one micro-batch's b·s·h activation in bf16: 131,072 bytes


def a100(num_gpus: int, model: dict | None = None, **parallelism):
    par = dict(micro_batch_size=1, global_batch_size=16)
    par.update(parallelism)
    return load_scenario(dict(model=model or SMALL, cluster=dict(node="dgx-a100-80g", fabric="fat-tree",
                                                                  num_gpus=num_gpus), parallelism=par,
                              # the hand-derived volumes below count 2-byte (bf16) gradients
                              # and the materialised softmax's kernels (scores, softmax, values)
                              training=dict(grad_dtype="bf16", attention="standard")))


def _tasks(plan, actor: str, stream: str):
    return plan.streams.get((actor, stream), [])


def test_parameter_count_of_the_small_model():
    assert total_params(a100(8, tp=1).model) == P_TOTAL == 3_749_376


def test_symmetric_mode_has_one_actor_per_stage():
    # tp 2, pp 2, dp 4 (tp-cp-dp-pp numbering): stage 1 starts at rank tp·dp = 8.
    plan = Planner(a100(16, tp=2, pp=2, dp=4)).build()
    assert plan.actors == {"stage0": 0, "stage1": 8}
    assert plan.stage_of == {"stage0": 0, "stage1": 1}
    assert plan.layers_per_chunk == [2, 2]


def test_full_mode_has_every_rank():
    plan = Planner(a100(16, tp=2, pp=2, dp=4), mode="full").build()
    assert plan.actors == {f"rank{r}": r for r in range(16)}
    assert plan.stage_of["rank7"] == 0 and plan.stage_of["rank8"] == 1


def test_coarse_task_counts():
    # pp = 1, m = 2 micro-batches (16 / dp 8), gradients reduced after the backward: one task per
    # pass: 2 F + 2 B + optimizer = 5.
    plan = Planner(a100(8, tp=1, pp=1, dp=8, overlap_grad_reduce=False)).build()
    names = [t.name for t in _tasks(plan, "stage0", "compute")]
    assert names == ["F.mb0.c0", "B.mb0.c0", "F.mb1.c0", "B.mb1.c0", "optimizer_step"]
    # overlapped gradient buckets: the last micro-batch's backward runs per layer so that buckets can
    # start as soon as their layers are done: head + 4 layers + embedding = 6 tasks -> 3 + 6 + 1 = 10.
    plan = Planner(a100(8, tp=1, pp=1, dp=8)).build()
    names = [t.name for t in _tasks(plan, "stage0", "compute")]
    assert names[3:9] == ["B.mb1.c0.head", "B.mb1.c0.L3", "B.mb1.c0.L2", "B.mb1.c0.L1", "B.mb1.c0.L0",
                          "B.mb1.c0.embedding"]
    assert len(names) == 10
    # full recompute adds one recompute task before each backward: 7
    plan = Planner(a100(8, tp=1, pp=1, dp=8, recompute="full", overlap_grad_reduce=False)).build()
    cats = [t.category for t in _tasks(plan, "stage0", "compute")]
    assert cats.count("recompute") == 2 and len(cats) == 7


def test_detail_mode_has_one_task_per_kernel():
    # tp = 1: a layer forward has 12 kernels (ln1, qkv, scores, softmax, values, out, dropout_residual1,
    # ln2, fc1, gelu, fc2, dropout_residual2); embedding 1 kernel, head 3 (final_ln, lm_head, cross_entropy).
    plan = Planner(a100(1, tp=1, pp=1, dp=1, global_batch_size=1), detail=True).build()
    fwd = [t for t in _tasks(plan, "stage0", "compute") if t.name.startswith("F.")]
    assert len(fwd) == 1 + 4 * 12 + 3


def test_dp_all_reduce_moves_the_whole_gradient_once():
    # dp = 8 in one node, ZeRO 0: the gradient all-reduce moves 2(n-1)/n · 2P bytes per rank in total
    # (all buckets together) on NVLink: 1.75 · 7,498,752 = 13,122,816.
    plan = Planner(a100(8, tp=1, pp=1, dp=8)).build()
    dp = _tasks(plan, "stage0", "dp")
    assert {t.category for t in dp} == {"dp_comm"}
    assert sum(t.demands["stage0:nvl_tx"] for t in dp) == pytest.approx(2 * 7 / 8 * 2 * P_TOTAL)
    assert sum(t.demands["stage0:nvl_rx"] for t in dp) == pytest.approx(2 * 7 / 8 * 2 * P_TOTAL)
    assert all("stage0:nic_tx" not in t.demands for t in dp)


def test_small_buckets_split_the_gradient():
    # 1 MB buckets: the 7.5 MB gradient goes in several all-reduces; the total is unchanged.
    plan = Planner(a100(8, tp=1, pp=1, dp=8, gradient_bucket_mb=1.0)).build()
    dp = _tasks(plan, "stage0", "dp")
    assert len(dp) > 1
    assert sum(t.demands["stage0:nvl_tx"] for t in dp) == pytest.approx(2 * 7 / 8 * 2 * P_TOTAL)


def test_zero1_reduce_scatter_and_param_all_gather():
    # ZeRO-1, dp 8: gradients reduce-scattered once, (n-1)/n · 2P; updated weights all-gathered,
    # (n-1)/n · 2P (overlapped with the next step's start: issued first on the dp stream).
    plan = Planner(a100(8, tp=1, pp=1, dp=8, zero_stage=1)).build()
    dp = _tasks(plan, "stage0", "dp")
    rs = [t for t in dp if "reduce_scatter" in t.name]
    ag = [t for t in dp if "all_gather" in t.name]
    assert sum(t.demands["stage0:nvl_tx"] for t in rs) == pytest.approx(7 / 8 * 2 * P_TOTAL)
    assert sum(t.demands["stage0:nvl_tx"] for t in ag) == pytest.approx(7 / 8 * 2 * P_TOTAL)
    assert dp[0] in ag
    # the optimizer updates only its 1/8 shard: its duration is P/8 · 28 B / (2039 GB/s · 0.89) + 4 us
    opt = _tasks(plan, "stage0", "compute")[-1]
    assert opt.duration_s == pytest.approx(P_TOTAL / 8 * 28 / (2039e9 * 0.89) + 4e-6, rel=1e-12)


def test_optimizer_step_unsharded():
    plan = Planner(a100(8, tp=1, pp=1, dp=8)).build()
    opt = _tasks(plan, "stage0", "compute")[-1]
    assert opt.category == "optimizer"
    assert opt.duration_s == pytest.approx(P_TOTAL * 28 / (2039e9 * 0.89) + 4e-6, rel=1e-12)


def test_zero3_gathers_every_layer_twice_per_micro_batch():
    # ZeRO-3, dp 8, m = 2: each layer's weights are all-gathered for its forward and its backward of
    # each micro-batch: 2·2·4 = 16 gathers of (n-1)/n · 2·P_layer; the root's (embedding and head,
    # FSDP2's root fully_shard, not resharded after forward) once per forward: 2 gathers of
    # (n-1)/n · 2·(P_embed + P_head); gradients reduce-scattered every micro-batch: 2 · (n-1)/n · 2P.
    plan = Planner(a100(8, tp=1, pp=1, dp=8, zero_stage=3)).build()
    dp = _tasks(plan, "stage0", "dp")
    gathers = [t for t in dp if "zero3_gather" in t.name and ".L" in t.name]
    assert len(gathers) == 16
    assert all(t.demands["stage0:nvl_tx"] == pytest.approx(7 / 8 * 2 * P_LAYER) for t in gathers)
    root = [t for t in dp if "zero3_gather" in t.name and ".L" not in t.name]
    assert [t.name for t in root] == ["F.mb0.c0.embedding.zero3_gather", "F.mb1.c0.embedding.zero3_gather"]
    assert all(t.demands["stage0:nvl_tx"] == pytest.approx(7 / 8 * 2 * (P_EMBED + P_HEAD)) for t in root)
    rs = [t for t in dp if "reduce_scatter" in t.name]
    assert sum(t.demands["stage0:nvl_tx"] for t in rs) == pytest.approx(2 * 7 / 8 * 2 * P_TOTAL)


def test_zero3_fsdp2_copy_kernels_move_the_bytes_its_source_copies():
    # FSDP2 (torch 2.13 _fsdp_collectives.py): all_gather_copy_in copies this rank's shard (P/n) into
    # the all-gather input; split_with_sizes_copy copies the whole output (all n shards, P) into the
    # parameters; chunk_cat copies every unsharded gradient into the reduce-scatter input. FSDP1 /
    # Megatron-FSDP (zero_buffer_copies off): none of them.
    planner = Planner(a100(8, tp=1, pp=1, dp=8, zero_stage=3))
    plan = planner.build()
    copy_s = planner.compute_of(0).copy_s
    tasks = {t.name: t for stream in ("compute", "dp") for t in _tasks(plan, "stage0", stream)}
    assert tasks["F.mb0.c0.L1.zero3_copy_in"].duration_s == pytest.approx(copy_s(2 * P_LAYER / 8), rel=1e-12)
    assert tasks["F.mb0.c0.L1.zero3_copy_in"].stream == "dp"  # FSDP2's all-gather copy-in stream
    assert tasks["F.mb0.c0.L1.zero3_copy_out"].duration_s == pytest.approx(copy_s(2 * P_LAYER), rel=1e-12)
    assert tasks["F.mb0.c0.embedding.zero3_copy_out"].duration_s == pytest.approx(
        copy_s(2 * (P_EMBED + P_HEAD)), rel=1e-12)
    host = Planner(a100(8, tp=1, pp=1, dp=8, zero_stage=3, overlap_param_gather=False)).build()
    assert {t.name for t in _tasks(host, "stage0", "compute")} >= {"F.mb0.c0.L1.zero3_copy_in",
                                                                   "B.mb0.c0.L1.zero3_copy_in"}
    views = Planner(a100(8, tp=1, pp=1, dp=8, zero_stage=3, zero_buffer_copies=False)).build()
    assert not [t for s in ("compute", "dp") for t in _tasks(views, "stage0", s) if "copy" in t.name]


def test_zero3_fsdp1_copy_kernels_move_the_bytes_its_source_copies():
    # FSDP1 (torch fsdp/_flat_param.py, _runtime_utils.py; zero_buffer_copies: fsdp1): the shard's
    # low-precision cast before each gather (P/n, on the gather's stream, as FSDP2's copy-in), no copy-out
    # (the layer's parameters are views of the flat parameter); in the backward the views' gradients
    # concatenated into the flat gradient (split's backward: P in the parameters' dtype, compute stream),
    # then on the reduce stream the cast to the reduce dtype where it differs and the in-place predivide
    # (P in the reduce dtype), each reduce-scatter waiting for them.
    def planned(grad_dtype: str):
        par = dict(micro_batch_size=1, global_batch_size=16, tp=1, pp=1, dp=8, zero_stage=3, zero_buffer_copies="fsdp1")
        planner = Planner(load_scenario(dict(model=SMALL, cluster=dict(node="dgx-a100-80g", fabric="fat-tree", num_gpus=8),
                                             parallelism=par, training=dict(grad_dtype=grad_dtype, attention="standard"))))
        return planner, planner.build()

    planner, plan = planned("bf16")
    copy_s = planner.compute_of(0).copy_s
    tasks = {t.name: t for stream in ("compute", "dp") for t in _tasks(plan, "stage0", stream)}
    assert tasks["F.mb0.c0.L1.zero3_copy_in"].duration_s == pytest.approx(copy_s(2 * P_LAYER / 8), rel=1e-12)
    assert tasks["F.mb0.c0.L1.zero3_copy_in"].stream == "dp"
    assert not [n for n in tasks if "copy_out" in n or "grad_copy_in" in n]
    cats = [t for n, t in tasks.items() if n.endswith(".grad_cat")]
    divides = [t for n, t in tasks.items() if n.endswith(".grad_predivide")]
    rs = [t for t in _tasks(plan, "stage0", "dp") if "reduce_scatter" in t.name]
    assert len(cats) == len(divides) == len(rs) > 0
    assert all(t.stream == "compute" for t in cats) and all(t.stream == "dp" for t in divides)
    assert all(d in r.deps for d, r in zip(divides, rs, strict=True))
    # every gradient element once per micro-batch (2 micro-batches: gbs 16 over dp 8, mbs 1)
    total = sum(t.duration_s - planner.compute_of(0).launch_s for t in cats)
    assert total == pytest.approx(2 * 2 * 2 * P_TOTAL / planner.compute_of(0).mem_bw, rel=1e-9)
    assert [t.duration_s for t in divides] == pytest.approx([t.duration_s for t in cats], rel=1e-12)
    # fp32 reduction (Composer's mixed_precision DEFAULT from 0.16.4): the cast (read 2 B, write 4 B) and a
    # 4-byte predivide on the reduce stream; the concatenation stays in bf16
    planner32, plan32 = planned("fp32")
    t32 = {t.name: t for stream in ("compute", "dp") for t in _tasks(plan32, "stage0", stream)}
    name = next(n for n in t32 if n.endswith(".grad_predivide"))
    cat = t32[name.replace("grad_predivide", "grad_cat")]
    launch, bw = planner32.compute_of(0).launch_s, planner32.compute_of(0).mem_bw
    elements = (cat.duration_s - launch) * bw / 4  # bf16: read + write 2 B
    assert t32[name].duration_s == pytest.approx(2 * launch + elements * (2 + 4 + 8) / bw, rel=1e-9)


def test_zero3_gathers_prefetch_one_layer_ahead_or_block():
    # Prefetched (default), a layer's gather waits for the layer two back (overlapping the one
    # before); with overlap_param_gather off (FSDP2 over gloo: host-blocking collectives) it waits
    # for the layer just before, and the step grows by the gathers it no longer hides.
    from simulator.simulate import simulate

    def gathers(sc):
        plan = Planner(sc).build()
        return [t for t in _tasks(plan, "stage0", "dp") if "zero3_gather" in t.name and ".L" in t.name]

    def issue_deps(gather):
        # FSDP2's copy-in of the local shard runs first (its own stream when prefetched, the host
        # when blocking); the gather waits for it and for the issue point, as the copy-in does
        (copy_in,) = [d for d in gather.deps if d.name.endswith("zero3_copy_in")]
        assert copy_in.name == gather.name.replace("zero3_gather", "zero3_copy_in")
        rest = [d.name for d in gather.deps if d is not copy_in]
        assert all(name in [d.name for d in copy_in.deps] for name in rest)
        return rest

    prefetched = gathers(a100(8, tp=1, pp=1, dp=8, zero_stage=3))
    blocking = gathers(a100(8, tp=1, pp=1, dp=8, zero_stage=3, overlap_param_gather=False))
    assert [t.name for t in prefetched] == [t.name for t in blocking]
    assert issue_deps(prefetched[2]) == ["F.mb0.c0.L0"]
    assert prefetched[2].deps[0].stream == "dp" and blocking[2].deps[0].stream == "compute"
    assert issue_deps(blocking[2]) == ["F.mb0.c0.L1"]
    assert issue_deps(prefetched[0]) == [] and issue_deps(blocking[0]) == []
    fast = simulate(a100(8, tp=1, pp=1, dp=8, zero_stage=3))
    slow = simulate(a100(8, tp=1, pp=1, dp=8, zero_stage=3, overlap_param_gather=False))
    assert slow.step_time_s > fast.step_time_s
    assert slow.time_breakdown_s["dp_comm"] > fast.time_breakdown_s["dp_comm"]


def test_zero3_backward_gather_queues_before_the_reduce_scatter_of_the_layer_just_done():
    # FSDP's backward prefetch (BACKWARD_PRE; FSDP2 and Megatron-FSDP alike): layer l-1's all-gather is
    # issued when layer l's backward starts, ahead of layer l's gradient reduce-scatter, on the one
    # communicator. Queued behind it, every gather waited for the previous layer's reduce-scatter and
    # the backward ran serially with its collectives.
    plan = Planner(a100(8, tp=1, pp=1, dp=8, zero_stage=3, gradient_bucket_mb=0.1)).build()
    names = [t.name for t in _tasks(plan, "stage0", "dp")]
    for mb in range(2):
        for layer in (3, 2, 1):
            gather = names.index(f"B.mb{mb}.c0.L{layer - 1}.zero3_gather")
            reduce = next(i for i, n in enumerate(names) if n.startswith(f"B.mb{mb}.c0.L{layer}.")
                          and "reduce_scatter" in n)
            assert gather < reduce


def test_zero3_backward_prefetch_post_waits_for_the_layer_just_done():
    # BACKWARD_POST (Composer's default): layer l-1's gather starts when layer l's backward ends (still
    # ahead of layer l's reduce-scatter); BACKWARD_PRE: when layer l+1's ends. Forward gathers alike.
    def deps(**par):
        plan = Planner(a100(8, tp=1, pp=1, dp=8, zero_stage=3, **par)).build()
        by_name = {t.name: t for t in _tasks(plan, "stage0", "dp")}
        return {name: [d.name for d in by_name[name].deps if not d.name.endswith("zero3_copy_in")]
                for name in ("B.mb0.c0.L1.zero3_gather", "F.mb0.c0.L2.zero3_gather")}

    assert deps() == {"B.mb0.c0.L1.zero3_gather": ["B.mb0.c0.L3"], "F.mb0.c0.L2.zero3_gather": ["F.mb0.c0.L0"]}
    assert deps(zero3_backward_prefetch="post") == {"B.mb0.c0.L1.zero3_gather": ["B.mb0.c0.L2"],
                                                    "F.mb0.c0.L2.zero3_gather": ["F.mb0.c0.L0"]}


def test_zero3_collectives_shorter_than_the_layers_hide_behind_them():
    # Buffers as views (Megatron-FSDP, FSDP1's FlatParameter: no copy kernels): with every layer's
    # gather and reduce-scatter shorter than its kernels (s = 2048 makes the layers compute-bound),
    # the backward's layer kernels run back to back after the first, and the copy kernels are gone.
    from simulator.simulate import simulate

    model = {**SMALL, "seq_length": 2048}
    r = simulate(a100(8, model, tp=1, pp=1, dp=8, zero_stage=3, zero_buffer_copies=False,
                      gradient_bucket_mb=0.1))
    kernels = [e for e in r.timeline if e.stream == "compute"]
    assert not any("copy" in e.name for e in kernels)
    backward = [e for e in kernels if e.name.startswith("B.mb1.c0.L")]
    assert [e.name for e in backward] == [f"B.mb1.c0.L{i}" for i in (3, 2, 1, 0)]
    for before, after in zip(backward, backward[1:], strict=False):
        assert after.start_s == pytest.approx(before.end_s, abs=1e-12)
    copies = simulate(a100(8, model, tp=1, pp=1, dp=8, zero_stage=3, gradient_bucket_mb=0.1))
    assert any("zero3_copy_out" in e.name for e in copies.timeline)
    assert any("grad_copy_in" in e.name for e in copies.timeline)
    assert copies.step_time_s > r.step_time_s


def test_pipeline_sends_between_nodes():
    # tp 2, pp 2, dp 4 on 2 nodes: stage 0 (rank 0, node 0) sends each micro-batch's activation to
    # stage 1 (rank 8, node 1) over the NICs; Megatron's scatter/gather sends b·s·h·2 / tp = 65,536 B.
    # m = 16 / 4 = 4: four activations forward, four gradients back.
    plan = Planner(a100(16, tp=2, pp=2, dp=4)).build()
    sends0 = _tasks(plan, "stage0", "pp")
    sends1 = _tasks(plan, "stage1", "pp")
    assert [t.name for t in sends0] == [f"send_act.mb{m}.c0" for m in range(4)]
    assert [t.name for t in sends1] == [f"send_grad.mb{m}.c1" for m in range(4)]
    assert sends0[0].demands == {"stage0:nic_tx": ACT / 2, "stage1:nic_rx": ACT / 2}
    assert sends0[0].category == "pp_comm"
    # inter-node latency: NIC 5 us + 3-tier fat tree (2·3 - 1 = 5 switch hops) x 0.6 us = 8 us
    assert sends0[0].latency_s == pytest.approx(8e-6, rel=1e-12)


def test_pipeline_sends_inside_a_node_use_nvlink():
    plan = Planner(a100(8, tp=1, pp=2, dp=4)).build()
    send = _tasks(plan, "stage0", "pp")[0]
    assert send.demands == {"stage0:nvl_tx": ACT, "stage1:nvl_rx": ACT}
    assert send.latency_s == pytest.approx(3e-6, rel=1e-12)


def test_tp_forward_comm_bytes_per_pass():
    # tp 2, pp 1: per forward pass, 2 all-reduces per layer + 1 for the embedding, each of bus
    # 2·(2-1)/2 · ACT = ACT bytes -> (2·4 + 1)·ACT on NVLink; full mode (TP not folded). The
    # vocab-parallel cross-entropy adds 3 fp32 all-reduces of one value per token (s = 256).
    plan = Planner(a100(2, tp=2, pp=1, dp=1, global_batch_size=2), mode="full").build()
    fwd = [t for t in _tasks(plan, "rank0", "tp") if t.name.startswith("F.mb0")]
    assert len(fwd) == 1
    assert fwd[0].demands["rank0:nvl_tx"] == pytest.approx(9 * ACT + 3 * 256 * 4)
    # ring latency in one node: 2(n-1) = 2 steps of 3 us per all-reduce, 9 + 3 all-reduces
    assert fwd[0].latency_s == pytest.approx(12 * 2 * 3e-6, rel=1e-12)


def test_full_mode_collectives_rendezvous_over_their_group():
    plan = Planner(a100(16, tp=2, pp=2, dp=4), mode="full").build()
    tp = _tasks(plan, "rank1", "tp")
    assert tp and all(t.rendezvous_size == 2 and t.rendezvous.endswith("@0") for t in tp)
    dp = _tasks(plan, "rank1", "dp")
    assert dp and all(t.rendezvous_size == 4 and t.rendezvous.endswith("@1") for t in dp)  # dp group 1,3,5,7
    # symmetric mode: a single simulated member, no rendezvous
    sym = Planner(a100(16, tp=2, pp=2, dp=4)).build()
    assert all(t.rendezvous is None for ts in sym.streams.values() for t in ts)


def test_tp_links_exclusive_decision():
    # TP in a node with dp = 1 and pipeline stages on separate nodes: TP folds into the kernels.
    assert Planner(a100(16, tp=8, pp=2, dp=1)).tp_exclusive is True
    # DP members share the node's NVLink: not exclusive.
    assert Planner(a100(16, tp=2, pp=2, dp=4)).tp_exclusive is False
    # tp = 1: nothing to share.
    assert Planner(a100(8, tp=1, pp=1, dp=8)).tp_exclusive is True
    # full mode never folds
    assert Planner(a100(16, tp=8, pp=2, dp=1), mode="full").tp_exclusive is False


def test_tied_embedding_gradient_all_reduce_between_first_and_last_stage():
    # Tied embeddings with pp 2: stage 0 and stage 1 each hold a copy of the V·h table; after the
    # backward they all-reduce its gradient over the 2-member embedding group: bus 2·1/2 · V·h·2 / tp.
    model = dict(SMALL, tied_embeddings=True)
    plan = Planner(a100(16, model=model, tp=2, pp=2, dp=4)).build()
    for actor in ("stage0", "stage1"):
        emb = [t for t in _tasks(plan, actor, "dp") if t.name == "embedding_grad_all_reduce"]
        assert len(emb) == 1
        # ranks 0 and 8 are on different nodes: NIC bytes = bus / g (g = 1)
        assert emb[0].demands[f"{actor}:nic_tx"] == pytest.approx(1024 * 256 * 2 / 2)


def test_interleaved_chunks_and_cross_stage_links():
    # pp 2, v 2: 4 chunks of 1 layer; stage 0 holds chunks 0 and 2, stage 1 chunks 1 and 3.
    plan = Planner(a100(8, tp=1, pp=2, dp=4, schedule="interleaved", virtual_stages=2)).build()
    assert plan.layers_per_chunk == [1, 1, 1, 1]
    names0 = {t.name for t in _tasks(plan, "stage0", "compute")}
    assert {"F.mb0.c0", "F.mb0.c2", "B.mb0.c0", "B.mb0.c2"} <= names0
    # stage 0 sends activations of chunks 0 and 2 except the last chunk (3 is on stage 1): c0 and c2
    sends = [t.name for t in _tasks(plan, "stage0", "pp")]
    assert "send_act.mb0.c0" in sends and "send_act.mb0.c2" in sends
    assert "send_grad.mb0.c2" in sends  # chunk 2's input gradient goes back to chunk 1 on stage 1


def test_stage_params_with_tp():
    # tp 2, pp 2, split the Megatron way (the layer graph's count, the same as memory's): a layer
    # holds its 12h² matrices, QKV and FC1 biases (3h + 4h) ÷2, and replicated the attention-out
    # and FC2 biases (2h) and its two layer norms (4h): 393,216 + 896 + 1,536 = 395,648.
    # Stage 0: 2 layers + the word embedding ÷2 (131,072) + learned positions (65,536) = 987,904;
    # stage 1: 2 layers + final norm (512) + head ÷2 (131,072) = 922,880.
    pl = Planner(a100(16, tp=2, pp=2, dp=4))
    assert pl.stage_params_local(0) == pytest.approx(987_904)
    assert pl.stage_params_local(1) == pytest.approx(922_880)


def test_ddp_bucket_copies_as_pytorch_ddps_reducer_runs_them():
    # PyTorch DDP (ddp_bucket_copies: true, gradient_as_bucket_view false): every bucket's gradients copied in
    # (divided by the world size, reducer::mul_out) on the compute stream before its all-reduce, and copied back
    # (copy_bucket_to_grad) by finalize_backward: on the compute stream after the backward, each once its
    # all-reduce is done, before the optimizer step; bucket_view: the in-place divide alone; false (the
    # default, Megatron-Core's grad buffer): neither.
    def planned(copies):
        planner = Planner(a100(8, tp=1, pp=1, dp=8, zero_stage=0,
                               **({} if copies is None else {"ddp_bucket_copies": copies})))
        return planner, planner.build()

    planner, plan = planned(True)
    copy_s = planner.compute_of(0).copy_s
    compute = _tasks(plan, "stage0", "compute")
    into = [t for t in compute if t.name.endswith(".ddp_bucket_in")]
    back = [t for t in compute if t.name.startswith("ddp_bucket_to_grad")]
    reduces = [t for t in _tasks(plan, "stage0", "dp") if "grad_all_reduce" in t.name]
    assert into and len(into) == len(back) == len(reduces)
    bytes_ = [r.demands["stage0:nvl_tx"] * 8 / (2 * 7) for r in reduces]  # ring all-reduce: 2 (n-1)/n of the bucket
    assert sum(t.duration_s for t in into) == pytest.approx(sum(copy_s(b) for b in bytes_), rel=1e-9)
    assert [t.duration_s for t in back] == pytest.approx([copy_s(b) for b in bytes_], rel=1e-9)
    assert all(r in b.deps for r, b in zip(reduces, back, strict=True))
    last_backward = max(i for i, t in enumerate(compute) if t.name.startswith("B."))
    opt = next(i for i, t in enumerate(compute) if t.category == "optimizer")
    assert all(last_backward < compute.index(b) < opt for b in back)
    _, view = planned("bucket_view")
    names = [t.name for t in _tasks(view, "stage0", "compute")]
    assert any(n.endswith(".ddp_bucket_in") for n in names) and not any("ddp_bucket_to_grad" in n for n in names)
    for default in (planned(None)[1], planned(False)[1]):
        assert not [t for s in ("compute", "dp") for t in _tasks(default, "stage0", s) if "ddp_bucket" in t.name]
