"""Training fields on a layer-graph network (workloads/networks/: CNNs, BERT, ViT) are acted on where they
mean something, and said, not claimed, where they do not (issue 23 "FP8 as it runs", "FlashAttention
unless the scenario says otherwise"; issue 19's networks). BERT's and ViT's attention projections and MLP
linears run in FP8 under ``precision: fp8`` as a decoder transformer's do (the FP8 peak and the inputs'
quantisation, simulator/cost/compute.py), and their attention follows ``training.attention`` (the
FlashAttention kernel model or the materialised path). A CNN under fp8 prints a WARNING, the model line
says the step is priced as bf16 and the provenance lists the bf16 curves it reads; a field with nothing to
act on (``elementwise_kernels: eager``, ``fused_cross_entropy`` on a graph without a loss,
``unfused_eager_kernels: false`` where the graph runs bias-gradient kernels) is a WARNING and is named in
``--json``'s ``training_fields_not_applied``. End to end through ``clustersim simulate`` (subprocesses,
started together) and on the compute model."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.cost.compute import ComputeModel
from simulator.cost.provenance import graph_features, network_field_warnings
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from workloads.graph import gemm_class, is_fused_attention
from workloads.networks.catalog import get_network

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
        "bert_standard_json": py + ["--set", "model=bert-large", "--set", "parallelism.micro_batch_size=4",
                                    "--set", "training.attention=standard", "--json"],
        "vit_standard": py + ["--set", "model=vit-b-16", "--set", "training.attention=standard"],
        "resnet_inert_json": py + ["--set", "training.elementwise_kernels=eager", "--set",
                                   "training.fused_cross_entropy=true", "--set", "training.unfused_eager_kernels=false",
                                   "--json"],
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
    assert fp8["training_fields_not_applied"] == ["training.precision"]
    assert "training_fields_not_applied" not in bf16
    # the constants listed are the ones read: bf16's, none of fp8's
    assert set(fp8["efficiency_provenance"]) == set(bf16["efficiency_provenance"])
    assert not [k for k in fp8["efficiency_provenance"] if "fp8" in k]
    assert not [w for w in bf16["warnings"] if "fp8" in w]


def test_bert_follows_training_attention(runs):
    """The flash default runs the fused kernel on the FlashAttention kernel model (H100: attention_kernels.csv);
    standard the materialised scores on the GEMM curve x attention_efficiency_factor; neither warns."""
    flash, standard = json.loads(runs["bert_json"]), json.loads(runs["bert_standard_json"])
    for doc in (flash, standard):
        assert doc["precision"] == "bf16"
        assert not [w for w in doc["warnings"] if "training.attention" in w]
        assert "training_fields_not_applied" not in doc
    assert "attention_kernel" in flash["efficiency_provenance"]
    assert "attention_efficiency_factor" not in flash["efficiency_provenance"]
    assert "attention_efficiency_factor" in standard["efficiency_provenance"]
    assert "attention_kernel" not in standard["efficiency_provenance"]
    assert flash["step_time_s"] < standard["step_time_s"]  # 512 tokens: the materialised scores cost
    assert flash["peak_memory_gib"] < standard["peak_memory_gib"]  # no s x s scores saved


def test_vit_under_standard_attention_runs_it_without_a_warning(runs):
    assert "WARNING" not in runs["vit_standard"]


def test_fields_with_nothing_to_act_on_are_said_and_named_in_json(runs):
    doc = json.loads(runs["resnet_inert_json"])
    assert doc["training_fields_not_applied"] == [
        "training.unfused_eager_kernels", "training.elementwise_kernels", "training.fused_cross_entropy"]
    said = doc["warnings"]
    assert any(w.startswith("training.unfused_eager_kernels=false is not applied to resnet50's bias gradients")
               for w in said)
    assert any(w.startswith("training.elementwise_kernels=eager has nothing to act on in resnet50") for w in said)
    assert any(w.startswith("training.fused_cross_entropy has nothing to act on in resnet50") for w in said)


@pytest.mark.parametrize(("model", "overrides", "said"), [
    ("gpt-1.7b", ["training.precision=fp8", "training.attention=flash"], []),  # the decoder builder acts on both
    ("gpt-1.7b", ["training.attention=standard", "training.elementwise_kernels=eager"], []),
    ("resnet50", ["training.precision=bf16"], []),  # no attention, no fp8: nothing to say
    ("resnet50", ["training.unfused_eager_kernels=true"], []),  # what the graph runs
    ("vit-b-16", ["training.precision=bf16"], []),
    ("vit-b-16", ["training.attention=standard"], []),  # follows the field
    ("bert-large", ["training.attention=standard"], []),
    ("bert-large", ["training.fused_cross_entropy=true"], []),  # its masked-LM loss keeps 16-bit logits
    ("bert-large", ["training.precision=fp8"], []),  # its linears in FP8, their saved inputs quantized
    ("bert-large", ["training.precision=fp8", "training.fp8_saved_inputs=false"], []),
    ("bert-large", ["training.precision=fp8", "training.fp8_gemms=[lm_head]"], []),  # the decoder in FP8 alone
    ("vit-b-16", ["training.precision=fp8"], ["precision fp8: vit-b-16's convolutions run in bf16"]),
    ("vit-b-16", ["training.precision=fp8", "training.fp8_gemms=[lm_head]"],
     ["precision fp8: no GEMM of vit-b-16 runs in FP8"]),  # its head has no class
    ("vit-b-16", ["training.fused_cross_entropy=true"], ["training.fused_cross_entropy has nothing to act on"]),
])
def test_warnings_only_where_a_field_is_not_acted_on(model, overrides, said):
    scenario = load_scenario(EXAMPLE, ["cluster.node=dgx-h100", "training.framework=megatron-core", f"model={model}",
                                       *overrides])
    warnings = network_field_warnings(scenario)
    assert len(warnings) == len(said) and all(w.startswith(s) for w, s in zip(warnings, said, strict=True))


def test_graph_features_read_the_attention_kernel_and_gemm_classes():
    bert, vit, resnet = (graph_features(load_scenario(EXAMPLE, [f"model={m}"]).model)
                         for m in ("bert-large", "vit-b-16", "resnet50"))
    assert (bert.fixed_attention, vit.fixed_attention, resnet.fixed_attention) == (None, None, None)
    assert bert.attention_paths("flash") == vit.attention_paths("flash") == {"fused"}
    assert bert.attention_paths("standard") == vit.attention_paths("standard") == {"eager"}
    assert not resnet.attention_paths("flash")
    assert bert.gemm_classes == {"attention_proj", "mlp", "lm_head"}
    assert vit.gemm_classes == {"attention_proj", "mlp"}
    assert resnet.gemm_classes == frozenset()
    gpt = graph_features(load_scenario(EXAMPLE, ["model=gpt-1.7b"]).model)
    assert gpt.gemm_classes is None and gpt.fixed_attention is None


ONE_H100 = ["cluster.node=dgx-h100", "training.framework=megatron-core", "cluster.num_gpus=1", "parallelism.dp=1"]


def _kernel_seconds(scenario):
    """Each kernel of the scenario's graph (one micro-batch) and its seconds on the scenario's compute model."""
    tr = scenario.training
    compute = ComputeModel(scenario.accelerator, tr.precision, tr.fp8_gemms, tr.fp8_recipe)
    ops = [op for layer in scenario.layer_graph().layers for op in (*layer.forward, *layer.backward)
           if op.kind != "collective"]
    return {op: compute.time_s(op) for op in ops}


def test_an_fp8_bert_step_is_faster_by_its_fp8_gemms_alone():
    """BERT-large, 32 sequences of 512 on one H100: the FP8 step is faster than the bf16 step, and by exactly
    what its attention-projection and MLP GEMMs save (FP8 peak, less their inputs' cast and amax traffic); no
    other kernel moves (the attention core, norms, embeddings and the bf16 LM head are the bf16 run's)."""
    setting = [*ONE_H100, "model=bert-large", "parallelism.micro_batch_size=32", "parallelism.global_batch_size=32"]
    bf16, fp8 = (load_scenario(EXAMPLE, [*setting, f"training.precision={p}"]) for p in ("bf16", "fp8"))
    t_bf16, t_fp8 = _kernel_seconds(bf16), _kernel_seconds(fp8)
    assert t_bf16.keys() == t_fp8.keys()
    in_fp8 = {op for op in t_bf16 if op.kind == "gemm" and gemm_class(op) in fp8.training.fp8_gemms}
    assert {gemm_class(op) for op in in_fp8} == {"attention_proj", "mlp"}
    assert all(t_fp8[op] == t_bf16[op] for op in t_bf16 if op not in in_fp8)
    gemm_saving = sum(t_bf16[op] - t_fp8[op] for op in in_fp8)
    step_bf16, step_fp8 = simulate(bf16).step_time_s, simulate(fp8).step_time_s
    assert step_fp8 < step_bf16
    assert step_bf16 - step_fp8 == pytest.approx(gemm_saving, rel=1e-6)
    share = sum(t_bf16[op] for op in in_fp8) / sum(t_bf16.values())
    assert 0.4 < share < 0.6  # half the kernel time is in GEMMs that FP8 speeds up ...
    assert 0.02 < (step_bf16 - step_fp8) / step_bf16 < share / 2  # ... by well under 2x: casts and small shapes


def test_fp8_gemms_carry_the_class_through_the_backward():
    """The data- and weight-gradient GEMMs of a tagged linear run in FP8 too (Transformer Engine's backward),
    the ViT patch convolution and the classifier head in bf16."""
    vit = load_scenario(EXAMPLE, [*ONE_H100, "model=vit-b-16", "training.precision=fp8",
                                  "parallelism.micro_batch_size=8", "parallelism.global_batch_size=8"])
    layer = next(layer for layer in vit.layer_graph().layers if layer.name == "encoder.layers.0.mlp.0")
    assert [(op.name.rsplit(".", 1)[-1], gemm_class(op)) for op in (*layer.forward, *layer.backward)
            if op.kind == "gemm"] == [("gemm", "mlp"), ("dgrad", "mlp"), ("wgrad", "mlp")]
    untagged = {layer.name for layer in vit.layer_graph().layers for op in layer.forward
                if op.kind == "gemm" and gemm_class(op) is None}
    assert untagged == {"conv_proj", "heads.head"}


def _long_vit(tokens_side: int) -> dict:
    return {"family": "vit", "name": f"vit-b-16-{16 * tokens_side}", "image_size": 16 * tokens_side}


@pytest.mark.parametrize("side", [14, 64])  # 197 and 4,097 tokens
def test_eager_vit_is_slower_than_flash_and_more_so_at_long_sequence(side):
    """ViT-B/16 on one H100: the materialised attention (scores and probabilities through HBM, the GEMM curve
    x attention_efficiency_factor) against the fused kernel (FlashAttention kernel model): slower at 197
    tokens, and the attention core's share of the gap grows with the sequence (s^2 scores vs s^2 FLOPs at
    the kernel's rate)."""
    def step(attention: str) -> tuple[float, dict]:
        sc = load_scenario(EXAMPLE, [*ONE_H100, "parallelism.micro_batch_size=2", "parallelism.global_batch_size=2",
                                     f"training.attention={attention}"])
        sc = dataclasses.replace(sc, model=get_network(_long_vit(side)))
        return simulate(sc).step_time_s, _kernel_seconds(sc)

    (flash, flash_ops), (eager, eager_ops) = step("flash"), step("standard")
    assert any(is_fused_attention(op) for op in flash_ops) and not any(is_fused_attention(op) for op in eager_ops)
    assert eager > flash
    if side == 64:
        assert eager / flash > 1.5


def _saved_bytes(overrides: list[str]) -> float:
    scenario = load_scenario(EXAMPLE, ["cluster.node=dgx-h100", "training.framework=megatron-core", "model=bert-large",
                                       "parallelism.micro_batch_size=4", *overrides])
    return sum(layer.saved_bytes for layer in scenario.layer_graph().layers)


def test_fp8_saved_inputs_quantize_what_bert_linears_keep():
    """Under FP8 with ``fp8_saved_inputs`` (Transformer Engine) each FP8 linear keeps its input at 1 B: per
    encoder layer the Q/K/V input (h), the intermediate dense input (h) and the output dense input (4h) drop
    from 2 B to 1 B, and the output projection keeps a 1 B copy beside the fused kernel's 16-bit output:
    -(2 - 1)(h + h + 4h) + h = -5h bytes per token, 24 layers of 4 x 512 tokens."""
    tokens, hidden = 4 * 512, 1024
    kept = _saved_bytes(["training.precision=fp8", "training.fp8_saved_inputs=false"])
    quantized = _saved_bytes(["training.precision=fp8"])
    assert kept - quantized == 24 * 5 * tokens * hidden
    assert kept == _saved_bytes(["training.precision=bf16"])  # 16-bit activations either way


def test_fused_cross_entropy_keeps_bert_logits_at_16_bits():
    """BERT's masked-LM loss: the fp32 log-softmax (4 B per logit) or, fused, the 16-bit logits (2 B) and an fp32
    log-sum-exp per token (workloads/networks/builder.py ``cross_entropy``)."""
    tokens, vocab = 4 * 512, 30_522
    assert _saved_bytes([]) - _saved_bytes(["training.fused_cross_entropy=true"]) == tokens * (4 * vocab - 2 * vocab - 4)


def test_an_imported_multihead_attention_follows_training_attention():
    """torchvision-style ``nn.MultiheadAttention`` traced from a module (workloads/networks/torch_import.py): the
    fused kernel under flash, the materialised scores under standard, as the catalog ViT; no warning either way."""
    pytest.importorskip("torch")
    from workloads.catalog import resolve_model
    from workloads.graph import ShardShape

    spec = resolve_model({"torch": "torch_nets:VisionTransformer", "input_shape": [3, 64, 64],
                          "kwargs": {"image": 64, "layers": 2, "heads": 4, "hidden": 64, "mlp": 128, "num_classes": 10}})
    features = graph_features(spec)
    assert features.fixed_attention is None and features.attention_paths("standard") == {"eager"}
    flash, eager = (spec.layer_graph(ShardShape(micro_batch=2, seq_length=1, flash_attention=f)) for f in (True, False))
    assert any(is_fused_attention(op) for layer in flash.layers for op in layer.forward)
    assert not any(is_fused_attention(op) for layer in eager.layers for op in layer.forward)
    assert eager.saved_bytes() > flash.saved_bytes()  # the scores and probabilities kept
