"""``moe_layer_fixed_us`` (simulator/cost/host_floor.py): a fixed time per MoE layer and micro-batch, forward and
backward together, on the toy GPT of tests/test_simulate.py with its FFN made a mixture of experts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from simulator.scenario import load_scenario
from simulator.simulate import simulate

sys.path.insert(0, str(Path(__file__).parent))
from test_simulate import MODES, toy_raw  # noqa: E402

FIXED_US = 5000.0  # far above the toy's kernels (~1 ms per layer pass): the sum is easy to read


def _toy(m: int, fixed_us: float | None, moe: bool = True, **par):
    raw = toy_raw(1, global_batch_size=m, **par)
    if moe:
        raw["model"]["moe"] = {"num_experts": 4, "top_k": 2, "moe_layer_frequency": 2}  # layers 1 and 3 of 4
    if fixed_us is not None:
        raw["cluster"]["node"]["accelerator"]["efficiency"]["moe_layer_fixed_us"] = fixed_us
    return load_scenario(raw)


@pytest.mark.parametrize(("mode", "detail"), MODES)
@pytest.mark.parametrize("m", [1, 3])
def test_each_moe_layer_and_micro_batch_adds_the_fixed_time(mode, detail, m):
    # one GPU, no pipeline: the step is the sum of its passes, and each of the 2 MoE layers' forward + backward
    # of each micro-batch takes FIXED_US more; the dense layers, the embedding and the head take what they took
    plain = simulate(_toy(m, None), mode=mode, detail=detail)
    fixed = simulate(_toy(m, FIXED_US), mode=mode, detail=detail)
    assert fixed.step_time_s - plain.step_time_s == pytest.approx(m * 2 * FIXED_US * 1e-6, rel=1e-9)
    assert fixed.time_breakdown_s["host_stall"] == pytest.approx(m * 2 * FIXED_US * 1e-6, rel=1e-9)
    assert plain.time_breakdown_s["host_stall"] == 0.0


def test_a_dense_model_is_untouched():
    assert (simulate(_toy(2, FIXED_US, moe=False)).step_time_s
            == pytest.approx(simulate(_toy(2, None, moe=False)).step_time_s, rel=1e-12))


def test_zero_adds_nothing_and_a_negative_time_is_refused():
    assert simulate(_toy(2, 0.0)).step_time_s == pytest.approx(simulate(_toy(2, None)).step_time_s, rel=1e-12)
    from simulator.errors import ConfigError

    with pytest.raises((ConfigError, ValueError)):
        _toy(2, -1.0)
