"""MoE expert GEMMs as one grouped kernel (hardware_specs.schema.GroupedGemmEfficiency, simulator/cost/compute.py):
each group a dense GEMM of its own shape over the entry's level, plus its per-group cost, the recipe's
quantisation at the entry's rate; only for the frameworks that run the measured kernel."""

from __future__ import annotations

import pytest

from hardware_specs.schema import Accelerator, ComputeEfficiency, EfficiencyPoint, GroupedGemmEfficiency
from simulator.cost.compute import QUANTISE_BYTES_PER_ELEMENT, ComputeModel
from simulator.cost.provenance import efficiency_provenance
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from workloads.graph import Op

M, N, K, GROUPS = 512, 1024, 2048, 4


def _toy(grouped: dict) -> Accelerator:
    return Accelerator(
        name="toy", vendor="test", peak_tflops={"bf16": 100, "fp8": 200}, hbm_gib=80, hbm_bandwidth_gb_per_s=1000,
        tdp_watts=500, block_scaled_formats=["mxfp8"], source="test",
        efficiency=ComputeEfficiency(gemm_curve=[EfficiencyPoint(gflop=1, efficiency=0.5)],
                                     memory_bound_efficiency=1.0, kernel_launch_overhead_us=0, source="test",
                                     grouped_gemm=grouped))


def _entry(level: float, per_group_us: float, quantise: float | None = None) -> GroupedGemmEfficiency:
    return GroupedGemmEfficiency(level=level, per_group_us=per_group_us, quantise_efficiency=quantise, kernel="k",
                                 frameworks=["torchtitan"], source="test")


def _op(name: str) -> Op:
    return Op(name, "gemm", 2.0 * M * N * K * GROUPS, 0, M, N, K, GROUPS)


def test_expert_gemms_run_at_the_grouped_level_plus_a_cost_per_group_by_hand():
    compute = ComputeModel(_toy({"bf16": _entry(0.4, 10.0)}), "bf16")
    dense_s = 2.0 * M * N * K * GROUPS / (100e12 * 0.5)
    assert compute.time_s(_op("expert_fc1")) == pytest.approx(dense_s / 0.4 + GROUPS * 10e-6, rel=1e-12)
    assert compute.time_s(_op("expert_fc2.wgrad")) == pytest.approx(dense_s / 0.4 + GROUPS * 10e-6, rel=1e-12)
    # a dense GEMM of the same shape (not an expert) keeps the curve
    assert compute.time_s(_op("fc1")) == pytest.approx(dense_s, rel=1e-12)
    # without an entry for the precision the experts are dense GEMMs of a group's shape, as before
    assert ComputeModel(_toy({"fp8": _entry(0.4, 10.0)}), "bf16").time_s(_op("expert_fc1")) == pytest.approx(dense_s)


def test_mxfp8_experts_take_the_recipe_entry_and_its_quantisation_rate_by_hand():
    compute = ComputeModel(_toy({"mxfp8": _entry(0.5, 0.0, quantise=0.25)}), "fp8", fp8_recipe="mxfp8")
    gemm_s = 2.0 * M * N * K * GROUPS / (200e12 * 0.5 * 0.5)
    quantise_s = GROUPS * (M * K + K * N) * QUANTISE_BYTES_PER_ELEMENT["mxfp8"] / (1000e9 * 0.25)
    assert compute.time_s(_op("expert_fc1")) == pytest.approx(gemm_s + quantise_s, rel=1e-12)
    # another recipe's experts do not take the mxfp8 entry
    delayed = ComputeModel(_toy({"mxfp8": _entry(0.5, 0.0, quantise=0.25)}), "fp8", fp8_recipe="delayed")
    plain = GROUPS * (M * K + K * N) * QUANTISE_BYTES_PER_ELEMENT["delayed"] / 1000e9
    assert delayed.time_s(_op("expert_fc1")) == pytest.approx(2.0 * M * N * K * GROUPS / (200e12 * 0.5) + plain)


def _mixtral_b200(framework: str, precision: str = "bf16"):
    training = {"seq_length": 4096, "precision": precision, "attention": "flash", "framework": framework}
    if precision == "fp8":
        training["fp8_recipe"] = "mxfp8"
    return load_scenario({"model": "mixtral-8x7b", "cluster": {"node": "dgx-b200", "num_gpus": 8},
                          "parallelism": {"tp": 1, "pp": 1, "dp": 8, "ep": 8, "zero_stage": 1,
                                          "micro_batch_size": 1, "global_batch_size": 64},
                          "training": training})


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_only_the_framework_that_runs_the_measured_kernel_gets_the_grouped_entry(precision):
    titan, megatron = _mixtral_b200("torchtitan", precision), _mixtral_b200("megatron-core", precision)
    key = "mxfp8" if precision == "fp8" else "bf16"
    assert key in titan.accelerator.efficiency.grouped_gemm
    assert megatron.accelerator.efficiency.grouped_gemm == {}
    assert efficiency_provenance(megatron)["grouped_gemm"] == "assumed"
    assert "gemm_microbench.csv rows" in efficiency_provenance(titan)["grouped_gemm"]


def test_a_sibling_carries_b200s_entry_as_derived():
    from simulator.cost.provenance import provenance_state
    scenario = load_scenario({"model": "mixtral-8x7b", "cluster": {"node": "gb200-nvl72", "num_gpus": 72},
                              "parallelism": {"tp": 1, "pp": 1, "dp": 72, "ep": 8, "micro_batch_size": 1,
                                              "global_batch_size": 72},
                              "training": {"seq_length": 4096, "precision": "bf16", "framework": "torchtitan"}})
    assert provenance_state(efficiency_provenance(scenario)["grouped_gemm"])[0] == "derived"


def test_torchtitan_moe_step_on_b200_is_slower_by_its_expert_gemms_only():
    titan = _mixtral_b200("torchtitan")
    dropped = titan.accelerator.model_copy(update={"efficiency": titan.accelerator.efficiency.model_copy(
        update={"grouped_gemm": {}})})
    import dataclasses
    dense = dataclasses.replace(titan, accelerator=dropped,
                                node_groups=tuple(dataclasses.replace(g, accelerator=dropped)
                                                  for g in titan.node_groups))
    with_grouped, without = simulate(titan).step_time_s, simulate(dense).step_time_s
    assert with_grouped > without
    expert = ComputeModel(titan.accelerator, "bf16").time_s(Op("expert_fc1", "gemm", 2.0 * 9830 * 28672 * 4096, 0,
                                                                 9830, 28672, 4096, 1))
    assert expert > ComputeModel(dropped, "bf16").time_s(Op("expert_fc1", "gemm", 2.0 * 9830 * 28672 * 4096, 0,
                                                            9830, 28672, 4096, 1)) * 2
