"""What ``simulate``'s layout line and ``search``'s / ``scale``'s tables show of ``parallelism:``: only the fields the
run's strategy kind reads (``simulator.strategies.registry.layout_fields_read``: a kind's
``searched_layout_fields``, plus ``dp`` where it runs spmd's layout inside).

Until the twelfth session every kind's line printed spmd's whole layout: ``swarm-t4-preemptible.yaml`` said
``tp=1 pp=7 dp=1 cp=1 ep=1 vp=1 1f1b zero=0 recompute=full sp=False mbs=1 gbs=128`` although swarm runs GPipe
(it sets the schedule itself) and never reads tp, cp, ep, vp, zero or dp; DAPPLE's examples said
``layers/stage [40]`` for two stages of 31 and 9 layers. Each test below runs one example of every strategy kind
under ``examples/`` (the set of kinds is read from the files, so a new kind's example joins it).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from simulator.explore.scaling import render_table as scale_table
from simulator.report.result import LAYOUT_LINE, render_table, unwrap_table
from simulator.report.search_table import render_table as search_table
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.strategies.registry import get_kind, layout_fields_read, load_kinds

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))

#: Overrides that keep an example quick (none of them is a field the line shows but the batch, checked by value).
QUICK = {"swarm-t4-preemptible.yaml": ["parallelism.global_batch_size=16", "simulation.steps=1"]}


def _kind_of(path: Path) -> str:
    return ((yaml.safe_load(path.read_text()) or {}).get("strategy") or {}).get("kind", "spmd")


def _first_example_of_each_kind() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for path in EXAMPLES:
        out.setdefault(_kind_of(path), path)
    return out


KIND_EXAMPLES = _first_example_of_each_kind()


@pytest.fixture(scope="module")
def results():
    return {kind: simulate(load_scenario(str(path), overrides=QUICK.get(path.name, [])))
            for kind, path in KIND_EXAMPLES.items()}


def _layout_fields(line: str) -> dict[str, str]:
    """The layout line's ``key=value`` pairs, the schedule (a bare word) under ``schedule``."""
    body = line.split("layout", 1)[1].split()
    return {(part.split("=", 1)[0] if "=" in part else "schedule"): (part.split("=", 1)[1] if "=" in part else part)
            for part in body}


def _line(table: str, label: str) -> str | None:
    return next((x for x in unwrap_table(table) if x.startswith(f"  {label} ")), None)


def test_every_kind_has_an_example():
    assert set(KIND_EXAMPLES) == set(load_kinds())


@pytest.mark.parametrize("kind", sorted(KIND_EXAMPLES))
def test_the_layout_line_shows_exactly_the_fields_the_kind_reads(kind, results):
    result = results[kind]
    scenario = load_scenario(str(KIND_EXAMPLES[kind]), overrides=QUICK.get(KIND_EXAMPLES[kind].name, []))
    read = layout_fields_read(get_kind(kind), scenario.strategy)
    assert result.layout_fields_read == read
    labels = {name: label or "schedule" for name, label in LAYOUT_LINE}
    expected = {labels[name] for name, _ in LAYOUT_LINE if read is None or name in read}
    shown = _layout_fields(_line(render_table(result), "layout"))
    assert set(shown) == expected
    par = result.parallelism
    for name, _ in LAYOUT_LINE:  # each shown value is the resolved layout's
        if labels[name] in shown:
            assert shown[labels[name]].split("[")[0] == str(par.get(name, 1)), name
    if kind == "spmd":
        assert read is None and len(shown) == len(LAYOUT_LINE)
    else:
        assert read is not None and len(shown) < len(LAYOUT_LINE)


def test_swarms_line_has_no_schedule_and_no_degree_it_does_not_read(results):
    line = _line(render_table(results["swarm"]), "layout")
    assert line.split() == ["layout", "pp=7", "recompute=full", "mbs=1", "gbs=16"]
    assert "1f1b" not in line and "gpipe" not in line  # swarm sets GPipe itself (swarm.py _pricing_scenario)


def test_layers_per_stage_is_the_kinds_own():
    dapple = simulate(load_scenario(str(ROOT / "examples" / "vgg16-dapple-v100.yaml")))
    assert _line(render_table(dapple), "layers/stage") == "  layers/stage   [31, 9] (replicas: [8, 8])"
    per_layer = simulate(load_scenario(str(ROOT / "examples" / "vgg16-per-layer-8xa100.yaml")))
    assert _line(render_table(per_layer), "layers/stage") is None  # no stages: each layer split its own way


