"""A framework profile fitted on one kind of network run on the other kind is *derived*, never calibrated, with the
reason in the output, and without the factors that mean nothing there (issues 19 and 23): llm-foundry (fitted on MPT
decoder transformers) on a ResNet-50 drops its attention factor; dle-pytorch / lambda-pytorch (fitted on CNNs) on a
transformer drop the image input pipeline's time per sample. A run of the kind an entry was fitted on stays as it was."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hardware_specs.catalog import ACCELERATORS
from simulator.cost.framework import ASSUMED, CALIBRATED, DERIVED, choose
from simulator.report.result import unwrap_table
from workloads.catalog import resolve_model

ROOT = Path(__file__).resolve().parents[1]
RESNET = ROOT / "examples" / "resnet50-8xa100.yaml"
LLAMA = ROOT / "examples" / "llama3-8b-torchtitan-sac-h100.yaml"
A100 = ACCELERATORS.get("a100-sxm-80g")
H100 = ACCELERATORS.get("h100-sxm-80g")


def _simulate(example: Path, *sets: str) -> tuple[str, dict]:
    """The table (its wrapped lines joined back: one line per field, as the checks below read it) and --json."""
    args = [sys.executable, "-m", "simulator.cli", "simulate", str(example)]
    for item in sets:
        args += ["--set", item]
    text = "\n".join(unwrap_table(subprocess.run(args, capture_output=True, text=True, cwd=ROOT, check=True).stdout))
    data = json.loads(subprocess.run([*args, "--json"], capture_output=True, text=True, cwd=ROOT, check=True).stdout)
    return text, data


def test_a_transformer_profile_on_a_cnn_is_derived_without_its_attention_factor():
    text, data = _simulate(RESNET, "training.framework=llm-foundry")
    assert data["framework_state"] == DERIVED
    profile = data["framework_profile"]
    assert profile["across_kinds"] == {"reason": "fitted on decoder-transformer runs; resnet50 is a CNN",
                                       "not_applied": ["attention_scale"]}
    assert profile["factors"] == {"gemm_scale": 1.2523}
    assert "llm-foundry (derived): llm-foundry's factors were fitted on decoder-transformer runs; resnet50 is a CNN" in text
    assert "attention_scale not applied (this graph has no attention)" in text
    assert data["efficiency_states"]["framework_factors"].startswith("derived: ")
    assert "framework_factors" not in next(line for line in text.splitlines() if "calibrated (fitted on rows" in line)


def test_a_cnn_profile_on_a_transformer_is_derived_with_the_reason():
    text, data = _simulate(LLAMA, "training.framework=dle-pytorch")
    assert data["framework_state"] == DERIVED
    assert data["framework_profile"]["across_kinds"]["reason"] == (
        "fitted on CNN runs (resnet50, resnext101-32x4d, se-resnext101-32x4d); this model is a decoder transformer")
    assert "fitted on CNN runs (resnet50, resnext101-32x4d, se-resnext101-32x4d); this model is a decoder transformer" in text
    assert data["efficiency_states"]["framework_factors"].startswith("derived: ")


def test_a_cnn_profile_whose_only_factor_is_conv_work_gives_a_transformer_the_catalog():
    # lambda-pytorch's H100 fp16 entry is SM work beside each convolution alone (its SM cycles per conv byte)
    assert choose("lambda-pytorch", H100, "fp16", model=resolve_model("resnet50")).entry.factors.keys() == {
        "conv_sm_cycles_per_byte"}
    on_llama = choose("lambda-pytorch", H100, "fp16", model=resolve_model("llama3-8b"))
    assert on_llama.state == ASSUMED and on_llama.entry is None and on_llama.factors == {}
    assert on_llama.note.startswith("lambda-pytorch's factors were fitted on CNN runs (resnet50); this model is a "
                                    "decoder transformer: none of them carries here (its conv_sm_cycles_per_byte: an "
                                    "image input pipeline's time per sample, not a token sequence's; work beside "
                                    "convolutions, of which this model has none)")
    tf32 = choose("lambda-pytorch", H100, "tf32", model=resolve_model("llama3-8b"))
    assert tf32.state == DERIVED and tf32.factors == {"gemm_scale": 0.7671}


def test_same_kind_runs_stay_calibrated_with_no_across_kinds_field():
    _, data = _simulate(RESNET, "training.precision=fp16")  # names dle-pytorch, fitted on ResNet-50 in fp16
    assert data["framework_state"] == CALIBRATED and "across_kinds" not in data["framework_profile"]
    foundry = choose("llm-foundry", A100, "bf16", model=resolve_model("llama3-8b"))
    assert foundry.state == CALIBRATED and not foundry.across_kinds and "attention_scale" in foundry.factors


def test_a_transformer_profile_keeps_its_attention_factor_on_a_graph_with_attention():
    bert = choose("llm-foundry", A100, "bf16", model=resolve_model("bert-large"))
    assert bert.state == DERIVED and bert.factors == {"gemm_scale": 1.2523, "attention_scale": 0.5}
    assert bert.across_kinds == "fitted on decoder-transformer runs; bert-large is a layer graph with attention, " \
                                "without convolutions"
