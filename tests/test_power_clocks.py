"""Clocks under the board power limit (issue 23: "clock/power limits where the datasheet TDP caps
sustained clocks") for the current parts: a clock is recorded only where one was measured (MI300X,
MI325X: AMD's MAF blog, tests/test_microbench_calibration.py); elsewhere the spec says it was not,
and a run whose GEMM level was carried over from a sibling at another power limit lists the clock
as assumed."""

from __future__ import annotations

import pytest

from hardware_specs.catalog import ACCELERATORS
from simulator.cost.provenance import efficiency_provenance
from simulator.scenario import load_scenario

UNMEASURED = ("h200-sxm-141g", "b200", "b300", "gb200", "gb300", "mi355x")
#: parts whose GEMM level is B200's (1000 W) carried to another power limit
CARRIED = {"b300": 1100, "gb200": 1200, "gb300": 1400}
NODE = {"b200": "dgx-b200", "gb200": "gb200-nvl72", "mi355x": "mi355x-8", "h200-sxm-141g": "hgx-h200"}


@pytest.mark.parametrize("name", UNMEASURED)
def test_no_clock_is_claimed_without_a_measurement(name):
    accel = ACCELERATORS.get(name)
    assert accel.sustained_clock is None
    assert accel.notes.startswith(f"sustained clock under the {accel.tdp_watts:g} W limit: not measured")


@pytest.mark.parametrize("name, watts", sorted(CARRIED.items()))
def test_carried_levels_say_whose_power_limit_they_came_from(name, watts):
    accel = ACCELERATORS.get(name)
    assert accel.tdp_watts == watts != ACCELERATORS.get("b200").tdp_watts
    assert accel.efficiency.fitted_on.endswith("(sibling b200)")
    assert "assumed" in accel.notes


def test_gb200_datasheet_peak_rises_with_its_power_limit_more_than_its_measured_matmul():
    # same die: GB200 NVL72 (1200 W) 2.5 PF bf16 dense vs HGX B200 (1000 W) 2.25 PF (datasheets); the
    # MAMF best matmuls (gemm_microbench.csv rows 10 vs 8: 1822 vs 1745 TF) differ by less
    b200, gb200 = ACCELERATORS.get("b200"), ACCELERATORS.get("gb200")
    assert gb200.peak_tflops["bf16"] / b200.peak_tflops["bf16"] == pytest.approx(2500 / 2250)
    assert 1822 / 1745 < gb200.peak_tflops["bf16"] / b200.peak_tflops["bf16"]
    assert "1.044x" in gb200.notes and "1.11x" in gb200.notes


def test_mi355x_peak_is_its_datasheet_engine_clock():
    # CDNA4: 256 CUs x 4096 dense bf16 FLOP/clock at the 2400 MHz peak engine clock (MI350X: 2200 MHz)
    mi355x = ACCELERATORS.get("mi355x")
    assert 256 * 4096 * 2400e6 / 1e12 == pytest.approx(mi355x.peak_tflops["bf16"], rel=1e-3)
    assert "2400 MHz" in mi355x.notes


def _provenance(node: str) -> dict[str, str]:
    return efficiency_provenance(load_scenario({"model": "gpt-1.7b", "cluster": {"node": node, "num_gpus": 8}}))


def test_a_run_lists_the_clock_as_assumed_only_where_the_level_was_carried():
    assert _provenance("gb200-nvl72")["sustained_clock"] == "assumed"
    for name in ("b200", "mi355x", "h200-sxm-141g"):  # fitted on their own runs: the curve holds their clock
        assert "sustained_clock" not in _provenance(NODE[name])
    assert _provenance("mi300x-8")["sustained_clock"].startswith("57% of the 2100 MHz")  # measured: unchanged
