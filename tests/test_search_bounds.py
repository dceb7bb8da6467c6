"""The search's step-time lower bound (simulator/explore/bounds.py) and its branch and bound.

The bound must never be above the engine's step time, or the search could skip a layout of the
engine's top k: checked over random valid layouts (hypothesis) of dense, MoE, CNN, mixed-cluster and
wide-area scenarios, every schedule, ZeRO stage and overlap switch. Then the pruned search against
the exhaustive one (the engine on every feasible layout): the same top k, in the same order, with
the same step times; and the counts the search prints add up."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.explore.bounds import step_lower_bound_s
from simulator.explore.search import SearchSpace, search
from simulator.report.search_table import counts_line, summarize
from simulator.scenario import load_scenario
from simulator.simulate import simulate

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

# (scenario file or None, overrides, GPUs, space): small enough that one engine run takes milliseconds.
CASES = {
    "llama-1b/16xH100": (None, ["model=llama-1b", "cluster.node=dgx-h100", "training.seq_length=1024",
                                "parallelism.global_batch_size=64"], 16,
                         SearchSpace(micro_batch_size=[1, 2], zero_stage=[0, 1, 2, 3])),
    "gpt-1.7b/32xA100": (None, ["model=gpt-1.7b", "training.seq_length=1024", "parallelism.global_batch_size=64"],
                         32, SearchSpace(micro_batch_size=[1, 4], zero_stage=[0, 1],
                                         schedule=["gpipe", "1f1b", "interleaved", "zb-h1"])),
    "mixtral-8x7b/64xH100": (None, ["model=mixtral-8x7b", "cluster.node=dgx-h100", "training.seq_length=1024",
                                    "training.attention=flash", "parallelism.global_batch_size=64"], 64,
                             SearchSpace(micro_batch_size=[1], recompute=["full"], virtual_stages=[1],
                                         schedule=["1f1b", "zb-h1"])),
    "mixed-a100-t4": (EXAMPLES / "mixed-a100-t4.yaml", [], None,
                      SearchSpace(micro_batch_size=[1, 2], virtual_stages=[1], recompute=["none", "full"])),
    "two-regions-wan": (EXAMPLES / "gpt-1.7b-two-regions-wan.yaml", [], None,
                        SearchSpace(micro_batch_size=[1, 4], virtual_stages=[1], recompute=["full"])),
    "resnet50/8xA100": (EXAMPLES / "resnet50-8xa100.yaml", [], None,
                        SearchSpace(tp=[1], micro_batch_size=[64, 256], recompute=["none"], virtual_stages=[1],
                                    sequence_parallel=[False])),
}
SWITCHES = ("overlap_grad_reduce", "overlap_param_gather", "overlap_tp_grad_comm", "overlap_p2p_comm",
            "tp_comm_overlap")


@functools.cache
def feasible(case: str) -> list[dict]:
    source, overrides, gpus, space = CASES[case]
    rows = search(str(source) if source else None, overrides=overrides, num_gpus=gpus, space=space,
                  simulate=False, workers=1)
    return [r["parallelism"] for r in rows if r.get("fits")]


def scenario_of(case: str, layout: dict, switches: dict[str, bool]):
    source, overrides, gpus, _ = CASES[case]
    layout = {**layout, **switches}
    if switches.get("tp_comm_overlap") and not layout.get("sequence_parallel"):
        layout["tp_comm_overlap"] = False  # needs sequence parallelism
    layout["dp"] = "auto"  # the examples may fix it
    sets = [f"parallelism.{k}={json.dumps(v) if isinstance(v, bool) else v}" for k, v in layout.items()
            if v is not None]
    return load_scenario(source, overrides + ([f"cluster.num_gpus={gpus}"] if gpus else []) + sets)


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(CASES)), st.integers(min_value=0, max_value=10**6),
       st.fixed_dictionaries({k: st.booleans() for k in SWITCHES}))
@pytest.mark.slow
def test_bound_is_never_above_the_engine(case, pick, switches):
    layouts = feasible(case)
    assert layouts, case
    scenario = scenario_of(case, layouts[pick % len(layouts)], switches)
    engine = simulate(scenario)
    assert engine.fits
    bound = step_lower_bound_s(scenario)
    assert 0 < bound <= engine.step_time_s, (case, bound, engine.step_time_s)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(CASES)), st.integers(min_value=0, max_value=10**6),
       st.fixed_dictionaries({k: st.booleans() for k in SWITCHES}))
@pytest.mark.slow
def test_inert_switches_leave_the_plan_unchanged(case, pick, switches):
    """The wide search times candidates that differ only in inert switches once
    (simulator/explore/wide.py: ``inert_switches``): flipping any of them leaves the engine's step
    time, its breakdown and the fast path's step unchanged, bit for bit."""
    from simulator.explore.wide import inert_switches
    from simulator.strategies.spmd.fast import fast_step

    layouts = feasible(case)
    scenario = scenario_of(case, layouts[pick % len(layouts)], switches)
    if scenario.strategy_kind != "spmd":
        return
    inert = inert_switches(scenario.parallelism)
    if not inert:
        return
    flipped = scenario_of(case, layouts[pick % len(layouts)],
                          {**switches, **{k: not switches[k] for k in inert}})
    a, b = simulate(scenario), simulate(flipped)
    assert a.step_time_s == b.step_time_s and a.time_breakdown_s == b.time_breakdown_s, (case, inert)
    assert fast_step(scenario).step_time_s == fast_step(flipped).step_time_s


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(CASES)), st.integers(min_value=0, max_value=10**6),
       st.fixed_dictionaries({k: st.booleans() for k in SWITCHES}))
