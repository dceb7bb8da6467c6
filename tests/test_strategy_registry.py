"""The strategy registry: kinds by name, the default kind, duplicates and unknown kinds refused."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel, TypeAdapter

from simulator.errors import ConfigError
from simulator.scenario import load_raw, load_scenario
from simulator.simulate import simulate
from simulator.strategies.registry import (
    StrategyKind,
    get_kind,
    kind_summaries,
    load_kinds,
    parse_strategy,
    register,
    strategy_union,
)


def test_spmd_is_the_default_and_explicit_spmd_is_the_same_step():
    raw, _ = load_raw(None)
    raw["parallelism"]["pp"] = 2
    raw["parallelism"]["virtual_stages"] = 1
    raw["cluster"]["num_gpus"] = 64
    implicit = load_scenario(raw)
    explicit = load_scenario({**raw, "strategy": {"kind": "spmd"}})
    assert implicit.strategy_kind == explicit.strategy_kind == "spmd"
    assert simulate(implicit).step_time_s == simulate(explicit).step_time_s


def test_a_name_registered_twice_is_an_error():
    spmd = get_kind("spmd")
    with pytest.raises(ValueError, match="registered twice"):
        register(spmd)


def test_a_config_without_its_kind_literal_is_refused():
    class Loose(BaseModel):
        kind: Literal["other"] = "other"

    with pytest.raises(ValueError, match="Literal"):
        register(StrategyKind("loose", Loose, "", compile=lambda *a, **k: None, memory=lambda s: None))
    assert "loose" not in load_kinds()


def test_unknown_kind_and_unknown_field_name_the_field():
    with pytest.raises(ConfigError, match=r"strategy\.kind: unknown kind 'nope'"):
        parse_strategy({"kind": "nope"})
    with pytest.raises(ConfigError, match=r"strategy.*unknown key"):
        parse_strategy({"kind": "spmd", "steps_per_sync": 4})
    with pytest.raises(ConfigError, match="strategy: must be a mapping"):
        parse_strategy("spmd")


def test_a_key_of_another_kind_names_the_kind_it_belongs_to():
    """``strategy.local_steps`` on an spmd scenario (a newcomer trying DiLoCo on an example): the error names
    the kind that has the field and the keys this kind has; until the tenth session it said "unknown key"."""
    with pytest.raises(ConfigError) as exc:
        parse_strategy({"kind": "spmd", "local_steps": 4})
    assert exc.value.field == "strategy.local_steps"
    assert exc.value.reason == ("unknown key: a field of strategy kind local_sgd, not spmd (set strategy.kind) "
                                "(known here: kind)")
    with pytest.raises(ConfigError) as exc:  # a key no kind has: the kind's own keys only
        parse_strategy({"kind": "local_sgd", "local_steps": 4, "xyz": 1})
    assert exc.value.reason.startswith("unknown key (known here: kind, local_steps, ")


def test_the_union_dispatches_on_kind():
    config = TypeAdapter(strategy_union()).validate_python({"kind": "spmd"})
    assert config.kind == "spmd"


def test_every_kind_is_in_the_union_and_in_help():
    from simulator.cli import build_parser

    help_text = build_parser().format_help()
    for name in ("spmd", "async_pipeline", "local_learning", "cyclic_dp"):
        assert TypeAdapter(strategy_union()).validate_python({"kind": name}).kind == name
        assert f"  {name} " in help_text


def test_the_summaries_read_from_source_are_the_registered_ones():
    # clustersim --help lists kind_summaries() (read from the modules' source, nothing imported)
    assert kind_summaries() == {name: kind.summary for name, kind in load_kinds().items()}
    from simulator.explore.planners import load_planners, planner_summaries

    assert planner_summaries() == {name: p.summary for name, p in load_planners().items()}


def test_a_call_that_is_not_literal_is_not_read(tmp_path, monkeypatch):
    from simulator.registry_source import literal_call_fields

    (tmp_path / "kind_a.py").write_text('SUMMARY = "x"\nA = register(StrategyKind(name="a", summary=SUMMARY))\n')
    (tmp_path / "kind_b.py").write_text('# StrategyKind(name="no") in a comment\nB = StrategyKind(\n    name="b",  # c)\n'
                                        '    summary="one (line) " "two",\n    compile=f)\nC = StrategyKind(name="c")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    assert literal_call_fields("kind_a", "StrategyKind", ("name", "summary")) is None
    assert literal_call_fields("kind_b", "StrategyKind", ("name", "summary")) == {"name": "b", "summary": "one (line) two"}
    assert literal_call_fields("kind_missing", "StrategyKind", ("name", "summary")) is None
