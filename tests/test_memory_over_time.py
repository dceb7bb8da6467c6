"""Memory over time: the engine's counters (simulator/engine/engine.py) and the spmd planner's
allocations (activations saved at a chunk's forward and freed at its backward, gradients from a
chunk's first backward to the optimizer step, weights/optimizer state/buffers held throughout).

The simulated peak equals the analytic peak (simulator/memory/analytic.py) exactly where both
count the same way: GPipe and 1F1B (the peak is at the first backward, with every micro-batch in
flight and the gradients just allocated), with or without recompute, ZeRO-3, tensor + sequence
parallel, and interleaved 1F1B (each chunk's own micro-batches in flight at the state before a backward
that holds the most bytes, and every chunk's gradients from the rank's first backward).

Model ("small", tests/test_plan.py): GPT, 4 layers, h = 256, a = 8, s = 256, V = 1024, b = 1, bf16.
"""

from __future__ import annotations

import dataclasses

import pytest
from test_plan import P_TOTAL, SMALL, a100

from simulator.engine.engine import Engine, Task
from simulator.simulate import simulate

# Activations of one micro-batch through the whole model (Korthikanti 2022 Sec. 4, no recompute):
# a layer s·b·h·(34 + 5·a·s/h) = 65,536 · 74; the embedding-dropout mask s·b·h; the last stage's
# final-norm and head inputs 2·2·s·b·h and the logits 6·s·b·V (2-byte logits + fp32 softmax copy).
LAYER_ACT = 256 * 256 * (34 + 5 * 8 * 256 // 256)
EMBED_ACT = 256 * 256
HEAD_ACT = 4 * 256 * 256 + 6 * 256 * 1024
MODEL_ACT = 4 * LAYER_ACT + EMBED_ACT + HEAD_ACT
# Model states on one GPU (no ZeRO, bf16 gradients): weights 2P, gradients 2P, Adam 12P; buffers:
# two 25 MB gradient buckets (2 · 25 MiB).
WEIGHTS, GRADS, OPTIMIZER = 2 * P_TOTAL, 2 * P_TOTAL, 12 * P_TOTAL
BUCKETS = 2 * 25 * 2**20
GIB = 2**30


def with_steps(scenario, steps: int):
    return dataclasses.replace(scenario, simulation=scenario.simulation.model_copy(update={"steps": steps}))


def test_engine_counts_allocations_and_frees_per_actor():
    # a: [0, 2) allocates 5 and frees 1 at its end; b: [2, 3) allocates 2 and frees 6 at its end.
    # Memory of "x" (start 10): 15 at 0, 14 + 2 = 16 at 2, 10 at 3. Actor "y" is untouched by x's tasks.
    a = Task("a", "x", "compute", "compute", duration_s=2.0, alloc_bytes=5.0, free_bytes=1.0)
    b = Task("b", "x", "compute", "compute", duration_s=1.0, alloc_bytes=2.0, free_bytes=6.0, deps=[a])
    c = Task("c", "y", "compute", "compute", duration_s=1.0, alloc_bytes=3.0)
    engine = Engine(lambda port: 1.0)
    engine.run({("x", "compute"): [a, b], ("y", "compute"): [c]}, {("x", "memory"): 10.0})
    assert engine.counter_series[("x", "memory")] == [(0.0, 15.0), (2.0, 16.0), (3.0, 10.0)]
    assert engine.counter_peaks[("x", "memory")] == 16.0
    assert engine.counter_peaks[("y", "memory")] == 3.0


def test_single_gpu_peak_by_hand():
    # pp = 1, m = 2 (1F1B: F0 B0 F1 B1): one micro-batch in flight; at B0's start the gradients are
    # allocated beside its activations; after the optimizer step only weights, state and buckets remain.
    r = simulate(a100(1, tp=1, pp=1, dp=1, global_batch_size=2))
    base = WEIGHTS + OPTIMIZER + BUCKETS
    assert r.simulated_peak_memory_gib["stage0"] * GIB == pytest.approx(base + MODEL_ACT + GRADS, rel=1e-12)
    assert r.peak_memory_gib * GIB == pytest.approx(base + MODEL_ACT + GRADS, rel=1e-12)
    series = r.memory_series_bytes["stage0"]  # one point per instant: at 0, F0 has saved its activations
    assert series[0] == (0.0, pytest.approx(base + MODEL_ACT)) and series[-1][1] == pytest.approx(base)
    assert max(v for _, v in series) == pytest.approx(base + MODEL_ACT + GRADS)


def test_gpipe_single_gpu_holds_every_micro_batch():
    # GPipe, m = 4: all four forwards run before the first backward.
    r = simulate(a100(1, tp=1, pp=1, dp=1, global_batch_size=4, schedule="gpipe"))
    assert r.simulated_peak_memory_gib["stage0"] * GIB == pytest.approx(
        WEIGHTS + OPTIMIZER + BUCKETS + 4 * MODEL_ACT + GRADS, rel=1e-12)


EXACT = [
    dict(pp=2, schedule="1f1b"),
    dict(pp=2, schedule="gpipe"),
    dict(pp=4, schedule="1f1b", global_batch_size=8),
    dict(pp=4, schedule="gpipe", global_batch_size=8),
    dict(pp=2, schedule="1f1b", recompute="full"),
    dict(pp=2, schedule="gpipe", recompute="selective"),
    dict(pp=1, dp=8, zero_stage=3),
    dict(pp=2, tp=2, dp=2, zero_stage=1, sequence_parallel=True, recompute="selective"),
]


@pytest.mark.parametrize("par", EXACT)
@pytest.mark.parametrize("steps", [1, 3])
def test_simulated_peak_equals_the_analytic_peak(par, steps):
    kw = {"tp": 1, "dp": 1, **par}
    r = simulate(with_steps(a100(kw["tp"] * kw["pp"] * kw["dp"], **kw), steps))
    simulated = [r.simulated_peak_memory_gib[f"stage{i}"] for i in range(kw["pp"])]
    assert simulated == pytest.approx(r.memory_per_stage_gib, rel=1e-12)


def test_interleaved_peak_equals_the_analytic_peak():
    r = simulate(a100(2, tp=1, pp=2, dp=1, schedule="interleaved", virtual_stages=2))
    simulated = [r.simulated_peak_memory_gib[f"stage{i}"] for i in range(2)]
    assert simulated == pytest.approx(r.memory_per_stage_gib, rel=1e-12)


# Interleaved 1F1B with v = 3 and 4 chunks, counted by hand (Narayanan et al. 2021 Sec. 2.2.2;
# Megatron-LM's get_num_warmup_microbatches): rank i runs W_i = 2(p - i - 1) + (v - 1)p warm-up
# forwards (all m·v first when W_i >= m·v), then forward W_i + j before backward j. Forward k runs
# local chunk (k mod p·v) // p, backward k chunk v - 1 - (k mod p·v) // p. Just before its first
# backward rank i holds N_i = min(W_i + 1, m·v) chunk-micro-batches; in the steady state each
# backward frees one and the next forward adds one, so with equal chunks the layers held stay
# N_i chunks' worth. What moves is which chunks: rank 0's chunk 0 also keeps the embedding's
# dropout mask, and its count peaks at E once a new round's forwards run on chunk 0 before any
# chunk-0 backward (those come last in each round); rank p-1's chunk v-1 keeps the head, 1 at its
# first backward and never more after it (its backwards come first). By hand:
#   p v m | W_i             | N_i          | E (rank 0)                                  | H
#   2 3 2 | 6, 4            | 6, 5         | 2 (all forwards first: c0 c0 c1 c1 c2 c2)   | 1
#   2 3 4 | 6, 4            | 7, 5         | 4 (before B1: F0..F7 = c0 c0 c1 c1 c2 c2 c0 c0, B0 = c2) | 1
#   2 4 2 | 8, 6            | 8, 7         | 2 (all forwards first)                      | 1
#   2 4 4 | 8, 6            | 9, 7         | 4 (before B1: 10 forwards, 4 on c0; c0's first backward is B6) | 1
#   4 3 8 | 14, 12, 10, 8   | 15, 13, 11, 9 | 8 (before B1: 16 forwards, 8 on c0; c0's first backward B8) | 1
#   3 4 6 | 13, 11, 9       | 14, 12, 10   | 6 (before B1: 15 forwards, 6 on c0; c0's first backward B9) | 1
# Model: "small" with 24 layers, so every chunk holds 24 / (p·v) layers; no recompute.
HAND_INTERLEAVED = [
    (2, 3, 2, [6, 5], 2, 1),
    (2, 3, 4, [7, 5], 4, 1),
    (2, 4, 2, [8, 7], 2, 1),
    (2, 4, 4, [9, 7], 4, 1),
    (4, 3, 8, [15, 13, 11, 9], 8, 1),
    (3, 4, 6, [14, 12, 10], 6, 1),
]


@pytest.mark.parametrize("pp,v,m,held,embed,head", HAND_INTERLEAVED)
def test_interleaved_in_flight_by_hand(pp, v, m, held, embed, head):
    from simulator.memory.analytic import rank_memory

    sc = a100(pp, model=dict(SMALL, num_layers=24), tp=1, dp=1, pp=pp, schedule="interleaved",
              virtual_stages=v, global_batch_size=m)
    per_chunk = 24 // (pp * v) * LAYER_ACT
    r = simulate(sc)
    for i in range(pp):
        expected = held[i] * per_chunk + (embed * EMBED_ACT if i == 0 else 0) + (head * HEAD_ACT if i == pp - 1 else 0)
        assert rank_memory(sc, i).activations_bytes == expected
        # the engine's memory over time reaches the same peak: every chunk's gradients held (Megatron-Core's
        # per-chunk gradient buffers) when the activations peak
        assert r.simulated_peak_memory_gib[f"stage{i}"] == pytest.approx(r.memory_per_stage_gib[i], rel=1e-12)


@pytest.mark.parametrize("layers,pp,v,m", [(8, 2, 3, 4), (10, 2, 4, 4), (13, 4, 3, 12), (10, 2, 4, 8)])
def test_interleaved_uneven_chunks_simulated_equals_analytic(layers, pp, v, m):
    # chunks of 1 and 2 layers (split_layers): the peak is not always at the first backward (a 2-layer
    # chunk runs again before a 1-layer chunk's backward frees one); both count the same walk
    sc = a100(pp, model=dict(SMALL, num_layers=layers), tp=1, dp=1, pp=pp, schedule="interleaved",
              virtual_stages=v, global_batch_size=m)
    r = simulate(sc)
    simulated = [r.simulated_peak_memory_gib[f"stage{i}"] for i in range(pp)]
    assert simulated == pytest.approx(r.memory_per_stage_gib, rel=1e-12)


def test_full_mode_tracks_every_rank():
    r = simulate(a100(4, tp=1, pp=2, dp=2), mode="full")
    assert set(r.simulated_peak_memory_gib) == {"rank0", "rank1", "rank2", "rank3"}
    sym = simulate(a100(4, tp=1, pp=2, dp=2))
    # ranks 0, 1 are stage 0 (dp-major numbering within a stage), 2, 3 stage 1
    assert r.simulated_peak_memory_gib["rank0"] == pytest.approx(sym.simulated_peak_memory_gib["stage0"])
    assert r.simulated_peak_memory_gib["rank3"] == pytest.approx(sym.simulated_peak_memory_gib["stage1"])