def test_chunk_passes_shared_across_zero_stages_and_gpipe_are_the_ones_priced_afresh(case, pick, switches):
    """The bound prices a layout's chunk passes once for every ZeRO stage, GPipe/1F1B and
    gradient/gather/send overlap setting (bounds.passes_key): priced afresh for each variant, the
    pipeline chains are the same, bit for bit. Under ``pp_split: balanced`` GPipe and 1F1B are keyed
    apart (the cut minimises the schedule's own estimate, so GPipe may cut elsewhere): variants that
    share a key still share their chains."""
    from simulator.explore import bounds

    layout = feasible(case)[pick % len(feasible(case))]
    base = scenario_of(case, layout, switches)
    if base.strategy_kind != "spmd":
        return
    variants = [{"zero_stage": z} for z in (0, 1, 2, 3)] + [{"overlap_grad_reduce": not switches["overlap_grad_reduce"],
                                                            "overlap_param_gather": not switches["overlap_param_gather"],
                                                            "overlap_p2p_comm": not switches["overlap_p2p_comm"]}]
    if base.parallelism.schedule in ("gpipe", "1f1b"):
        variants.append({"schedule": "gpipe" if base.parallelism.schedule == "1f1b" else "1f1b"})
    chains_by_key: dict[str, set] = {}
    for update in variants:
        variant = dataclasses.replace(base, parallelism=base.parallelism.model_copy(update=update))
        key = bounds.passes_key({"model": case, "parallelism": {**layout, **switches, **update}})
        chains_by_key.setdefault(key, set()).add(bounds.bound_parts(variant).chains)  # no key: priced afresh
    assert all(len(chains) == 1 for chains in chains_by_key.values()), (case, layout)
    assert len(chains_by_key) == (1 if base.parallelism.pp_split != "balanced" or len(variants) == 5 else 2)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.floats(1, 2), st.floats(0, 0.3)), min_size=1, max_size=40),
       st.integers(min_value=1, max_value=12), st.integers(min_value=1, max_value=5), st.integers(0, 24))
def test_engine_branch_and_bound_finds_the_engine_top_k(items, k, wave, beside_first):
    """Whatever the bounds' gaps (bound <= engine), the candidates the engine timed include the
    engine's top k over every candidate; every other candidate's bound is above the k-th engine time;
    the ``beside_first`` smallest bounds the engine timed went to ``price_beside``, the rest not."""
    from simulator.explore.bounds import engine_branch_and_bound

    bound = [b for b, _ in items]
    engine = [b * (1 + gap) for b, gap in items]
    engine_seen, beside_seen = set(), set()
    order = sorted(range(len(items)), key=bound.__getitem__)
    done = engine_branch_and_bound(order, bound, engine_seen.update,
                                   lambda p: engine[p] if p in engine_seen | beside_seen else float("inf"), k, wave,
                                   beside_seen.update, beside_first)
    assert done == engine_seen | beside_seen and not engine_seen & beside_seen
    truth = sorted(range(len(items)), key=lambda p: (engine[p], p))[:k]
    found = sorted(done, key=lambda p: (engine[p], p))[:k]
    assert [engine[p] for p in found] == [engine[p] for p in truth]
    kth = engine[truth[-1]]
    assert all(bound[p] > kth for p in set(range(len(items))) - done)
    assert beside_seen == {p for p in order[:beside_first] if p in done}


