"""The search folds candidates that build the same plan before pricing them (simulator/explore/checks.py
``plan_key``): ZeRO-1/2 without data parallelism (nothing to shard) and a ``balanced`` pipeline cut equal to
the ``even`` one. The first in enumeration order is kept and lists the others in ``folded_layouts``; the
summary counts them. Each fold is checked here to be sound: the folded layout simulated on its own gives the
kept one's step and memory, bit for bit."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

from simulator.cli import main
from simulator.explore.checks import effective_zero_stage
from simulator.explore.search import SearchConstraints, SearchSpace, prepare, search
from simulator.explore.sweep import default_simulate
from simulator.report.search_table import counts_line, summarize

LLAMA = ["model=llama-1b", "cluster.node=dgx-h100", "training.seq_length=1024", "parallelism.global_batch_size=8",
         "parallelism.virtual_stages=1", "parallelism.schedule=1f1b", "parallelism.tp=1", "parallelism.pp=1"]
GPT = ["model=gpt3-5b", "cluster.node=dgx-h100", "training.seq_length=1024", "parallelism.global_batch_size=32",
       "parallelism.virtual_stages=1", "parallelism.schedule=1f1b", "parallelism.tp=1", "parallelism.pp=1"]


def _same_when_simulated(overrides, space, rows) -> int:
    """Every folded layout, simulated alone, equals the kept row's layout simulated alone (step, peak,
    memory per stage); returns how many were checked."""
    raw, _, _ = prepare(None, overrides, 4, space, SearchConstraints())
    checked = 0
    for row in rows:
        if not row.get("folded_layouts"):
            continue
        kept = default_simulate({**raw, "parallelism": row["parallelism"]})
        for layout in row["folded_layouts"]:
            other = default_simulate({**raw, "parallelism": layout})
            for key in ("fits", "step_time_s", "peak_memory_gib", "memory_per_stage_gib", "time_breakdown_s"):
                assert other[key] == kept[key], (key, layout)
            checked += 1
    return checked


def test_zero_without_data_parallelism_is_folded_into_zero_0():
    space = SearchSpace(tp=[1, 2], pp=[2, 4], micro_batch_size=[1], zero_stage=[0, 1], recompute=["none"],
                        sequence_parallel=[False], virtual_stages=[1], pp_split=["even"])
    rows = search(None, overrides=LLAMA, num_gpus=4, workers=1, space=space)
    listed = [(r["parallelism"]["tp"], r["parallelism"]["pp"], r["parallelism"]["zero_stage"]) for r in rows
              if r["fits"]]
    # dp 2 (tp 1, pp 2): ZeRO-1 shards the optimizer state, both listed; dp 1: ZeRO-1 is ZeRO 0, folded
    assert sorted(listed) == [(1, 2, 0), (1, 2, 1), (1, 4, 0), (2, 2, 0)]
    folded = sorted((r["parallelism"]["tp"], r["parallelism"]["pp"], r["parallelism"]["zero_stage"],
                     [f["zero_stage"] for f in r.get("folded_layouts", [])]) for r in rows if r["fits"])
    assert folded == [(1, 2, 0, []), (1, 2, 1, []), (1, 4, 0, [1]), (2, 2, 0, [1])]
    s = summarize(rows)
    assert s["folded_as_same_plan"] == 2 and s["layouts"] == len(rows)
    assert "2 more folded as the same plan" in counts_line(s)
    assert _same_when_simulated(LLAMA, space, rows) == 2


def test_a_balanced_cut_equal_to_the_even_one_is_folded():
    # GPT-3 5B's output layer weighs less than a layer: at these depths ``balanced`` cuts evenly
    space = SearchSpace(tp=[1], pp=[2, 4], micro_batch_size=[1], zero_stage=[0], recompute=["none"],
                        sequence_parallel=[False], virtual_stages=[1], pp_split=["even", "balanced"])
    rows = search(None, overrides=GPT, num_gpus=4, workers=1, space=space)
    assert [(r["parallelism"]["pp"], r["parallelism"]["pp_split"]) for r in rows] in (
        [(2, "even"), (4, "even")], [(4, "even"), (2, "even")])
    assert all([f["pp_split"] for f in r["folded_layouts"]] == ["balanced"] for r in rows)
    assert summarize(rows)["folded_as_same_plan"] == 2
    assert _same_when_simulated(GPT, space, rows) == 2


def test_a_cut_that_differs_is_not_folded():
    # llama-1b's output layer outweighs a layer: balanced moves layers off the last stage, a plan of its own
    space = SearchSpace(tp=[1], pp=[2], micro_batch_size=[1], zero_stage=[0], recompute=["none"],
                        sequence_parallel=[False], virtual_stages=[1], pp_split=["even", "balanced"])
    _, _, candidates = prepare(None, LLAMA, 4, space, SearchConstraints())
    rows = search(None, overrides=LLAMA, num_gpus=4, workers=1, space=space, simulate=False)
    assert len(candidates) == len(rows) == 2 and summarize(rows)["folded_as_same_plan"] == 0


def test_effective_zero_stage_keeps_what_shards_something():
    def par(zero, dp=1, cp=1, edp=1):
        return SimpleNamespace(zero_stage=zero, dp_degree=dp, cp=cp, expert_data_parallel_size=edp)

    assert [effective_zero_stage(par(z)) for z in (0, 1, 2, 3)] == [0, 0, 0, 3]  # ZeRO-3 holds gather buffers
    assert effective_zero_stage(par(1, dp=2, edp=2)) == 1
    assert effective_zero_stage(par(1, cp=2, edp=2)) == 1   # the distributed optimizer shards over dp x cp
    assert effective_zero_stage(par(2, edp=2)) == 2         # folded experts: shards over tp x cp x dp / (etp x ep)


def test_cli_json_lists_the_folded_layouts(capsys):
    args = ["search", "--gpus", "4", "--json", "--workers", "1", "--space", "tp=1", "--space", "pp=4",
            "--space", "micro_batch_size=1", "--space", "zero_stage=0,1,2", "--space", "recompute=none",
            "--space", "virtual_stages=1", "--space", "pp_split=even"]
    for item in LLAMA:
        args += ["--set", item]
    assert main(args) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 1 and [f["zero_stage"] for f in rows[0]["folded_layouts"]] == [1, 2]
    assert main([a for a in args if a != "--json"]) == 0
    assert "; 2 more folded as the same plan as one of them (ZeRO-1/2 without" in capsys.readouterr().out


@pytest.mark.parametrize("zero", [[0, 1], [1, 0]])
def test_the_first_in_enumeration_order_is_kept(zero):
    space = SearchSpace(tp=[1], pp=[4], micro_batch_size=[1], zero_stage=zero, recompute=["none"],
                        sequence_parallel=[False], virtual_stages=[1], pp_split=["even"])
    rows = search(None, overrides=LLAMA, num_gpus=4, workers=1, space=space, simulate=False)
    assert [r["parallelism"]["zero_stage"] for r in rows] == zero[:1]
    assert [f["zero_stage"] for f in rows[0]["folded_layouts"]] == zero[1:]


def test_the_engine_fold_keeps_a_balanced_plan_s_cut():
    # the fold runs the plan at 6 and 7 micro-batches; a balanced cut re-chosen there was [7, 6, 6, 5], not the
    # 32-micro-batch plan's [6, 6, 6, 6], and the folded step came out 0.69312 s for the unrolled 0.69411 s
    from simulator.scenario import build_scenario
    from simulator.simulate import simulate
    from simulator.strategies.spmd.split import chunk_counts

    space = SearchSpace(tp=[1], pp=[4], micro_batch_size=[1], zero_stage=[0], recompute=["none"],
                        sequence_parallel=[False], virtual_stages=[1], pp_split=["balanced"])
    raw, _, (cand,) = prepare(None, GPT, 4, space, SearchConstraints())
    sc = build_scenario({**raw, "parallelism": cand})
    assert chunk_counts(sc, sc.layer_graph()) == [6, 6, 6, 6]
    folded, unrolled = simulate(sc, fold=True), simulate(sc, fold=False)
    assert folded.extra.get("engine_fold") and not unrolled.extra.get("engine_fold")
    assert folded.step_time_s == pytest.approx(unrolled.step_time_s, rel=1e-9)
    assert simulate(sc, engine="fast").step_time_s == pytest.approx(unrolled.step_time_s, rel=1e-6)  # its points too


# A strategy kind's rows are folded after timing (simulator/explore/checks.py ``fold_timed_twins``): its balanced
# cut may be chosen anew on the scenarios it derives (another schedule or micro-batch count), so only the run
# tells that both names ran one cut. Local learning on GPT-1.7B, 8 A100s: at pp 2 ``balanced`` cuts [12, 12] as
# ``even`` does (the slowest-stage cut [13, 11] made the search try it); at pp 4 it cuts [6, 7, 8, 3].
LOCAL_LEARNING = "examples/gpt-1.7b-local-learning-a100.yaml"
LL_SPACE = SearchSpace(tp=[1], pp=[2, 4], micro_batch_size=[16], zero_stage=[1], recompute=["none"],
                       sequence_parallel=[False], pp_split=["even", "balanced"])


def test_a_kind_s_balanced_cut_run_as_the_even_one_is_one_row():
    rows = search(LOCAL_LEARNING, workers=1, space=LL_SPACE)
    listed = sorted((r["parallelism"]["pp"], r["parallelism"]["pp_split"], r["layer_split"]) for r in rows)
    assert listed == [(2, "even", [12, 12]), (4, "balanced", [6, 7, 8, 3]), (4, "even", [6, 6, 6, 6])]
    (kept,) = [r for r in rows if r["parallelism"]["pp"] == 2]
    assert [f["pp_split"] for f in kept["folded_layouts"]] == ["balanced"] and kept["folded_after_timing"] == 1
    assert all("folded_layouts" not in r for r in rows if r["parallelism"]["pp"] == 4)
    s = summarize(rows)
    assert (s["folded_as_same_plan"], s["folded_after_timing"], s["layouts"], s["engine_resimulated"]) == (1, 1, 3, 3)
    assert "; 1 more folded as the same plan" in counts_line(s) and ", 1 of them timed first (a strategy kind's" in counts_line(s)
    # sound: the folded layout simulated alone gives the kept row's figures
    raw, _, _ = prepare(LOCAL_LEARNING, None, None, LL_SPACE, SearchConstraints())
    kept_run = default_simulate({**raw, "parallelism": kept["parallelism"]})
    other = default_simulate({**raw, "parallelism": kept["folded_layouts"][0]})
    for key in ("fits", "step_time_s", "peak_memory_gib", "memory_per_stage_gib", "time_breakdown_s", "layer_split"):
        assert other[key] == kept_run[key], key


def test_the_table_lists_a_kind_s_plan_once(capsys):
    args = ["search", LOCAL_LEARNING, "--workers", "1", "--space", "tp=1", "--space", "pp=2",
            "--space", "micro_batch_size=16", "--space", "zero_stage=1", "--space", "recompute=none",
            "--space", "sequence_parallel=false", "--space", "pp_split=even,balanced"]
    assert main(args) == 0
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if re.match(r"\s+\d+\s+1\s+2\s+4\s", line)]  # rank, tp 1 pp 2 dp 4
    assert len(table) == 1 and "60.4" in table[0]  # was two rows, even and balanced, 60.4 samples/s each
    assert "1 layouts evaluated" in out and "1 more folded as the same plan" in out


def _timed(pp_split, step=1.0, split=(12, 12), **layout):
    layout = {"tp": 1, "pp": 2, "dp": 4, "cp": 1, "ep": 1, "zero_stage": 0, "pp_split": pp_split, **layout}
    return {"parallelism": layout, "fits": True, "evaluated_by": "engine",
            "step_time_s": step, "samples_per_s": 64 / step, "layer_split": list(split), "peak_memory_gib": 40.0,
            "memory_per_stage_gib": [40.0, 30.0], "time_breakdown_s": {"compute": step}}


@pytest.mark.parametrize("other, folds", [
    (_timed("balanced"), 1),
    (_timed("balanced", step=1.0 + 1e-12), 0),           # another step: another plan, whatever its cut says
    (_timed("balanced", split=(13, 11)), 0),              # another cut
    (_timed("balanced", micro_batch_size=8), 0),          # another layout field
    ({**_timed("balanced"), "evaluated_by": "bound"}, 0),  # not timed
    ({**_timed("balanced"), "fits": False}, 0),
    (_timed("even", dp=1, zero_stage=1), 0),             # the kept row is dp 4: another layout
])
def test_fold_timed_twins_needs_the_same_cut_step_memory_and_layout(other, folds):
    from simulator.explore.checks import fold_timed_twins

    rows = [_timed("even"), other]
    candidates = [dict(r["parallelism"]) for r in rows]
    assert fold_timed_twins(rows, candidates) == folds
    assert (rows[1] is None) == bool(folds)
    assert rows[0].get("folded_layouts", []) == candidates[1:] * folds


@pytest.mark.parametrize("dp, folds", [(1, 1), (2, 0)])
def test_a_kind_s_zero_1_without_data_parallelism_is_folded_when_it_ran_zero_0_s_plan(dp, folds):
    from simulator.explore.checks import fold_timed_twins

    rows = [_timed("even", dp=dp, zero_stage=0), _timed("even", dp=dp, zero_stage=1)]
    candidates = [dict(r["parallelism"]) for r in rows]
    assert fold_timed_twins(rows, candidates) == folds
    assert [f["zero_stage"] for f in rows[0].get("folded_layouts", [])] == [1] * folds


def test_a_kind_s_zero_1_without_data_parallelism_is_one_row():
    # local learning, tp 2 pp 4 on 8 GPUs: dp 1, ZeRO-1 shards nothing; both were listed, 51.2 samples/s each
    space = SearchSpace(tp=[2], pp=[4], micro_batch_size=[16], zero_stage=[0, 1], recompute=["none"],
                        sequence_parallel=[False], pp_split=["even"])
    rows = search(LOCAL_LEARNING, workers=1, space=space)
    assert [(r["parallelism"]["zero_stage"], [f["zero_stage"] for f in r["folded_layouts"]]) for r in rows] == [(0, [1])]
    raw, _, _ = prepare(LOCAL_LEARNING, None, None, space, SearchConstraints())
    kept = default_simulate({**raw, "parallelism": rows[0]["parallelism"]})
    other = default_simulate({**raw, "parallelism": rows[0]["folded_layouts"][0]})
    for key in ("fits", "step_time_s", "peak_memory_gib", "memory_per_stage_gib", "time_breakdown_s"):
        assert other[key] == kept[key], key