def test_the_strategy_line_says_what_the_layout_line_holds(results):
    for kind, result in results.items():
        line = _line(render_table(result), "strategy")
        if kind == "spmd":
            assert line is None
        else:
            assert line == (f"  strategy       {kind} (the layout line shows the `parallelism:` fields it reads; its "
                            "`strategy:` block sets the rest)")


def _header(table: str) -> list[str]:
    return table.splitlines()[0].split()


@pytest.mark.parametrize("kind", sorted(KIND_EXAMPLES))
def test_search_and_scale_tables_show_the_layout_columns_the_kind_reads(kind, results):
    result = results[kind]
    read = result.layout_fields_read
    row = {**result.to_dict(), "engine_step_time_s": result.step_time_s}
    search_columns = {"tp": "tp", "pp": "pp", "dp": "dp", "cp": "cp", "ep": "ep", "virtual_stages": "vp",
                      "schedule": "sched", "zero_stage": "zero", "recompute": "recomp", "sequence_parallel": "sp",
                      "micro_batch_size": "mbs"}
    head = _header(search_table([row], read=read))
    layout_head = head[1:head.index("samples/s")]
    assert layout_head == [h for name, h in search_columns.items() if read is None or name in read]
    # one cell per column ("engine s", "fast s" and "mem GiB" are two words each)
    assert len(search_table([row], read=read).splitlines()[1].split()) == len(head) - 3
    scale_row = {**result.parallelism, "num_gpus": result.num_gpus, "samples_per_s": result.samples_per_s,
                 "tokens_per_s": result.tokens_per_s, "tokens_per_s_per_gpu": None, "mfu": result.mfu,
                 "scaling_efficiency": 1.0, "step_time_s": result.step_time_s, "fits": True}
    scale_columns = {"tp": "tp", "pp": "pp", "dp": "dp", "virtual_stages": "vp", "micro_batch_size": "mbs",
                     "zero_stage": "zero", "recompute": "recomp"}
    head = _header(scale_table([scale_row], read=read))
    assert head[2:head.index("samples/s")] == [h for name, h in scale_columns.items() if read is None or name in read]


def test_spmds_search_table_is_unchanged_by_the_filter(results):
    # read None (spmd) and every field read print the same table: the filter only drops columns
    row = {**results["spmd"].to_dict(), "engine_step_time_s": results["spmd"].step_time_s}
    every = frozenset(name for name, _ in LAYOUT_LINE) | {"pp_split"}
    assert search_table([row]) == search_table([row], read=every)
    assert re.match(r" +# +tp +pp +dp +cp +ep +vp +sched +zero +recomp +sp +mbs +samples/s", search_table([row]))


def test_a_folded_run_says_so_in_the_first_line():
    # docs/engine.md's Megatron-1T: the engine folds it (one run at 69 micro-batches; two at 66 and 67 until
    # 2026-12-06); until the twelfth session only --json's engine_fold said so
    mega = ["model=gpt-1t", "cluster.num_gpus=3072", "parallelism.tp=8", "parallelism.pp=64",
            "parallelism.virtual_stages=1", "parallelism.schedule=1f1b", "parallelism.global_batch_size=3072",
            "parallelism.micro_batch_size=1", "parallelism.recompute=full", "training.seq_length=2048"]
    result = simulate(load_scenario(None, overrides=mega))
    counts = result.extra["engine_fold"]["micro_batches_evaluated"]
    first = unwrap_table(render_table(result))[0]
    assert first.endswith(f"(symmetric mode, engine, folded from {' and '.join(map(str, counts))} micro-batches)")


def test_an_unfolded_run_says_nothing_of_folding(results):
    assert all("folded" not in unwrap_table(render_table(r))[0] for r in results.values())


def test_the_memory_heading_names_a_stage_only_where_there_are_several(results):
    for kind, result in results.items():
        heading = next(x for x in render_table(result).splitlines() if x.startswith("  memory per GPU"))
        if len(result.memory_per_stage_gib) > 1:
            assert heading == f"  memory per GPU (stage {result.peak_memory_stage}, the highest peak)", kind
        else:  # vgg16-per-layer, subnetwork DP, cyclic DP, ...: one stage
            assert heading == "  memory per GPU", kind
    assert any(len(r.memory_per_stage_gib) == 1 for r in results.values())
    assert any(len(r.memory_per_stage_gib) > 1 for r in results.values())
