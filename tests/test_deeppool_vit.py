"""DeepPool's A100 ViT profile as a held-out whole-model check of an eager ViT (validation/deeppool_vit.py):
the network as self-attention-cv builds it, DeepPool's rows mapped onto its layers, and the issue's
whole-model target (5% per GPU-bound batch)."""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from validation import deeppool_vit
from workloads.layer_graph import is_gradient_sum

ROOT = Path(__file__).resolve().parents[1]


def test_the_network_has_self_attention_cvs_parameters_and_flops():
    """Patch projection 768x512 + bias, class token, 257 position embeddings; per block a qkv (no bias),
    W_0 (no bias), two layer norms and a 512-1024-512 MLP with biases; the 1000-way head. FLOPs: 2 per
    multiply-add, backward 2x the forward, less the patch projection's data gradient (the image needs none)."""
    e, t, m = 512, 257, 1024
    block = 3 * e * e + e * e + 2 * 2 * e + e * m + m + m * e + e
    graph = deeppool_vit.graph(2)
    assert graph.total_params() == 768 * e + e + e + t * e + 6 * block + e * 1000 + 1000
    matmuls = 768 * e * 256 + 6 * t * (4 * e * e + 2 * e * m + 2 * t * e) + e * 1000
    assert graph.forward_flops() == 2 * 2 * matmuls
    assert graph.backward_flops() == 2 * graph.forward_flops() - 2 * 2 * 768 * e * 256


def test_every_layer_is_in_exactly_one_deeppool_row():
    """15 rows per block of DeepPool's file (prep, 6 x TransBlockA/B, prepOut, linear) cover the graph's
    layers once; each block's input feeds its first linear and its residual add (one gradient sum), and
    the unbound q, k, v are one reader of qkv (no sum)."""
    rows = deeppool_vit.rows()
    assert sorted(rows.batch_size_per_gpu.unique()) == [32, 64, 128]
    assert (rows.groupby("batch_size_per_gpu").size() == 15).all()
    layers = [layer.name for r in rows[rows.batch_size_per_gpu == 32].itertuples()
              for layer in deeppool_vit.row_layers(32, r.layer_type, r.block)]
    assert sorted(layers) == sorted(layer.name for layer in deeppool_vit.graph(32).layers)
    sums = [op.name for layer in deeppool_vit.graph(32).layers for op in layer.backward if is_gradient_sum(op)]
    assert len(sums) == 12 and not any("to_qvk" in name for name in sums)


def test_the_simulated_vit_is_faster_than_the_profile_within_the_guard():
    """A guard, not the target: every GPU-bound batch simulated within 20% of the profile, faster (the
    error grows with the batch: -3.4 / -7.8 / -13.6% at 32 / 64 / 128 when written)."""
    errors = deeppool_vit.whole_model_errors()
    print(deeppool_vit.by_part().to_string())
    assert set(errors) == {32, 64, 128}
    assert all(-0.20 <= e < 0 for e in errors.values())


@pytest.mark.xfail(strict=True, reason="issue 19 DeepPool whole-model target (median |error| <= 5% over whole models, "
                                       "as validation/deeppool_model.py reads it) unmet for the ViT: median 7.8%; "
                                       "every row held out, simulated -3.4% (batch 32), -7.8% (64), -13.6% (128); "
                                       "the twelve blocks -2.4/-7.3/-13.5%, the patch embedding -35/-25/-9%; the "
                                       "miss grows with the batch (GPU work: the TF32 linears and the attention "
                                       "GEMMs, whose A100 rates no measurement here checks); DeepPool's timer gives "
                                       "attention and MLP blocks one time, so the blocks cannot be told apart")
def test_the_vit_whole_model_is_within_the_target():
    errors = deeppool_vit.whole_model_errors()
    assert statistics.median(abs(e) for e in errors.values()) <= deeppool_vit.WHOLE_MODEL_TARGET


def test_the_script_prints_the_figure_and_fails_past_tolerance():
    out = subprocess.run([sys.executable, "-m", "validation.deeppool_vit"], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert "whole model (every row held out)" in out.stdout
    assert out.returncode == (0 if "target 5%: met" in out.stdout else 1)
