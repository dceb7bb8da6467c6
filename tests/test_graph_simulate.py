"""Any layer graph runs through the spmd planner and memory: exact step times on a toy chain of
linear layers (tests/graph_models.py) on the toy cluster of test_simulate.py.

Each layer is one GEMM of M = 256·b rows, N = 256, K = its width. On the toy accelerator every
GEMM of >= 0.008 GFLOP runs at E = 5e11 FLOP/s, memory traffic and the optimizer stream at
~1e21 B/s (their times are ~1e-13 s), no launch overhead. A 256 x 256 x 256 GEMM is
2·256³ = 33,554,432 FLOP: c = 67.108864 us forward, 2c backward (dgrad + wgrad).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import pytest
from graph_models import ChainSpec
from hypothesis import given, settings
from hypothesis import strategies as st
from test_simulate import E, toy

from simulator.errors import ConfigError
from simulator.memory.analytic import rank_memory
from simulator.simulate import simulate
from simulator.strategies.spmd.layout import Parallelism, resolve_layout
from simulator.strategies.spmd.plan import Planner
from simulator.strategies.spmd.split import balanced_split
from workloads.layer_graph import Layer, LayerGraph

C = 2 * 256**3 / E  # one 256-wide layer's forward, seconds


def chain_scenario(num_gpus: int, model: ChainSpec | None = None, nvl_gb_per_s: float = 1e12,
                   nvl_latency_us: float = 0.0, **parallelism):
    """The toy cluster running ``model`` (a chain graph) instead of the toy GPT."""
    base = toy(num_gpus, nvl_gb_per_s=nvl_gb_per_s, nvl_latency_us=nvl_latency_us, dp=num_gpus,
               global_batch_size=num_gpus)
    model = model or ChainSpec()
    par = dict(micro_batch_size=1, global_batch_size=1)
    par.update(parallelism)
    return replace(base, model=model, name=model.name, parallelism=resolve_layout(Parallelism(**par), model, num_gpus))


def test_single_gpu_chain_step_is_forward_plus_backward():
    r = simulate(chain_scenario(1, global_batch_size=3))
    assert r.step_time_s == pytest.approx(3 * 3 * 2 * C, rel=1e-9)
    assert r.num_parameters == 2 * 256 * 256
    assert r.tokens_per_step is None and r.tokens_per_s is None
    assert r.samples_per_s == pytest.approx(3 / r.step_time_s)
    # Model FLOPs: forward + backward of both GEMMs per sample, counted from the ops.
    assert r.model_flops_per_step == pytest.approx(3 * 3 * 2 * 2 * 256**3)
    d = r.to_dict()
    assert d["sample"] == "image" and d["samples_per_s"] == pytest.approx(r.samples_per_s)


@pytest.mark.parametrize("overlap", [False, True])
def test_data_parallel_two_ranks_one_bucket(overlap):
    # dp 2 in a node, NVLink 100 GB/s with 1 us latency; the 2·65,536 bf16 gradients (262,144 B)
    # fit one 25 MB bucket, all-reduced once after the last backward (with overlap the bucket
    # only fills then too): t = 2(n-1)·1 us + 2(n-1)/n · 262,144 B / 1e11 B/s = 2 us + 2.62144 us.
    t_dp = 2e-6 + 262_144 / 100e9
    r = simulate(chain_scenario(2, nvl_gb_per_s=100, nvl_latency_us=1, dp=2, global_batch_size=2,
                                overlap_grad_reduce=overlap))
    assert r.step_time_s == pytest.approx(3 * 2 * C + t_dp, rel=1e-9)
    assert r.time_breakdown_s["dp_comm"] == pytest.approx(t_dp, rel=1e-6)


def test_pipeline_two_stages_gpipe_two_micro_batches():
    # pp 2, one layer per stage (f = c, b = 2c), m = 2, sends ~free: GPipe takes (m + p - 1)(f + b) = 9c.
    r = simulate(chain_scenario(2, pp=2, global_batch_size=2, schedule="gpipe"))
    assert r.layer_split == [1, 1]
    assert r.step_time_s == pytest.approx(9 * C, rel=1e-9)


UNEVEN = ChainSpec(name="uneven", widths=(256, 256, 256, 768))  # costs c, c, c, 3c


def test_balanced_split_of_uneven_layers():
    # Even: [2, 2] -> stage loads 2c and 4c forward. GPipe, m = 2: stage 1's forwards end at 2c+4c+4c
    # = 10c, its two backwards (8c each) at 18c and 26c, stage 0's (4c) follow each: 30c.
    even = simulate(chain_scenario(2, UNEVEN, pp=2, global_batch_size=2, schedule="gpipe"))
    assert even.layer_split == [2, 2]
    assert even.step_time_s == pytest.approx(30 * C, rel=1e-9)
    # Balanced: [3, 1] -> 3c and 3c: (m + p - 1)·(3c + 6c) = 27c.
    balanced = simulate(chain_scenario(2, UNEVEN, pp=2, global_batch_size=2, schedule="gpipe", pp_split="balanced"))
    assert balanced.layer_split == [3, 1]
    assert balanced.step_time_s == pytest.approx(27 * C, rel=1e-9)


def test_balanced_split_minimises_the_largest_chunk():
    assert balanced_split([1, 1, 1, 3], 2) == [3, 1]
    assert balanced_split([5, 1, 1, 1, 1, 1], 2) == [1, 5]
    assert balanced_split([1, 1, 1, 1], 2, first_extra=2) == [1, 3]
    assert balanced_split([1.0] * 7, 7) == [1] * 7
    with pytest.raises(ConfigError, match="parallelism.pp"):
        balanced_split([1, 1], 3)
    # the greedy's running sum (0.7 + 0.249 + 0.898 + 0.3) rounds an ulp above the bisection's total
    assert balanced_split([0.249, 0.898], 1, first_extra=0.7, last_extra=0.3) == [2]


def test_balanced_split_keeps_the_even_split_where_it_is_optimal():
    # identical layers, ends lighter than a layer (GPT-3's): the even cut, settled without the bisection
    assert balanced_split([1.0] * 12, 4, 0.3, 0.4, prefer=[3, 3, 3, 3]) == [3, 3, 3, 3]
    # a cut cheaper than the even one by more than 1e-9 is taken
    assert balanced_split([1.0] * 11 + [3.0], 4, prefer=[3, 3, 3, 3]) == [4, 4, 3, 1]
    # a cheaper cut only within 1e-9 keeps the even one
    assert balanced_split([1.0] * 11 + [1.0 + 1e-10], 4, prefer=[3, 3, 3, 3]) == [3, 3, 3, 3]


def test_recompute_full_reruns_the_forward():
    # One more forward per layer before its backward: 4c per layer per micro-batch.
    r = simulate(chain_scenario(1, recompute="full"))
    assert r.step_time_s == pytest.approx(2 * 4 * C, rel=1e-9)
    assert r.time_breakdown_s["recompute"] == pytest.approx(2 * C, rel=1e-9)
    assert r.hardware_flops_per_step == pytest.approx(r.model_flops_per_step * 4 / 3)


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_zero_stages_run_and_shard_the_model_states(zero):
    sc = chain_scenario(4, dp=4, global_batch_size=4, zero_stage=zero)
    r = simulate(sc)
    assert r.step_time_s > 3 * 2 * C
    replicated = rank_memory(chain_scenario(4, dp=4, global_batch_size=4), 0)
    sharded = rank_memory(sc, 0)
    assert sharded.optimizer_bytes == pytest.approx(replicated.optimizer_bytes / 4)
    assert (sharded.weights_bytes < replicated.weights_bytes) == (zero == 3)


def test_activation_memory_is_read_off_the_graph():
    # 1F1B, pp 1, one micro-batch in flight: the saved inputs of both layers, M·K·2 bytes each;
    # full recompute keeps each layer's input (its predecessor's output; the first layer its own).
    none = rank_memory(chain_scenario(1), 0)
    assert none.activations_bytes == 2 * 256 * 256 * 2
    full = rank_memory(chain_scenario(1, recompute="full"), 0)
    assert full.activations_bytes == 2 * 256 * 256 * 2  # here the inputs are all that is saved


def test_tensor_parallel_is_refused_for_layers_without_a_tp_split():
    # A chain of linears splits column/row (tests/test_graph_tensor_parallel.py); a convolution
    # past the stem has no TP split: the error names it.
    with pytest.raises(ConfigError, match=r"parallelism.tp.*conv2d layers.*'fc1'"):
        chain_scenario(2, ChainSpec(kind="conv2d"), tp=2)


def test_tensor_parallel_is_refused_for_a_builder_that_does_not_split():
    @dataclass(frozen=True)
    class Unsplit(ChainSpec):
        def layer_graph(self, shard):
            return super().layer_graph(replace(shard, tp=1))

    with pytest.raises(ConfigError, match=r"parallelism.tp.*does not split layers"):
        chain_scenario(2, Unsplit(), tp=2)


def test_context_parallel_needs_a_sequence():
    with pytest.raises(ConfigError, match="parallelism.cp"):
        chain_scenario(2, cp=2)


def test_more_stages_than_layers_is_refused():
    with pytest.raises(ConfigError, match="exceeds the model's 2 layers"):
        chain_scenario(4, pp=4, global_batch_size=4)


@dataclass(frozen=True)
class ResidualSpec:
    """fc0 -> fc1 -> add(fc0, fc1) -> fc2: a skip connection over fc1."""

    name: str = "residual"
    seq_length: int | None = None
    sample: str = "image"

    def layer_graph(self, shard):
        chain = ChainSpec(widths=(256, 256, 256)).layer_graph(shard).layers
        fc0, fc1, fc2 = chain
        add = Layer("add", "add", output_bytes=fc1.output_bytes, inputs=("fc0", "fc1"))
        return LayerGraph(self.name, (fc0, fc1, add, replace(fc2, inputs=("add",))), shard.micro_batch,
                          sample="image").check()


def test_pipeline_sends_every_tensor_that_crosses_the_cut():
    # pp 2 even split of 4 layers cuts after fc1: fc1's output and the skip tensor (fc0's output)
    # both cross, 256·256·2 bytes each.
    planner = Planner(chain_scenario(2, ResidualSpec(), pp=2, global_batch_size=2))
    assert planner.layers_per_chunk == [2, 2]
    assert planner._pp_payload(0) == 2 * 256 * 256 * 2
    # 1F1B, m = 2; stage 0 (fc0, fc1): f = 2c, b = 4c; stage 1 (add: free, fc2): f = c, b = 2c.
    # Stage 0 forwards 0-2c, 2c-4c; stage 1: F1 2c-3c, B1 3c-5c, F2 5c-6c, B2 6c-8c; stage 0's
    # backwards follow: B1 5c-9c, B2 9c-13c.
    r = simulate(chain_scenario(2, ResidualSpec(), pp=2, global_batch_size=2))
    assert r.step_time_s == pytest.approx(13 * C, rel=1e-9)


def test_ddp_buckets_fill_in_backward_order_and_hide_behind_the_rest_of_the_backward():
    # Four 256-wide layers (131,072 bytes of bf16 gradients each), dp 2, 0.25 MB buckets: the
    # backward of fc3 and fc2 fills the first bucket (262,144 >= 250,000 bytes), whose all-reduce
    # (2 us + 262,144 B / 1e11 B/s = 4.62144 us) runs beside fc1's and fc0's backward (4c); the
    # second bucket is reduced after fc0 and stays exposed: step = 4c + 8c + 4.62144 us.
    t_bucket = 2e-6 + 262_144 / 100e9
    four = ChainSpec(name="four", widths=(256,) * 4)
    r = simulate(chain_scenario(2, four, nvl_gb_per_s=100, nvl_latency_us=1, dp=2, global_batch_size=2,
                                gradient_bucket_mb=0.25))
    assert r.step_time_s == pytest.approx(12 * C + t_bucket, rel=1e-9)
    assert r.time_breakdown_s["dp_comm"] == pytest.approx(t_bucket, rel=1e-6)
    # Without overlap one all-reduce of all 524,288 bytes follows the backward: 2 us + 5.24288 us.
    r = simulate(chain_scenario(2, four, nvl_gb_per_s=100, nvl_latency_us=1, dp=2, global_batch_size=2,
                                gradient_bucket_mb=0.25, overlap_grad_reduce=False))
    assert r.step_time_s == pytest.approx(12 * C + 2e-6 + 524_288 / 100e9, rel=1e-9)


def _best_max_load(costs, chunks, first, last):
    """The smallest largest chunk load over every contiguous split (brute force, for small inputs)."""
    n = len(costs)
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), chunks - 1):
        bounds = (0, *cuts, n)
        loads = [sum(costs[a:b]) for a, b in itertools.pairwise(bounds)]
        loads[0] += first
        loads[-1] += last
        best = min(best, max(loads))
    return best


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 20), min_size=1, max_size=9), st.integers(1, 4), st.integers(0, 10),
       st.integers(0, 10))
def test_balanced_split_is_optimal(costs, chunks, first, last):
    if chunks > len(costs):
        return
    counts = balanced_split([float(c) for c in costs], chunks, first, last)
    assert len(counts) == chunks and sum(counts) == len(costs) and min(counts) >= 1
    starts = [sum(counts[:i]) for i in range(chunks)]
    loads = [sum(costs[s:s + c]) for s, c in zip(starts, counts, strict=True)]
    loads[0] += first
    loads[-1] += last
    assert max(loads) == pytest.approx(_best_max_load(costs, chunks, first, last), rel=1e-9)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.sampled_from([256, 512, 768]), min_size=2, max_size=5), st.sampled_from(["gpipe", "1f1b"]),
       st.sampled_from(["even", "balanced"]), st.sampled_from(["none", "full"]))
def test_any_chain_pipeline_step_adds_up(widths, schedule, split, recompute):
    model = ChainSpec(name="any", widths=tuple(widths))
    r = simulate(chain_scenario(2, model, pp=2, global_batch_size=4, schedule=schedule, pp_split=split,
                                recompute=recompute))
    assert sum(r.time_breakdown_s.values()) == pytest.approx(r.step_time_s, rel=1e-9)
    # Never faster than the busiest stage's own work: 4 micro-batches of (1 or 2 forwards + 2) per layer.
    per_layer = [w / 256 * C * (3 + (recompute == "full")) for w in widths]
    stage_work = [sum(per_layer[:r.layer_split[0]]), sum(per_layer[r.layer_split[0]:])]
    assert r.step_time_s >= 4 * max(stage_work) * (1 - 1e-9)