def test_bound_counts_the_exposed_tail():
    """Switching off the overlap of the gradient reduction puts the whole reduction after the
    backward: the engine's step grows, and so does the bound, which stays below it."""
    layout = {"tp": 2, "pp": 2, "cp": 1, "ep": 1, "virtual_stages": 1, "schedule": "1f1b", "micro_batch_size": 1,
              "zero_stage": 0, "recompute": "none", "sequence_parallel": False}
    overlapped = scenario_of("gpt-1.7b/32xA100", layout, {"overlap_grad_reduce": True})
    exposed = scenario_of("gpt-1.7b/32xA100", layout, {"overlap_grad_reduce": False})
    b_on, b_off = step_lower_bound_s(overlapped), step_lower_bound_s(exposed)
    e_on, e_off = simulate(overlapped).step_time_s, simulate(exposed).step_time_s
    assert b_on <= e_on and b_off <= e_off
    assert b_off - b_on > 0.5 * (e_off - e_on) > 0


@pytest.mark.parametrize("zero_stage", [0, 1, 2])
def test_bound_counts_the_last_gradient_bucket(zero_stage):
    """With the reduction overlapped, the bucket flushed when the last backward ends is still reduced
    before the optimizer step: the bound counts it (alone), and stays below the engine."""
    import dataclasses

    from simulator.explore.bounds import bound_parts

    layout = {"tp": 2, "pp": 2, "cp": 1, "ep": 1, "virtual_stages": 1, "schedule": "1f1b", "micro_batch_size": 1,
              "zero_stage": zero_stage, "recompute": "none", "sequence_parallel": False}
    scenario = scenario_of("gpt-1.7b/32xA100", layout, {"overlap_grad_reduce": True})
    parts = bound_parts(scenario)
    assert all(s > 0 for s in parts.last_bucket_s)
    with_bucket = parts.bound_s(True, scenario.parallelism.overlap_param_gather)
    without = dataclasses.replace(parts, last_bucket_s=()).bound_s(True, scenario.parallelism.overlap_param_gather)
    assert with_bucket > without
    assert with_bucket <= simulate(scenario).step_time_s


SMALL = (["model=gpt-1.7b", "training.seq_length=1024", "parallelism.global_batch_size=64"], 16,
         SearchSpace(micro_batch_size=[1, 2], zero_stage=[0, 1], recompute=["none", "full"]))


def engine_everywhere(raw):
    """Every feasible layout through the engine (the exhaustive reference)."""
    from simulator.simulate import simulate_point

    return simulate_point(raw, engine="full")


def _key(row):
    return tuple(sorted(row["parallelism"].items()))


def _key_of(layout: dict) -> tuple:
    """A folded candidate's layout without the overlap switches (search's reference sets them with --set, the wide
    search lists them in the candidate)."""
    from simulator.explore.search import SWITCHES

    return tuple(sorted((k, v) for k, v in layout.items() if k not in SWITCHES))


def _same_top(pruned: list[dict], exhaustive: list[dict], k: int) -> None:
    assert [_key(r) for r in pruned[:k]] == [_key(r) for r in exhaustive[:k]]
    for a, b in zip(pruned[:k], exhaustive[:k], strict=True):
        assert a["evaluated_by"] == "engine"
        assert a["step_time_s"] == pytest.approx(b["step_time_s"], rel=1e-12)


@pytest.mark.slow
def test_pruned_top_20_is_the_exhaustive_top_20_and_the_counts_add_up():
    overrides, gpus, space = SMALL
    exhaustive = search(None, overrides=overrides, num_gpus=gpus, space=space, simulate_fn=engine_everywhere,
                        workers=1)
    pruned = search(None, overrides=overrides, num_gpus=gpus, space=space, top_k=20, workers=1)
    _same_top(pruned, exhaustive, 20)
    s = summarize(pruned)
    assert s["evaluated"] == len(exhaustive)
    assert s["invalid"] + s["pruned_by_memory"] + s["pruned_by_bound"] + s["by_fast_path"] + s["by_engine"] \
        == s["evaluated"]
    assert s["engine_resimulated"] >= 20
    assert s["by_fast_path"] == 0 and s["priced_by_fast_path"] >= 20  # the top 20 carry both times
    assert all(r["fast_step_time_s"] is not None for r in pruned[:20])
    assert s["pruned_by_bound"] > 0  # the bound does prune here
    kth = sorted(r["step_time_s"] for r in pruned if r.get("evaluated_by") == "engine")[19]
    for row in pruned:
        if row.get("evaluated_by") == "bound":
            assert row["step_time_lower_bound_s"] > kth
    line = counts_line(s)
    assert f"{s['pruned_by_bound']:,} pruned by the step-time lower bound" in line


