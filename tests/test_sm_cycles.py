"""Work counted in SM cycles (``efficiency.conv_sm_cycles_per_byte``, set by a framework profile: Lambda's fp16
ResNet-50) runs at the part's SMs x clock (``sm_count``, ``sm_clock_mhz``); a part derived by rule from another
(``derived_from``) takes that part's framework entry (simulator/cost/framework.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from hardware_specs.catalog import ACCELERATORS
from hardware_specs.framework import FrameworkEntry, FrameworkProfile
from hardware_specs.schema import Accelerator
from simulator.cost.compute import ComputeModel
from simulator.cost.framework import ASSUMED, DERIVED, choose_in
from validation.derive_parts import DERIVED_PARTS
from workloads.graph import Op

#: Dense FP16 tensor FLOP per SM per clock by architecture (NVIDIA whitepapers: Volta 8 tensor cores x 64 FMA,
#: Ampere 4 x 256 FMA, Hopper 4 x 512 FMA; x2 FLOP per FMA).
FLOP_PER_SM_CLOCK = {"v100": 1024, "a100": 2048, "h100": 4096, "h200": 4096, "gh200": 4096, "h800": 4096}


def _recorded() -> list[str]:
    return [n for n in ACCELERATORS.names() if ACCELERATORS.get(n).sm_count is not None]


@pytest.mark.parametrize("name", _recorded())
def test_sm_count_times_clock_is_the_datasheet_dense_peak(name):
    acc = ACCELERATORS.get(name)
    per_sm = FLOP_PER_SM_CLOCK[name.split("-")[0]]
    assert acc.sm_count * acc.sm_clock_mhz * 1e6 * per_sm == pytest.approx(acc.peak_tflops["fp16"] * 1e12, rel=0.005)
    assert acc.sm_cycles_per_s == acc.sm_count * acc.sm_clock_mhz * 1e6


def test_the_parts_lambdas_rows_ran_on_record_their_sms():
    assert {"v100-sxm2-16g", "a100-sxm-80g", "a100-pcie-80g", "a100-pcie-40g", "h100-sxm-80g", "h100-pcie-80g",
            "h200-sxm-141g", "gh200"} <= set(_recorded())
    assert ACCELERATORS.get("h100-pcie-80g").sm_count == 114 and ACCELERATORS.get("h100-sxm-80g").sm_count == 132
    assert ACCELERATORS.get("b200").sm_cycles_per_s is None  # not recorded: work in SM cycles does not run there


@pytest.mark.parametrize("name", sorted(DERIVED_PARTS))
def test_a_derived_part_names_the_part_it_was_derived_from(name):
    assert ACCELERATORS.get(name).derived_from == DERIVED_PARTS[name]


def _with_cycles(name: str, cycles: float) -> Accelerator:
    acc = ACCELERATORS.get(name)
    return acc.model_copy(update={"efficiency": acc.efficiency.model_copy(update={"conv_sm_cycles_per_byte": cycles})})


CONV = Op(name="conv.fwd", kind="gemm", flops=2.0e9, bytes_moved=3.0e6, m=3136, n=64, k=576,
          conv=("fwd", 3, 3, 1))
MEMORY = Op(name="bn.fwd", kind="memory", flops=0.0, bytes_moved=3.0e6)


@pytest.mark.parametrize("name", ["h100-sxm-80g", "h100-pcie-80g", "v100-sxm2-16g"])
def test_a_convolution_pass_takes_its_bytes_in_sm_cycles_at_the_parts_rate(name):
    plain = ComputeModel(ACCELERATORS.get(name), "fp16")
    counted = ComputeModel(_with_cycles(name, 0.5), "fp16")
    acc = ACCELERATORS.get(name)
    extra_s = 3.0e6 * 0.5 / (acc.sm_count * acc.sm_clock_mhz * 1e6)
    assert counted.time_s(CONV) == pytest.approx(plain.time_s(CONV) + extra_s, rel=1e-12)
    assert counted.time_s(MEMORY) == plain.time_s(MEMORY)  # only convolution passes


def test_the_same_cycles_take_longer_on_fewer_slower_sms():
    # H100 PCIe: 114 SMs at 1,620 MHz against the SXM's 132 at 1,830: 1.31x the time for the same cycles
    def extra(name):
        return ComputeModel(_with_cycles(name, 0.5), "fp16").time_s(CONV) - ComputeModel(
            ACCELERATORS.get(name), "fp16").time_s(CONV)

    assert extra("h100-pcie-80g") / extra("h100-sxm-80g") == pytest.approx(132 * 1830 / (114 * 1620), rel=1e-9)


def test_cycles_on_a_part_without_sms_is_a_spec_error():
    raw = ACCELERATORS.get("b200").model_dump()
    raw["efficiency"]["conv_sm_cycles_per_byte"] = 0.3
    with pytest.raises(ValidationError, match="records no sm_count and sm_clock_mhz"):
        Accelerator.model_validate(raw)


def _entry(accelerator: str, precision: str, **factors) -> FrameworkEntry:
    return FrameworkEntry(accelerator=accelerator, precisions=[precision], fit_cases=3, fit_median_abs_error=0.01,
                          fitted_on="test rows", **factors)


def _profile(*entries: FrameworkEntry) -> FrameworkProfile:
    return FrameworkProfile(name="test-fw", description="test", source="test", entries=list(entries))


def test_a_derived_part_takes_its_base_parts_entry_even_from_a_faster_part():
    profile = _profile(_entry("h100-sxm-80g", "tf32", gemm_scale=0.77), _entry("a100-sxm-80g", "tf32", gemm_scale=1.12))
    pcie = choose_in(profile, ACCELERATORS.get("h100-pcie-80g"), "tf32")
    assert pcie.state == DERIVED and pcie.entry.accelerator == "h100-sxm-80g" and pcie.factors == {"gemm_scale": 0.77}
    assert "derived from h100-sxm-80g's by rule" in pcie.note
    # a part no rule derived takes the nearest slower part's, as before (the H200 is the H100's speed: its own)
    assert choose_in(profile, ACCELERATORS.get("h200-sxm-141g"), "tf32").entry.accelerator == "h100-sxm-80g"
    assert choose_in(profile, ACCELERATORS.get("b200"), "tf32").entry.accelerator == "h100-sxm-80g"


def test_without_a_base_entry_the_slower_donor_rule_stands():
    profile = _profile(_entry("v100-sxm2-16g", "fp16", conv_sm_cycles_per_byte=0.43),
                       _entry("a100-sxm-80g", "tf32", gemm_scale=1.12))
    a100 = choose_in(profile, ACCELERATORS.get("a100-pcie-40g"), "fp16")  # its base has no fp16 entry
    assert a100.state == DERIVED and a100.entry.accelerator == "v100-sxm2-16g"
    assert a100.factors == {"conv_sm_cycles_per_byte": 0.43}  # counted in SM cycles: carried to a faster part


def test_sm_cycles_are_left_out_where_the_part_records_no_sms():
    profile = _profile(_entry("h100-sxm-80g", "fp16", conv_sm_cycles_per_byte=0.33, sync_jitter=0.05))
    b200 = choose_in(profile, ACCELERATORS.get("b200"), "fp16")
    assert b200.state == DERIVED and b200.factors == {"sync_jitter": 0.05}
    assert "conv_sm_cycles_per_byte not applied (b200 records no sm_count and sm_clock_mhz" in b200.note
    alone = choose_in(_profile(_entry("h100-sxm-80g", "fp16", conv_sm_cycles_per_byte=0.33)),
                      ACCELERATORS.get("b200"), "fp16")
    assert alone.state == ASSUMED and alone.entry is None and "cannot run on b200" in alone.note
