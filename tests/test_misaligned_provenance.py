"""The misaligned-GEMM factor says where it comes from (issue 23: what was not measured stays marked *assumed* and
says so in the output). ``misaligned_gemm_factor`` is 0.69 on H100, fitted on the H100 torch.bmm d_ff sweep
(``misaligned_gemm_factor_source``), carried to the other Hopper boards, and 1.0 by the schema default elsewhere
(no penalty assumed). A run with a GEMM priced with the factor (simulator/cost/compute.py
``ComputeModel.misaligned_gemm``) lists it; a run without one prints nothing new."""

from __future__ import annotations

import dataclasses

import pytest

from hardware_specs.catalog import ACCELERATORS
from simulator.cost.compute import ComputeModel
from simulator.cost.provenance import (
    ASSUMED,
    CALIBRATED,
    DERIVED,
    MISALIGNED,
    efficiency_provenance,
    efficiency_states,
    has_misaligned_gemm,
    provenance_state,
)
from simulator.report.result import render_table, unwrap_table
from simulator.scenario import load_scenario

H100_SOURCE = ACCELERATORS.get("h100-sxm-80g").efficiency.misaligned_gemm_factor_source


def _scenario(model: str, node: str, precision: str = "bf16", **training):
    return load_scenario({"model": model, "cluster": {"node": node, "num_gpus": 8},
                          "parallelism": {"global_batch_size": 8}, "training": {"precision": precision, **training}})


def _efficiency_lines(scenario) -> dict[str, str]:
    """``clustersim simulate``'s "efficiencies" lines by their head (calibrated / derived / stated / ASSUMED)."""
    from clustersim import simulate

    text = unwrap_table(render_table(simulate(scenario)))
    lines = [line.strip() for line in text]
    start = next(i for i, line in enumerate(lines) if line.startswith("efficiencies"))
    out = {}
    for line in lines[start:start + 4]:
        line = line.removeprefix("efficiencies").strip()
        out[line.split(" ")[0]] = line
    return out


def test_the_h100_spec_and_the_catalog_agree():
    assert H100_SOURCE and "gemm_microbench.csv rows" in H100_SOURCE
    assert ACCELERATORS.get("h100-sxm-80g").efficiency.misaligned_gemm_factor < 0.75
    b200 = ACCELERATORS.get("b200").efficiency
    assert b200.misaligned_gemm_factor == 1.0 and b200.misaligned_gemm_factor_source is None


def test_a_misaligned_run_on_h100_lists_the_factor_calibrated_with_its_rows():
    # ResNet-50's stem convolution (3 input channels: K = 147) is priced on the bf16 GEMM curve on H100 (its
    # convolution model is TF32 only): a misaligned stride
    scenario = _scenario("resnet50", "dgx-h100")
    assert has_misaligned_gemm(scenario)
    provenance = efficiency_provenance(scenario)
    assert provenance[MISALIGNED] == H100_SOURCE
    assert provenance_state(provenance[MISALIGNED]) == (CALIBRATED, "")
    assert efficiency_states(provenance)[MISALIGNED] == CALIBRATED
    lines = _efficiency_lines(scenario)
    assert MISALIGNED in lines["calibrated"]
    assert MISALIGNED not in lines["ASSUMED"]


def test_a_misaligned_run_on_b200_lists_the_factor_assumed_as_no_penalty():
    scenario = _scenario("resnet50", "dgx-b200")
    assert has_misaligned_gemm(scenario)
    provenance = efficiency_provenance(scenario)
    assert provenance[MISALIGNED] == ASSUMED
    assert efficiency_states(provenance)[MISALIGNED] == ASSUMED
    lines = _efficiency_lines(scenario)
    assert f"{MISALIGNED} (1.0: no penalty assumed)" in lines["ASSUMED"]
    assert MISALIGNED not in lines["calibrated"]


