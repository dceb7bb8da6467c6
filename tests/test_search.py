"""Layout search (simulator/explore/search.py, `clustersim search`): enumeration, pruning of invalid and
out-of-memory layouts as rows with reasons, ranking, the JSON contract, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.errors import ConfigError
from simulator.explore.search import (
    SearchConstraints,
    SearchSpace,
    enumerate_layouts,
    parse_assignments,
    search,
)

TINY = [
    "model=llama-1b", "cluster.node=dgx-h100", "training.seq_length=1024", "parallelism.global_batch_size=32",
    "parallelism.virtual_stages=1", "parallelism.schedule=1f1b", "parallelism.tp=1", "parallelism.pp=1",
]
CALLS: list[dict] = []


def fake_simulate(raw):
    """tokens/s grows with tp and falls with pp, so the best layout is known."""
    CALLS.append(raw)
    p = raw["parallelism"]
    rate = 1000.0 * p["tp"] / p["pp"] + p["micro_batch_size"]
    return {"parallelism": {**p, "dp": raw["cluster"]["num_gpus"] // (p["tp"] * p["pp"] * p["cp"])},
            "tokens_per_s": rate, "step_time_s": 1.0 / rate, "fits": True, "mfu": 0.3, "infeasible_reason": None}


def test_enumeration_rules():
    cands = enumerate_layouts({"schedule": "1f1b", "global_batch_size": 32}, 16, 16, 8,
                              SearchSpace(micro_batch_size=[1, 2, 4]), SearchConstraints())
    tps = {c["tp"] for c in cands}
    assert tps == {1, 2, 4, 8}  # powers of two within a node
    assert all(16 % (c["tp"] * c["pp"]) == 0 for c in cands)
    assert not any(c["sequence_parallel"] and c["tp"] == 1 for c in cands)
    assert not any(c["virtual_stages"] > 1 and c["pp"] == 1 for c in cands)
    assert all((c["schedule"] == "interleaved") == (c["virtual_stages"] > 1) for c in cands)
    assert len({json.dumps(c, sort_keys=True) for c in cands}) == len(cands)
    # exact count: (tp, pp) pairs with tp*pp | 16, pp <= 16 layers
    pairs = [(t, p) for t in (1, 2, 4, 8) for p in (1, 2, 4, 8, 16) if 16 % (t * p) == 0]
    per = {True: 2 * 3 * 2 * 3, False: 3 * 2 * 3}  # (vp choices) x mbs x zero x recompute
    expected = sum((1 if t == 1 else 2) * (per[p > 1]) for t, p in pairs)
    assert len(cands) == expected
    narrow = enumerate_layouts({"schedule": "1f1b"}, 16, 16, 8, SearchSpace(tp=[2], pp=[2], micro_batch_size=[1],
                               zero_stage=[0], recompute=["full"], sequence_parallel=[True], virtual_stages=[1]),
                               SearchConstraints())
    assert [(c["tp"], c["pp"], c["recompute"]) for c in narrow] == [(2, 2, "full")]
    assert enumerate_layouts({}, 16, 16, 8, SearchSpace(), SearchConstraints(max_tp=2, max_pp=2, min_dp=4))
    assert all(c["tp"] <= 2 and c["pp"] <= 2 and 16 // (c["tp"] * c["pp"]) >= 4 for c in
               enumerate_layouts({}, 16, 16, 8, SearchSpace(), SearchConstraints(max_tp=2, max_pp=2, min_dp=4)))


def test_ranking_and_pruning_with_a_fake_simulator():
    CALLS.clear()
    rows = search(None, overrides=TINY, num_gpus=16, workers=1, simulate_fn=fake_simulate,
                  space=SearchSpace(tp=[1, 2, 3], pp=[1, 2], micro_batch_size=[1, 64], zero_stage=[0],
                                    recompute=["none"], sequence_parallel=[False], virtual_stages=[1]))
    feasible = [r for r in rows if r["fits"]]
    rates = [r["tokens_per_s"] for r in feasible]
    assert rates == sorted(rates, reverse=True)
    assert feasible[0]["parallelism"]["tp"] == 2 and feasible[0]["parallelism"]["pp"] == 1
    assert len(CALLS) == len(feasible)  # only what survived pruning was simulated
    invalid = [r for r in rows if str(r["infeasible_reason"]).startswith("invalid layout")]
    # tp 3 (does not divide 16 GPUs / 32 heads) and micro-batch 64 (> gbs 32 / dp) are invalid rows
    assert {r["parallelism"]["tp"] for r in invalid} >= {3}
    assert any(r["parallelism"]["micro_batch_size"] == 64 for r in invalid)
    assert rows[-len(invalid):] == invalid
    assert all(r["fits"] is False for r in invalid)


def test_oom_pruned_by_the_memory_model_and_confirmed_by_simulate():
    from simulator.scenario import load_scenario
    from simulator.simulate import simulate

    rows = search(None, overrides=["model=llama3-8b", "cluster.node=dgx-h100", "training.seq_length=4096",
                                   "parallelism.global_batch_size=64"], num_gpus=8, workers=1, simulate=False,
                  space=SearchSpace(tp=[1], pp=[1], micro_batch_size=[1, 8], zero_stage=[0],
                                    recompute=["none", "full"], virtual_stages=[1]))
    oom = [r for r in rows if not r["fits"] and "GiB" in str(r["infeasible_reason"])]
    assert oom and all(r["peak_memory_gib"] > 78 for r in oom)
    p = oom[0]["parallelism"]
    scenario = load_scenario(None, ["model=llama3-8b", "cluster.node=dgx-h100", "cluster.num_gpus=8",
                                    "training.seq_length=4096", "parallelism.global_batch_size=64",
                                    "parallelism.virtual_stages=1", "parallelism.schedule=1f1b",
                                    f"parallelism.micro_batch_size={p['micro_batch_size']}",
                                    f"parallelism.recompute={p['recompute']}", "parallelism.tp=1", "parallelism.pp=1"])
    assert simulate(scenario, run_if_oom=False).fits is False


def test_cli_json_with_the_real_simulator(capsys):
    args = ["search", "--gpus", "16", "--json", "--workers", "1", "--space", "tp=1,2", "--space", "pp=1,2",
            "--space", "micro_batch_size=1", "--space", "zero_stage=0", "--space", "recompute=none,full",
            "--space", "virtual_stages=1", "--space", "sequence_parallel=false", "--space", "pp_split=even"]
    for item in TINY:
        args += ["--set", item]
    assert main(args) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 2 * 2 * 2  # llama-1b's output layer outweighs a layer: balanced would add 4 pp-2 rows
    for row in rows:
        assert {"parallelism", "step_time_s", "tokens_per_s", "mfu", "fits", "memory_gib", "time_breakdown_s",
                "infeasible_reason", "peak_memory_gib"} <= set(row)
    rates = [r["tokens_per_s"] for r in rows if r["fits"]]
    assert rates and rates == sorted(rates, reverse=True)
    best = rows[0]["parallelism"]
    assert best["dp"] * best["tp"] * best["pp"] == 16
    table_args = [a for a in args if a != "--json"] + ["--top", "3"]
    assert main(table_args) == 0
    out = capsys.readouterr().out
    assert "tokens/s" in out and "\n8 layouts evaluated: 0 invalid, 0 pruned by memory, " in out


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--space", "tpp=1"], "--space tpp"),
        (["--space", "tp=0"], "--space tp"),
        (["--space", "recompute=sometimes"], "--space recompute"),
        (["--constraint", "max_memory_gib=-1"], "--constraint max_memory_gib"),
        (["--constraint", "foo=1"], "--constraint foo"),
        (["--gpus", "0"], "--gpus"),
        (["--top", "0"], "--top"),
        (["--set", "model=no-such-model"], "model"),
    ],
)
def test_bad_input_exit_2_names_the_field(args, needle, capsys):
    assert main(["search", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("clustersim: error: ") and needle in err and err.count("\n") == 1


def test_parse_assignments():
    space = parse_assignments(["tp=1,2", "sequence_parallel=true"], SearchSpace, "--space", lists=True)
    assert space.tp == [1, 2] and space.sequence_parallel == [True]
    with pytest.raises(ConfigError):
        parse_assignments(["tp"], SearchSpace, "--space", lists=True)


def test_expert_parallel_degrees_are_derived_for_moe_models_only():
    dense = enumerate_layouts({}, 64, 32, 8, SearchSpace(), SearchConstraints())
    assert {c["ep"] for c in dense} == {1}
    moe = enumerate_layouts({}, 64, 32, 8, SearchSpace(), SearchConstraints(), num_experts=8)
    assert {c["ep"] for c in moe} == {1, 2, 4, 8}
    for c in moe:  # ep divides the experts and is carved out of dp
        dp = 64 // (c["tp"] * c["pp"] * c["cp"])
        assert 8 % c["ep"] == 0 and dp % c["ep"] == 0
    # tp 8 x pp 4 leaves dp 2: only ep 1 and 2 there
    assert {c["ep"] for c in moe if c["tp"] == 8 and c["pp"] == 4} == {1, 2}
    capped = enumerate_layouts({}, 64, 32, 8, SearchSpace(), SearchConstraints(max_ep=2), num_experts=8)
    assert {c["ep"] for c in capped} == {1, 2}
    # an explicit space is taken as given (invalid values become invalid rows later)
    given = enumerate_layouts({}, 64, 32, 8, SearchSpace(ep=[3]), SearchConstraints(), num_experts=8)
    assert {c["ep"] for c in given} == {3}


def test_search_over_a_moe_model_tries_expert_parallelism():
    """Mixtral 8x7B on 16 H100s: without ep every layout keeps all 8 experts per rank; the
    memory model then prunes layouts that ep 8 makes fit."""
    rows = search(None, overrides=["model=mixtral-8x7b", "cluster.node=dgx-h100", "training.seq_length=4096",
                                   "parallelism.global_batch_size=64"], num_gpus=16, workers=1, simulate=False,
                  space=SearchSpace(tp=[1], pp=[1], micro_batch_size=[1], zero_stage=[1], recompute=["full"],
                                    virtual_stages=[1]))
    by_ep = {r["parallelism"]["ep"]: r for r in rows}
    assert set(by_ep) == {1, 2, 4, 8}
    assert by_ep[1]["fits"] is False and "GiB" in by_ep[1]["infeasible_reason"]
    assert by_ep[8]["fits"] is True
    assert by_ep[8]["peak_memory_gib"] < by_ep[1]["peak_memory_gib"]


def test_search_over_a_network_ranks_by_samples_per_second():
    """ResNet-50 on 8 A100s: tensor parallelism is refused for its convolutions (invalid rows naming
    the layer kind); the data- and pipeline-parallel layouts are simulated and ranked by images/s."""
    rows = search(str(Path(__file__).resolve().parents[1] / "examples" / "resnet50-8xa100.yaml"), workers=1,
                  space=SearchSpace(tp=[1, 2], pp=[1, 2], cp=[1], micro_batch_size=[256], zero_stage=[0],
                                    recompute=["none"], virtual_stages=[1], sequence_parallel=[False],
                                    pp_split=["even"]))
    feasible = [r for r in rows if r["fits"]]
    assert [(r["parallelism"]["tp"], r["parallelism"]["pp"]) for r in feasible] == [(1, 1), (1, 2)]
    assert feasible[0]["samples_per_s"] > feasible[1]["samples_per_s"] and feasible[0]["tokens_per_s"] is None
    invalid = [r for r in rows if not r["fits"]]
    assert invalid and all("conv2d" in r["infeasible_reason"] for r in invalid)
