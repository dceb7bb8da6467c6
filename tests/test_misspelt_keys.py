"""A misspelt key is answered with the key it was probably meant to be, whichever command reads it.

``simulate`` said ``parallelism.global_bach_size: unknown key; did you mean 'global_batch_size'?`` but ``search`` on
the same file said only ``unknown key`` (its layout check had no schema to suggest from), as did a sweep file's
misspelt ``gird:`` and ``clustersim.search(space={"tpp": ...})`` (named ``search.tpp``, an argument the caller
never wrote).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import clustersim
from simulator.errors import ConfigError
from simulator.explore.search import SearchConstraints, SearchSpace, prepare
from simulator.explore.sweep import load_sweep

ROOT = Path(__file__).resolve().parents[1]
RESNET = str(ROOT / "examples" / "resnet50-8xa100.yaml")


def test_search_suggests_the_layout_key():
    with pytest.raises(ConfigError) as err:
        prepare(RESNET, ["parallelism.global_bach_size=64"], None, SearchSpace(), SearchConstraints())
    assert err.value.field == "parallelism.global_bach_size"
    assert "did you mean 'global_batch_size'?" in err.value.reason


def test_a_sweep_file_suggests_its_key():
    with pytest.raises(ConfigError) as err:
        load_sweep({"base": RESNET, "gird": {"parallelism.micro_batch_size": [64, 128]}})
    assert err.value.field == "gird" and "did you mean 'grid'?" in err.value.reason


def test_the_python_search_names_the_argument_and_suggests():
    with pytest.raises(ConfigError) as err:
        clustersim.search(RESNET, space={"tpp": [1]})
    assert err.value.field == "space.tpp" and "did you mean 'tp' or 'pp'?" in err.value.reason
    with pytest.raises(ConfigError) as err:
        clustersim.search(RESNET, constraints={"max_tpp": 1})
    assert err.value.field == "constraints.max_tpp" and "'max_tp' or 'max_pp'" in err.value.reason