def test_another_hopper_board_carries_the_h100_factor_as_derived():
    scenario = _scenario("resnet50", "hgx-h200")
    state, source = provenance_state(efficiency_provenance(scenario)[MISALIGNED])
    assert (state, source.split(" ")[0]) == (DERIVED, "h100-sxm-80g")
    scenario = _scenario("resnet50", "h100-pcie-8")
    state, source = provenance_state(efficiency_provenance(scenario)[MISALIGNED])
    assert (state, source.split(" ")[0]) == (DERIVED, "h100-sxm-80g")


@pytest.mark.parametrize("node", ["dgx-h100", "dgx-b200"])
def test_an_aligned_run_prints_nothing_new(node):
    scenario = _scenario("gpt-1.7b", node)
    assert not has_misaligned_gemm(scenario)
    assert MISALIGNED not in efficiency_provenance(scenario)
    assert all(MISALIGNED not in line for line in _efficiency_lines(scenario).values())


@pytest.mark.parametrize(("model", "node", "training"), [
    ("resnet50", "dgx-h100", {"precision": "bf16"}),
    ("resnet50", "dgx-a100-80g", {"precision": "fp32", "tf32": True}),
    ("vit-l-16", "dgx-h100", {"precision": "bf16", "attention": "standard"}),
    ("vit-l-16", "dgx-a100-80g", {"precision": "fp32"}),
    ("bert-large", "dgx-h100", {"precision": "fp8"}),
    ("gpt-1.7b", "dgx-h100", {"precision": "bf16"}),
    ("resnext101-32x4d", "dgx-a100-80g", {"precision": "bf16"}),
    ("efficientnet-b0", "dgx-b200", {"precision": "bf16"}),
    ("vgg16", "dgx-a100-80g", {"precision": "fp32", "tf32": True}),
    ("gnmt-16", "dgx-h100", {"precision": "fp16"}),
])
def test_the_check_is_the_one_pricing_applies(model, node, training):
    """``ComputeModel.misaligned_gemm`` says an op takes the factor exactly where its priced time depends on it:
    each op of the graph priced with the spec's factor set to 0.01 and to 1.0."""
    scenario = load_scenario({"model": model, "cluster": {"node": node, "num_gpus": 8},
                              "parallelism": {"global_batch_size": 8}, "training": training})
    accel = scenario.accelerator
    eff = accel.efficiency

    def model_with(factor: float) -> ComputeModel:
        part = accel.model_copy(update={"efficiency": eff.model_copy(update={"misaligned_gemm_factor": factor})})
        tr = scenario.training
        return ComputeModel(part, tr.precision, tr.fp8_gemms, tr.fp8_recipe, tf32=tr.tf32)

    slow, fast, check = model_with(0.01), model_with(1.0), model_with(eff.misaligned_gemm_factor)
    ops = [op for layer in scenario.layer_graph().layers for op in (*layer.forward, *layer.backward)
           if op.kind != "collective"]
    flagged = [op for op in ops if check.misaligned_gemm(op)]
    for op in ops:
        if op in flagged:
            assert slow.time_s(op) >= fast.time_s(op), op.name
        else:
            assert slow.time_s(op) == fast.time_s(op), op.name
    # a flagged op is slower unless memory-bound even at 1% of the curve
    assert any(slow.time_s(op) > fast.time_s(op) for op in flagged) or not flagged
    assert bool(flagged) == has_misaligned_gemm(scenario)
    if model == "gpt-1.7b":
        assert not flagged


def test_a_mixed_cluster_lists_it_per_node_group():
    scenario = load_scenario("examples/mixed-a100-t4.yaml")
    provenance = efficiency_provenance(scenario)
    for group in scenario.groups:
        one = dataclasses.replace(scenario, node=group.node, accelerator=group.accelerator, node_groups=())
        assert (f"{group.node.name}:{MISALIGNED}" in provenance) == has_misaligned_gemm(one)
