"""Training fields a layer-graph network (workloads/networks/: CNNs, BERT, ViT) does not act on are said,
not claimed (issue 23 "FP8 as it runs", "FlashAttention unless the scenario says otherwise"; issue 19's
networks): ``precision: fp8`` where no GEMM of the model is in ``training.fp8_gemms`` prints a WARNING,
the model line says the step is priced as bf16 and the provenance lists the bf16 curves it reads, not
fp8 ones; ``training.attention`` where the graph fixes its attention kernel prints a WARNING and the
provenance lists the constant the graph's attention is priced on. End to end through ``clustersim
simulate`` (subprocesses, started together)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.cost.provenance import graph_features, network_field_warnings
from simulator.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = str(ROOT / "examples" / "resnet50-8xa100.yaml")
H100 = ["--set", "cluster.node=dgx-h100", "--set", "training.framework=megatron-core"]


@pytest.fixture(scope="module")
def runs():
    py = [sys.executable, "-m", "simulator", "simulate", EXAMPLE, *H100]
    cases = {
        "resnet_fp8": py + ["--set", "training.precision=fp8"],
        "resnet_fp8_json": py + ["--set", "training.precision=fp8", "--json"],
        "resnet_bf16_json": py + ["--set", "training.precision=bf16", "--json"],
        "bert_json": py + ["--set", "model=bert-large", "--set", "parallelism.micro_batch_size=4", "--json"],
        "vit_standard": py + ["--set", "model=vit-b-16", "--set", "training.attention=standard"],
    }
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    procs = {name: subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for name, argv in cases.items()}
    out = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{name}: {stderr}"
        out[name] = stdout
    return out


def test_fp8_on_a_cnn_says_the_step_is_bf16(runs):
    text = runs["resnet_fp8"]
    assert "  model          resnet50, fp8 (priced as bf16: no GEMM in fp8_gemms)" in text
    assert "WARNING: precision fp8: no GEMM of resnet50 runs in FP8" in text
    assert "Transformer Engine runs none in FP8" in text
    fp8, bf16 = json.loads(runs["resnet_fp8_json"]), json.loads(runs["resnet_bf16_json"])
    assert fp8["step_time_s"] == bf16["step_time_s"]  # what the warning says: bit for bit the bf16 step
    assert fp8["precision_priced"] == "bf16" and "precision_priced" not in bf16
    # the constants listed are the ones read: bf16's, none of fp8's
    assert set(fp8["efficiency_provenance"]) == set(bf16["efficiency_provenance"])
    assert not [k for k in fp8["efficiency_provenance"] if "fp8" in k]
    assert not [w for w in bf16["warnings"] if "fp8" in w]


def test_bert_under_the_flash_default_says_its_attention_is_eager(runs):
    bert = json.loads(runs["bert_json"])
    assert bert["precision"] == "bf16"
    said = [w for w in bert["warnings"] if w.startswith("training.attention=flash is not applied to bert-large")]
    assert len(said) == 1 and "scores materialised" in said[0]
    # priced on the GEMM curve x attention_efficiency_factor, not the FlashAttention kernel model
    assert "attention_efficiency_factor" in bert["efficiency_provenance"]
    assert "attention_kernel" not in bert["efficiency_provenance"]


def test_vit_under_standard_attention_says_its_kernel_is_fused(runs):
    assert ("WARNING: training.attention=standard is not applied to vit-b-16: its layer graph runs the model's "
            "fused scaled-dot-product attention kernel") in runs["vit_standard"]


@pytest.mark.parametrize(("model", "overrides", "said"), [
    ("gpt-1.7b", ["training.precision=fp8", "training.attention=flash"], []),  # the decoder builder acts on both
    ("gpt-1.7b", ["training.attention=standard"], []),
    ("resnet50", ["training.precision=bf16"], []),  # no attention, no fp8: nothing to say
    ("vit-b-16", ["training.precision=bf16"], []),  # fused kernel under the flash default: as asked
    ("bert-large", ["training.attention=standard"], []),  # eager attention, asked for
    ("bert-large", ["training.precision=fp8", "training.attention=standard"], ["precision fp8: no GEMM of bert-large"]),
])
def test_warnings_only_where_a_field_is_not_acted_on(model, overrides, said):
    scenario = load_scenario(EXAMPLE, ["cluster.node=dgx-h100", "training.framework=megatron-core", f"model={model}",
                                       *overrides])
    warnings = network_field_warnings(scenario)
    assert len(warnings) == len(said) and all(w.startswith(s) for w, s in zip(warnings, said, strict=True))


def test_graph_features_read_the_attention_kernel_and_gemm_classes():
    bert, vit, resnet = (graph_features(load_scenario(EXAMPLE, [f"model={m}"]).model)
                         for m in ("bert-large", "vit-b-16", "resnet50"))
    assert (bert.fixed_attention, vit.fixed_attention, resnet.fixed_attention) == ("eager", "fused", None)
    assert bert.gemm_classes == vit.gemm_classes == resnet.gemm_classes == frozenset()
    gpt = graph_features(load_scenario(EXAMPLE, ["model=gpt-1.7b"]).model)
    assert gpt.gemm_classes is None and gpt.fixed_attention is None
