"""Framework memory overhead (simulator/memory/overhead.py): the fitted map from the analytic
breakdown to the peak a framework reports, and the fit decision it drives."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.errors import ConfigError
from simulator.memory.analytic import GIB, MemoryBreakdown, peak_rank_memory, usable_hbm_bytes
from simulator.memory.overhead import MemoryOverhead, fits_with_overhead, framework_peak, framework_peak_bytes
from simulator.scenario import load_scenario

BREAKDOWN = MemoryBreakdown(weights_bytes=10 * GIB, gradients_bytes=20 * GIB, optimizer_bytes=40 * GIB,
                            activations_bytes=8 * GIB, other_bytes=1 * GIB)


def test_peak_applies_each_factor_to_its_kind():
    overhead = MemoryOverhead(framework="toy", states_factor=1.5, optimizer_factor=1.25,
                              activations_factor={"fused": 2.0, "unfused": 3.0}, constant_gib=-0.5, source="toy")
    # 1.5·(10 + 20) + 1.25·40 + 2·8 + 1 - 0.5 = 45 + 50 + 16 + 0.5 = 111.5 GiB
    assert framework_peak_bytes(BREAKDOWN, overhead, "fused") == pytest.approx(111.5 * GIB)
    assert framework_peak_bytes(BREAKDOWN, overhead, "unfused") == pytest.approx(119.5 * GIB)


def test_unknown_variant_is_a_config_error_naming_the_field():
    overhead = MemoryOverhead(framework="toy", activations_factor={"fused": 2.0}, source="toy")
    with pytest.raises(ConfigError) as err:
        framework_peak_bytes(BREAKDOWN, overhead, "unfused")
    assert "activations_factor" in str(err.value) and "fused" in str(err.value)


@given(weights=st.floats(0, 1e12), grads=st.floats(0, 1e12), opt=st.floats(0, 1e12), acts=st.floats(0, 1e12),
       other=st.floats(0, 1e11))
def test_the_default_overhead_is_the_plain_breakdown(weights, grads, opt, acts, other):
    b = MemoryBreakdown(weights, grads, opt, acts, other)
    assert framework_peak_bytes(b, MemoryOverhead(framework="plain", source="none")) == pytest.approx(b.total_bytes)


def test_fit_decision_on_the_default_scenario():
    scenario = load_scenario()
    _, _, stages = peak_rank_memory(scenario)
    usable = usable_hbm_bytes(scenario)
    stage, peak = framework_peak(scenario, MemoryOverhead(framework="plain", source="none"))
    assert peak == pytest.approx(max(b.total_bytes for b in stages)) and stages[stage].total_bytes == pytest.approx(peak)
    # A constant that leaves exactly the usable HBM still fits; one byte more does not.
    exact = (usable - peak) / GIB
    ok, peak_gib, reason = fits_with_overhead(scenario, MemoryOverhead(framework="toy", constant_gib=exact, source="t"))
    assert ok and reason is None and peak_gib == pytest.approx(usable / GIB)
    ok, _, reason = fits_with_overhead(scenario, MemoryOverhead(framework="toy", constant_gib=exact + 1e-6, source="t"))
    assert not ok and reason.startswith("toy: needs") and "fitted overhead" in reason


def test_later_microbatches_in_flight_count_their_factor():
    # later_microbatch_factor β = 0.5 with F = 4 in flight: activations weigh (1 + 0.5·3) / 4 = 0.625,
    # so 2 · 8 GiB · 0.625 = 10 GiB in place of 16; one micro-batch in flight is unaffected.
    overhead = MemoryOverhead(framework="toy", activations_factor={"default": 2.0}, later_microbatch_factor=0.5,
                              source="toy")
    states_and_other = (10 + 20 + 40 + 1) * GIB
    assert framework_peak_bytes(BREAKDOWN, overhead, in_flight=4) == pytest.approx(states_and_other + 10 * GIB)
    assert framework_peak_bytes(BREAKDOWN, overhead, in_flight=1) == pytest.approx(states_and_other + 16 * GIB)


@given(in_flight=st.floats(1, 64))
def test_with_the_default_factor_the_in_flight_count_does_not_matter(in_flight):
    overhead = MemoryOverhead(framework="toy", activations_factor={"default": 1.7}, source="toy")
    assert framework_peak_bytes(BREAKDOWN, overhead, in_flight=in_flight) == pytest.approx(
        framework_peak_bytes(BREAKDOWN, overhead))


def test_framework_peak_weighs_each_stage_by_its_own_in_flight_count():
    # The default scenario is an interleaved pipeline (pp 8, 2 chunks): each stage has its own count.
    from simulator.memory.analytic import microbatches_in_flight

    scenario = load_scenario()
    par = scenario.parallelism
    _, _, stages = peak_rank_memory(scenario)
    overhead = MemoryOverhead(framework="toy", later_microbatch_factor=0.0, source="toy")
    expected = [b.total_bytes - b.activations_bytes + b.activations_bytes / microbatches_in_flight(
        par.schedule, par.pp, i, par.num_micro_batches, par.virtual_stages) for i, b in enumerate(stages)]
    stage, peak = framework_peak(scenario, overhead)
    assert par.pp > 1 and peak == pytest.approx(max(expected)) and expected[stage] == pytest.approx(peak)
