"""The search's pipeline split (``pp_split``): even and cost-balanced cuts are both candidates where
they cut the model differently (a CNN's uneven layers), and only the even one where they coincide
(a stack of identical transformer layers whose embedding and loss weigh less than a layer)."""

import copy
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.errors import ConfigError
from simulator.explore.checks import build_layout
from simulator.explore.search import SearchConstraints, SearchSpace, enumerate_layouts, prepare, search
from simulator.simulate import simulate
from simulator.strategies.spmd.layout import chunk_layer_counts, split_layers
from simulator.strategies.spmd.split import balanced_split, chunk_counts, max_chunk_cost, split_choice

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")
RESNET = os.path.join(EXAMPLES, "resnet50-8xa100.yaml")
GPT3 = os.path.join(EXAMPLES, "gpt3-175b-1024-a100.yaml")
RESNET_PP2 = ["parallelism.dp=4", "parallelism.pp=2", "parallelism.micro_batch_size=32"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 20), min_size=1, max_size=12), st.integers(1, 6), st.integers(0, 30),
       st.integers(0, 30))
def test_balanced_split_keeps_the_even_split_where_it_is_optimal(costs, chunks, first, last):
    if chunks > len(costs):
        return
    costs = [float(c) for c in costs]
    even = split_layers(len(costs), chunks)
    free = balanced_split(costs, chunks, first, last)
    kept = balanced_split(costs, chunks, first, last, prefer=even)
    assert max_chunk_cost(costs, kept, first, last) == pytest.approx(max_chunk_cost(costs, free, first, last),
                                                                      rel=1e-9)
    even_optimal = max_chunk_cost(costs, even, first, last) <= max_chunk_cost(costs, free, first, last) * (1 + 1e-9)
    assert (kept == even) == even_optimal or kept == even


def test_identical_layers_with_a_light_head_split_evenly_at_every_depth():
    """96 equal layers over 64 chunks: every cut has a chunk of two layers; the even one is kept
    (before, the greedy packed 1, 2, 2, ... from the front: the same largest chunk, another layout)."""
    costs = [1.0] * 96
    for chunks in (2, 3, 4, 8, 12, 16, 32, 48, 64, 96):
        assert balanced_split(costs, chunks, 0.01, 0.33, prefer=split_layers(96, chunks)) == split_layers(96, chunks)
    # a head heavier than two layers moves layers off the last chunk
    assert balanced_split(costs, 4, 0.0, 2.5, prefer=split_layers(96, 4))[-1] < 24


def test_the_space_takes_pp_split_and_refuses_other_values():
    space = SearchSpace(pp_split=["even", "balanced"])
    rows = enumerate_layouts({"global_batch_size": 8}, 8, 16, 8, space.model_copy(update={
        "tp": [1], "pp": [1, 2], "virtual_stages": [1], "zero_stage": [0], "recompute": ["none"],
        "micro_batch_size": [1]}), SearchConstraints())
    assert sorted((r["pp"], r["pp_split"]) for r in rows) == [(1, "even"), (2, "balanced"), (2, "even")]
    with pytest.raises(ConfigError, match="pp_split"):
        enumerate_layouts({}, 8, 16, 8, SearchSpace(pp_split=["uneven"]), SearchConstraints())
    with pytest.raises(ConfigError, match="pp_split"):
        enumerate_layouts({}, 8, 16, 8, SearchSpace(pp_split=[]), SearchConstraints())


