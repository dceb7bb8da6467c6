"""Every example scenario loads and simulates; the built-in default is the commented example."""

from pathlib import Path

import pytest

from simulator.scenario import DEFAULT_SCENARIO, load_scenario
from simulator.simulate import simulate

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_default_scenario_is_the_commented_example():
    assert DEFAULT_SCENARIO.read_text() == (EXAMPLES / "gpt3-175b-1024-a100.yaml").read_text()


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_example_runs_and_fits(path):
    result = simulate(load_scenario(path))
    assert result.fits, result.infeasible_reason
    assert 0 < result.mfu < 1
    assert sum(result.time_breakdown_s.values()) == pytest.approx(result.step_time_s, rel=1e-9)