SEARCH_EXAMPLES = {
    # every example a search runs on (spmd kind, ranked by tokens/s), narrowed so that the engine on
    # every feasible layout stays a matter of seconds; benchmarks/bench_search_fast.py --all
    # --check-ranking compares the full default spaces
    "gpt3-175b-1024-a100.yaml": SearchSpace(tp=[8], pp=[4, 8], micro_batch_size=[1], zero_stage=[1],
                                            recompute=["selective", "full"]),
    "gpt3-175b-fp8-512-h100.yaml": SearchSpace(tp=[8], pp=[4, 8], micro_batch_size=[1], zero_stage=[1],
                                               recompute=["selective"]),
    "mixtral-8x7b-ep8-h100.yaml": SearchSpace(tp=[1, 2], pp=[1, 2], micro_batch_size=[1], zero_stage=[1],
                                              recompute=["full"], virtual_stages=[1]),
    "mixed-a100-t4.yaml": SearchSpace(micro_batch_size=[1, 2], zero_stage=[1], recompute=["none", "full"]),
    "gpt-1.7b-two-regions-wan.yaml": SearchSpace(micro_batch_size=[1, 4], zero_stage=[1], recompute=["full"],
                                                 virtual_stages=[1]),
    "resnet50-8xa100.yaml": SearchSpace(tp=[1], micro_batch_size=[64, 256], recompute=["none"],
                                        virtual_stages=[1], sequence_parallel=[False]),
    "deepseek-v3-h800.yaml": SearchSpace(tp=[1], pp=[8, 16], ep=[32, 64], micro_batch_size=[1], zero_stage=[1],
                                         recompute=["selective"], virtual_stages=[1]),
    "llama3-405b-16k-h100.yaml": SearchSpace(tp=[8], pp=[8, 16], virtual_stages=[2, 4], micro_batch_size=[1],
                                             zero_stage=[1], recompute=["full"], sequence_parallel=[True]),
    "llama3-405b-128k-cp16.yaml": SearchSpace(tp=[8], cp=[16], pp=[8, 16], virtual_stages=[1, 4],
                                              micro_batch_size=[1], zero_stage=[1], recompute=["full"],
                                              sequence_parallel=[True]),
    # the other examples a search runs on (benchmarks/bench_search_ranking.py: 15 in all)
    "bert-large-tp4-dgx-a100.yaml": SearchSpace(tp=[1, 4], micro_batch_size=[32], zero_stage=[0],
                                                recompute=["none", "full"]),
    "llama3-405b-16k-h100-failures.yaml": SearchSpace(tp=[8], pp=[16], virtual_stages=[2, 4], micro_batch_size=[1],
                                                      zero_stage=[1], recompute=["full"], sequence_parallel=[True]),
    "llama3-8b-torchtitan-sac-h100.yaml": SearchSpace(tp=[4, 8], pp=[1, 2], virtual_stages=[1], micro_batch_size=[12],
                                                      zero_stage=[1, 3], recompute=["full"]),
    "mixed-a100-t4-two-regions-wan.yaml": SearchSpace(micro_batch_size=[1], zero_stage=[1], recompute=["full"],
                                                      virtual_stages=[1]),
    "qwen3-235b-etp-h100.yaml": SearchSpace(tp=[2], pp=[8], virtual_stages=[2, 4], micro_batch_size=[1],
                                            zero_stage=[1], recompute=["full"], sequence_parallel=[True]),
    "vit-l16-step-in-backward-a100.yaml": SearchSpace(micro_batch_size=[1], zero_stage=[0], recompute=["none", "full"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("example", sorted(SEARCH_EXAMPLES))
def test_pruned_search_matches_exhaustive_on_the_examples(example):
    space = SEARCH_EXAMPLES[example]
    path = str(EXAMPLES / example)
    exhaustive = search(path, space=space, simulate_fn=engine_everywhere, workers=1)
    pruned = search(path, space=space, top_k=20, workers=1)
    k = min(20, summarize(exhaustive)["simulated"])
    assert k >= 1
    _same_top(pruned, exhaustive, k)


@pytest.mark.slow
def test_wide_search_top_k_is_the_exhaustive_one_over_layouts_and_switches():
    """The wide search (simulator/explore/wide.py: counted, not listed) over layouts × overlap
    switches finds the engine's top k over every candidate: the exhaustive reference runs the
    engine on every feasible layout once per switch setting."""
    import itertools

    from simulator.explore.wide import wide_search

    overrides, gpus, _ = SMALL
    space = SearchSpace(micro_batch_size=[2], zero_stage=[0, 1], recompute=["full"], virtual_stages=[1])
    switches = {"overlap_grad_reduce": [False, True], "overlap_param_gather": [False, True],
                "overlap_tp_grad_comm": [False, True]}
    k = 8
    wide = wide_search(None, overrides=overrides, num_gpus=gpus, space=space.model_copy(update=switches), top_k=k,
                       workers=1)
    reference = []
    for ogr, opg, otgc in itertools.product([False, True], repeat=3):
        sets = [f"parallelism.overlap_grad_reduce={json.dumps(ogr)}",
                f"parallelism.overlap_param_gather={json.dumps(opg)}",
                f"parallelism.overlap_tp_grad_comm={json.dumps(otgc)}"]
        reference += search(None, overrides=overrides + sets, num_gpus=gpus, space=space,
                            simulate_fn=engine_everywhere, workers=1)
    c = wide.counts
    # both fold the candidates that build the same plan as one they keep (ZeRO-1 without data parallelism:
    # folded_layouts, tests/test_search_fold.py; simulator/explore/checks.py PlanFolds): the same rows, the same folds
    folded = sum(len(r.get("folded_layouts") or ()) for r in reference)
    assert folded > 0 and c["folded_as_same_plan"] == folded
    assert c["evaluated"] == len(reference)
    assert c["invalid"] + c["pruned_by_memory"] == sum(1 for r in reference if not r["fits"])
    assert c["pruned_by_bound"] + c["timed"] == sum(1 for r in reference if r["fits"])
    assert c["pruned_by_bound"] > 0 and c["engine_resimulated"] >= k
    best = sorted((r for r in reference if r["fits"]), key=lambda r: r["step_time_s"])
    assert [r["step_time_s"] for r in wide.top] == pytest.approx([r["step_time_s"] for r in best[:k]], rel=1e-12)
    by_layout = {_key(r): r for r in reference}
    for row in wide.top:  # a top row folds what search's row of that layout folds
        assert sorted(map(_key_of, row.get("folded_layouts") or [])) == sorted(
            map(_key_of, by_layout[_key(row)].get("folded_layouts") or []))
    kth = best[k - 1]["step_time_s"]
    strictly_better = {_key(r) for r in best if r["step_time_s"] < kth * (1 - 1e-12)}
    assert strictly_better <= {_key(r) for r in wide.top}


def test_overlap_switches_are_searchable_fields():
    """Each switch given as a list multiplies the candidates; None keeps the scenario's value."""
    from simulator.errors import ConfigError
    from simulator.explore.search import SearchConstraints, enumerate_layouts, parse_assignments

    base = {"global_batch_size": 64, "overlap_grad_reduce": True}
    plain = enumerate_layouts(base, 16, 24, 8, SearchSpace(), SearchConstraints())
    space = parse_assignments(["overlap_grad_reduce=false,true", "tp_comm_overlap=false,true"], SearchSpace,
                              "--space", lists=True)
    both = enumerate_layouts(base, 16, 24, 8, space, SearchConstraints())
    assert len(both) == 4 * len(plain)
    assert {(c["overlap_grad_reduce"], c["tp_comm_overlap"]) for c in both} == {(a, b) for a in (False, True)
                                                                                for b in (False, True)}
    assert all(c["overlap_grad_reduce"] is True and "tp_comm_overlap" not in c for c in plain)
    with pytest.raises(ConfigError, match="--space overlap_p2p_comm"):
        enumerate_layouts(base, 16, 24, 8, SearchSpace(overlap_p2p_comm=[]), SearchConstraints())


def test_branch_and_bound_prices_in_waves_while_fewer_than_k_engine_times_are_finite():
    """A wide search where the engine finds few candidates that run (the others infeasible in the
    engine, time infinite): the k-th engine time stays infinite, and the engine is asked for the
    next wave at a time, never for every candidate left at once (it stalled a 1M-candidate search)."""
    from simulator.explore.bounds import engine_branch_and_bound

    n, k, wave = 300, 5, 4
    bound = [1 + i / n for i in range(n)]
    runs = {p for p in range(0, n, 100)}  # three candidates run in the engine; k is 5
    engine_seen, batches = set(), []

    def price_engine(batch):
        batches.append(len(batch))
        engine_seen.update(batch)

    done = engine_branch_and_bound(list(range(n)), bound, price_engine,
                                   lambda p: bound[p] if p in engine_seen and p in runs else float("inf"), k, wave)
    # a wave is at most `wave`, k (while fewer than k times are finite, the next k are due anyway) or an
    # eighth of what was priced before it, never the rest at once
    assert batches[0] == k
    assert all(size <= max(wave, k, sum(batches[:i]) // 8) for i, size in enumerate(batches))
    assert runs <= done  # every candidate that runs was timed by the engine
