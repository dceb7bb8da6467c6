"""Three gaps of the per_layer kind and its planners (issue 22; session 8's audit):

1. ``clustersim search`` on a per_layer scenario varied spmd's layout fields, which per_layer never reads
   (each layer runs on its own split; there are no stages or micro-batches): VGG-16's per-layer example
   came back as 20 rows of one plan (pp 4 and 8, micro-batches 2 to 32, all 11,809.8 samples/s). The
   search now keeps every field the kind does not read at the scenario's value
   (``StrategyKind.searched_layout_fields``), says so in a NOTE, and refuses a ``--space`` or
   ``--constraint`` on such a field naming it.
2. A cut of ``strategy.default`` that the layers taking the default cannot make folds into batch; on a
   decoder LLM (transformer blocks without shapes) ``default: {heads: 8}`` ran every layer batch-split
   without a word. A default cut that no such layer can make is refused naming the field; one that some
   make is kept, and the result says what each layer runs and where the default folded.
3. The adaptive planner simulated pipeline candidates that its memory model would have ruled out (Llama-3-70B
   on 64 GB200s: every pipeline needs 300+ GiB a GPU); they are now pruned before simulation, counted
   in the plan's header.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.errors import ConfigError
from simulator.explore.planners import get_planner
from simulator.explore.planners.component_pipeline import memory_reason, pick_to_simulate, pipeline_candidates
from simulator.explore.planners.components import find_components
from simulator.explore.planners.oracle import Oracle, per_layer_pricer
from simulator.explore.search import SearchConstraints, SearchSpace, search
from simulator.explore.sweep import absolutize
from simulator.scenario import build_scenario, load_raw
from simulator.simulate import simulate

ROOT = Path(__file__).resolve().parents[1]
VGG = ROOT / "examples" / "vgg16-per-layer-8xa100.yaml"
BERT = ROOT / "examples" / "bert-large-per-layer-8xa100.yaml"
RESNET = ROOT / "examples" / "resnet50-domain-parallel-8xa100.yaml"
GB200 = ROOT / "examples" / "llama3-70b-gb200-nvl72.yaml"


def _raw(path: Path) -> dict:
    raw, base = load_raw(path)
    return absolutize(raw, base)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simulator", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)


def _gpt(default: dict) -> dict:
    return {"name": "gpt-per-layer", "model": "gpt-1.7b", "cluster": {"node": "dgx-a100-80g", "num_gpus": 8},
            "parallelism": {"global_batch_size": 16}, "training": {"precision": "bf16"},
            "strategy": {"kind": "per_layer", "default": default}}


# ----------------------------------------------------------------------------- 1. search


def _layout_key(row: dict) -> str:
    return json.dumps(row["parallelism"], sort_keys=True)


def test_search_on_a_per_layer_scenario_returns_one_row_per_plan_it_can_run():
    notes: list[str] = []
    rows = search(str(VGG), workers=1, notes=notes)
    # was 1,296 candidates, 20 of them timed: the same 11,809.8 samples/s under 20 layouts
    assert len(rows) == 1 and rows[0]["fits"]
    assert rows[0]["samples_per_s"] == pytest.approx(simulate(build_scenario(_raw(VGG))).samples_per_s, rel=1e-12)
    assert len(notes) == 1 and notes[0].startswith("strategy kind per_layer reads global_batch_size, "
                                                   "overlap_grad_reduce of the search's layout fields; tp, pp, cp")
    assert "--planner pase|deeppool|adaptive" in notes[0]


def test_search_varies_what_per_layer_reads_and_every_row_is_a_distinct_plan():
    rows = search(str(BERT), workers=1, space=SearchSpace(global_batch_size=[16, 32], overlap_grad_reduce=[True, False]))
    assert len(rows) == 4 and all(r["fits"] for r in rows)
    assert len({_layout_key(r) for r in rows}) == 4
    assert {(r["parallelism"]["global_batch_size"], r["parallelism"]["overlap_grad_reduce"]) for r in rows} == {
        (16, True), (16, False), (32, True), (32, False)}
    # the fields per_layer does not read are the scenario's in every row
    assert {(r["parallelism"]["pp"], r["parallelism"]["micro_batch_size"], r["parallelism"]["tp"]) for r in rows} == {
        (1, 1, 1)}
    # each global batch runs its own plan (steps differ), not a copy
    steps = {r["parallelism"]["global_batch_size"]: r["step_time_s"] for r in rows if r["parallelism"]["overlap_grad_reduce"]}
    assert steps[16] < steps[32]


def test_a_per_layer_strategy_that_sets_its_own_overlap_does_not_search_the_layout_switch():
    raw = _raw(BERT)
    raw["strategy"]["overlap_gradient_reduction"] = True
    with pytest.raises(ConfigError) as err:
        search(raw, workers=1, space=SearchSpace(overlap_grad_reduce=[True, False]))
    assert err.value.field == "--space overlap_grad_reduce"


@pytest.mark.parametrize(("flag", "value", "field"), [
    ("--space", "pp=1,2", "--space pp"),
    ("--space", "micro_batch_size=4", "--space micro_batch_size"),
    ("--space", "zero_stage=0,1", "--space zero_stage"),
    ("--constraint", "max_dp=2", "--constraint max_dp"),
])
def test_search_refuses_a_field_per_layer_does_not_read_naming_it(flag, value, field):
    done = _cli("search", str(VGG), flag, value)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"clustersim: error: {field}: strategy kind per_layer does not read")


def test_search_accepts_the_scenarios_own_value_of_an_unread_field():
    rows = search(str(VGG), workers=1, space=SearchSpace(pp=[1], zero_stage=[0]), constraints=SearchConstraints())
    assert len(rows) == 1 and rows[0]["fits"]


def test_spmd_search_space_is_unchanged():
    # a kind that reads every field (spmd) gets spmd's enumeration and no note
    from simulator.explore.search import prepare

    notes: list[str] = []
    raw = _raw(VGG)
    raw.pop("strategy")
    _, _, candidates = prepare(raw, None, None, SearchSpace(), SearchConstraints(), notes=notes)
    assert len(candidates) == 1296 and notes == []


# ----------------------------------------------------------------------------- 2. defaults


@pytest.mark.parametrize("field", ["heads", "channels", "reduction"])
def test_a_default_cut_no_decoder_block_can_make_is_refused_naming_the_field(field):
    with pytest.raises(ConfigError) as err:
        simulate(build_scenario(_gpt({field: 8})))
    assert err.value.field == f"strategy.default.{field}"
    assert "transformer_block x24" in str(err.value) and "give {batch: 8} to mean that" in str(err.value)


def test_the_refusal_is_one_line_and_exit_2(tmp_path):
    import yaml

    path = tmp_path / "gpt.yaml"
    path.write_text(yaml.safe_dump(_gpt({"heads": 2, "batch": 4})))
    done = _cli("simulate", str(path))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert done.stderr.startswith("clustersim: error: strategy.default.heads: no layer of gpt-1.7b that takes the "
                                  "default can be split by heads")


def test_a_batch_default_on_a_decoder_still_runs():
    result = simulate(build_scenario(_gpt({"batch": 8})))
    assert result.fits and result.extra["per_layer_splits"] == {"runs": {"batch8": 26}, "folded": []}


def test_a_default_some_layers_take_is_kept_and_the_result_says_where_it_folded():
    raw = _raw(RESNET)
    raw["strategy"] = {"kind": "per_layer", "uneven": "round_up", "default": {"batch": 2, "rows": 2, "cols": 2}}
    result = simulate(build_scenario(raw))
    report = result.extra["per_layer_splits"]
    assert report["runs"] == {"batch2xrows2xcols2": 172, "batch8": 3}
    assert report["folded"] == [{"default": "batch2xrows2xcols2", "runs": "batch8",
                                 "layers": {"adaptive_avgpool": 1, "flatten": 1, "linear": 1}}]
    from simulator.report.result import render_table, unwrap_table

    table = "\n".join(unwrap_table(render_table(result)))  # its lines wrapped at 110 columns joined back
    assert "  splits         batch2xrows2xcols2 on 172 layers, batch8 on 3 layers\n" in table
    assert ("strategy.default batch2xrows2xcols2 runs as batch8 on 3 layers that cannot make its cut: "
            "adaptive_avgpool x1, flatten x1, linear x1") in table


def test_the_bert_example_says_what_each_layer_splits():
    result = simulate(build_scenario(_raw(BERT)))
    assert result.extra["per_layer_splits"] == {
        "runs": {"batch8": 160, "heads8": 24, "channels8": 48, "reduction8": 24}, "folded": []}


# ----------------------------------------------------------------------------- 3. adaptive pruning


def test_adaptive_prunes_pipelines_by_memory_before_simulating_them():
    result = get_planner("adaptive").run(_raw(GB200), {})
    details = result.details
    assert details["pipelines_pruned_by_memory"] > 0
    assert details["pipelines_pruned_by_memory"] + details["pipelines_pruned_invalid"] == details["pipelines_estimated"]
    assert details["pipeline"] == {}  # none could run: none simulated
    header = result.header()
    assert (f"# pipelines: {details['pipelines_pruned_by_memory']} pruned by the memory model before simulating "
            f"(best estimate first, of the {details['pipelines_estimated']} estimated; 0 simulated)") in header
    assert "stages count from 0" in header


def test_the_pruning_is_the_oracles_own_memory_verdict():
    # every candidate the check prunes, the oracle would have found out of memory; every one it keeps fits
    raw = _raw(GB200)
    _, pricer = per_layer_pricer(raw)
    candidates, _ = pipeline_candidates(raw, find_components(pricer.graph), 4)
    oracle = Oracle()
    for candidate in candidates[:3]:
        verdict = memory_reason(candidate.raw(raw))
        evaluation = oracle.evaluate(candidate.raw(raw))
        assert verdict is not None and verdict[0] == "memory" and not evaluation.fits
        assert verdict[1] == evaluation.reason
    vgg = _raw(VGG)
    _, pricer = per_layer_pricer(vgg)
    candidates, _ = pipeline_candidates(vgg, find_components(pricer.graph), 4)
    picked, pruned = pick_to_simulate(candidates, 2, vgg)
    assert pruned == [] and picked == pick_to_simulate(candidates, 2)[0]
    assert all(oracle.evaluate(c.raw(vgg)).fits for c in picked)
