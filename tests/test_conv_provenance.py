"""A run's convolutions are listed with what they were priced on (issue 19 "convolution efficiency calibrated, not
assumed", issue 23 "say how right"). The only convolution model in the catalog is TF32, fitted on DeepPool's A100
layers (``conv_efficiency.tf32``); a 16-bit convolution, measured nowhere in this project, is priced as its implicit
GEMM on the part's 16-bit GEMM curve (fitted on transformer GEMMs), so it is *derived* by that rule, never
*calibrated*, and *assumed* where the GEMM curve itself is (simulator/cost/provenance.py ``conv_provenance``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.cost.compute import ComputeModel
from simulator.cost.provenance import ASSUMED, CALIBRATED, DERIVED, efficiency_provenance, provenance_state
from simulator.report.result import unwrap_table
from simulator.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]


def _resnet50(node: str, **training) -> dict:
    return {"model": "resnet50", "cluster": {"node": node, "num_gpus": 8},
            "parallelism": {"dp": 8, "micro_batch_size": 256, "global_batch_size": 2048},
            "training": {"precision": "bf16", **training}}


@pytest.mark.parametrize("node", ["dgx-a100-80g", "dgx-h100"])
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_16_bit_resnet50_lists_its_convolutions_as_derived_from_the_gemm_curve(node, precision):
    scenario = load_scenario(_resnet50(node, precision=precision))
    # what the compute model does: no convolution model in 16 bits, the convolutions run on the GEMM curve
    assert ComputeModel(scenario.accelerator, precision).conv_model is None
    prov = efficiency_provenance(scenario)
    state, source = provenance_state(prov[f"conv_{precision}"])
    assert state == DERIVED
    assert source == (f"the {precision} GEMM curve at each convolution's implicit-GEMM shape; no {precision} "
                      "convolution measured")
    assert prov[f"gemm_{precision}"] in prov[f"conv_{precision}"]  # the curve's own rows named with it
    assert provenance_state(prov[f"gemm_{precision}"])[0] == CALIBRATED  # the GEMM curve is measured there


def test_tf32_convolutions_keep_their_own_model_calibrated_on_a100_and_assumed_on_h100():
    a100 = efficiency_provenance(load_scenario(_resnet50("dgx-a100-80g", precision="fp32", tf32=True)))
    assert "deeppool_a100_v1_layers.csv.gz" in a100["conv_tf32"]
    assert provenance_state(a100["conv_tf32"])[0] == CALIBRATED
    h100 = efficiency_provenance(load_scenario(_resnet50("dgx-h100", precision="fp32", tf32=True)))
    assert h100["conv_tf32"] == ASSUMED


def test_convolutions_on_an_assumed_gemm_curve_are_assumed():
    # fp32 without TF32: the CUDA-core curve of the A100 is not measured, nor are its convolutions
    prov = efficiency_provenance(load_scenario(_resnet50("dgx-a100-80g", precision="fp32", tf32=False)))
    assert prov["gemm_fp32"] == ASSUMED and prov["conv_fp32"] == ASSUMED


def test_a_transformer_lists_no_convolution():
    prov = efficiency_provenance(load_scenario({"model": "llama3-8b", "cluster": {"node": "dgx-h100", "num_gpus": 8},
                                                "training": {"precision": "bf16"}}))
    assert not any(name.startswith("conv_") for name in prov)


def test_the_cli_prints_bf16_convolutions_under_derived(tmp_path):
    path = tmp_path / "resnet50-bf16.yaml"
    path.write_text("model: resnet50\ncluster: {node: dgx-h100, num_gpus: 8}\n"
                    "parallelism: {dp: 8, micro_batch_size: 256, global_batch_size: 2048}\n"
                    "training: {precision: bf16}\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "simulator", "simulate", str(path)], capture_output=True,
                          text=True, env=env, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    lines = unwrap_table(proc.stdout)  # one line per state, as printed before wrapping at 110 columns
    derived = next(line for line in lines if "derived (from another part or a ratio):" in line)
    calibrated = next(line for line in lines if "calibrated (fitted on rows measured on this part):" in line)
    assert "conv_bf16 (the bf16 GEMM curve at each convolution's implicit-GEMM shape; no bf16 convolution " \
           "measured)" in derived
    assert "conv_" not in calibrated