@pytest.mark.slow
def test_gpt3_default_space_is_unchanged_and_its_splits_coincide_where_micro_batches_abound():
    """GPT-3 175B's output layer is a third of a layer: the slowest-stage cut is the even one at every
    pipeline depth, so the default space derives ``even`` alone and the candidates are the ones
    searched before (1,860, in the same order: the same top 20). ``balanced`` itself cuts by the
    schedule estimate (simulator/strategies/spmd/split.py): on every distinct pipelined layout of the
    space, as each candidate's own scenario prices it, it is the even cut wherever the pipeline has
    more than three micro-batches per chunk and its chunks divide the 96 layers; elsewhere (few
    micro-batches: fill and drain dominate; 64 stages of 1-2 layers: the embedding's stage) a cut
    that loads the early stages more may lead the even one by the estimate, by at least the margin."""
    raw, scenario, cands = prepare(GPT3, [], None, SearchSpace(), SearchConstraints())
    assert len(cands) == 1860
    assert {c["pp_split"] for c in cands} == {"even"}
    _, _, before = prepare(GPT3, [], None, SearchSpace(pp_split=["even"]), SearchConstraints())
    assert cands == before
    seen, checked, uneven_kept = set(), 0, 0
    for c in cands:
        key = (c["tp"], c["pp"], c["virtual_stages"], c["micro_batch_size"], c["recompute"], c["sequence_parallel"])
        if c["pp"] == 1 or key in seen:
            continue
        seen.add(key)
        point = copy.deepcopy(raw)
        point["parallelism"] = {**c, "pp_split": "balanced"}
        try:
            sc = build_layout(point)
        except ConfigError:
            continue
        graph = sc.layer_graph()
        chunks = sc.parallelism.pp * sc.parallelism.virtual_stages
        even = chunk_layer_counts(sc.parallelism, len(graph.pipelined))
        counts = chunk_counts(sc, graph)
        checked += 1
        if sc.parallelism.num_micro_batches > 3 * chunks and len(graph.pipelined) % chunks == 0:
            assert counts == even, key
            uneven_kept += 1
        elif counts != even:
            choice = split_choice(sc, graph)
            assert choice.estimate_s <= choice.even_estimate_s * (1 - 0.005), key
    assert checked >= 50 and uneven_kept >= 50


@pytest.mark.slow
def test_gpt3_balanced_cut_at_few_micro_batches_is_faster_in_the_engine():
    """Where ``balanced`` leaves the even cut on GPT-3 (few micro-batches per chunk), the engine agrees
    with the estimate: tp 1 pp 4, 3 micro-batches, [28, 29, 20, 19] 31.77 s against even's 33.77 s
    (5.9%); tp 2 pp 2 x 2 virtual stages, 6 micro-batches, [26, 22, 24, 24] 18.74 against 18.94 s (1.1%)."""
    raw, _, cands = prepare(GPT3, [], None, SearchSpace(), SearchConstraints())
    wanted = {(1, 4, 1, 2): [28, 29, 20, 19], (2, 2, 2, 1): [26, 22, 24, 24]}
    for c in cands:
        key = (c["tp"], c["pp"], c["virtual_stages"], c["micro_batch_size"])
        if key not in wanted or c["recompute"] != "none" or c["sequence_parallel"]:
            continue
        times = {}
        for split in ("even", "balanced"):
            point = copy.deepcopy(raw)
            point["parallelism"] = {**c, "pp_split": split}
            result = simulate(build_layout(point))
            times[split] = result.step_time_s
            if split == "balanced":
                assert result.layer_split == wanted[key]
        assert times["balanced"] < 0.99 * times["even"], key
        del wanted[key]
    assert not wanted


def test_resnet50_default_space_derives_both_splits():
    _, _, cands = prepare(RESNET, RESNET_PP2, None, SearchSpace(tp=[1], pp=[1, 2, 4]), SearchConstraints())
    splits = {(c["pp"], c["pp_split"]) for c in cands}
    assert splits == {(1, "even"), (2, "even"), (2, "balanced"), (4, "even"), (4, "balanced")}


def test_resnet50_pp2_search_returns_the_balanced_split(monkeypatch):
    """The issue's case: ResNet-50 on 8 A100s, dp 4 x pp 2, micro-batch 32: the cost-balanced cut is
    ~17% faster than the even one, and the default space finds it; memory and bound are the split's."""
    monkeypatch.setenv("CLUSTERSIM_CACHE", "0")
    rows = search(RESNET, overrides=RESNET_PP2, workers=1, space=SearchSpace(
        tp=[1], pp=[2], virtual_stages=[1], micro_batch_size=[32], zero_stage=[0], recompute=["none"]))
    timed = [r for r in rows if r["fits"] and r["samples_per_s"]]
    assert [r["parallelism"]["pp_split"] for r in timed] == ["balanced", "even"]
    best, even = timed
    assert best["samples_per_s"] > 1.1 * even["samples_per_s"]
    assert best["peak_memory_gib"] != even["peak_memory_gib"]  # each priced on its own chunks
    for r in timed:
        assert r["step_time_lower_bound_s"] <= r["step_time_s"]
        assert r["fast_step_time_s"] == pytest.approx(r["step_time_s"], rel=0.03)
