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


def test_the_3d_linears_with_a_bias_add_it_in_a_kernel_of_their_own():
    """PyTorch <= 1.10's ``at::linear`` on a 3-D input: matmul, then ``add_(bias)`` reading and writing the
    output; the patch projection and the two MLP linears of every block (13), not the biasless qkv and W_0,
    nor the head (a 2-D input: addmm)."""
    batch, t = 2, 257
    adds = {op.name: op for layer in deeppool_vit.graph(batch).layers for op in layer.forward
            if op.name.endswith(".bias_add")}
    assert len(adds) == 1 + 2 * deeppool_vit.BLOCKS
    assert adds["b0.linear.0.bias_add"].bytes_moved == 2 * 4 * batch * t * deeppool_vit.MLP
    assert adds["b5.linear.3.bias_add"].bytes_moved == 2 * 4 * batch * t * deeppool_vit.DIM
    assert adds["prep.project_patches.bias_add"].bytes_moved == 2 * 4 * batch * 256 * deeppool_vit.DIM
    assert not any(name.startswith(("mlp_head", "a")) for name in adds)


def test_the_linears_are_priced_as_1x1_convolution_passes_at_one_rate_for_every_batch():
    """The specs' ``linear_as_pointwise_conv``: every linear GEMM of the network at the same TFLOP/s at batch
    32 and 128 (forward and data gradient; the size curve went 40 -> 62 for the qkv GEMM)."""
    model = deeppool_vit._model()
    rates = {}
    for batch in (32, 128):
        for layer in deeppool_vit.graph(batch).layers:
            for op in layer.forward:
                if op.kind == "gemm" and layer.name.startswith("a0.to_qvk"):
                    rates[batch] = op.flops / (model.time_s(op) - 4e-6)
    assert rates[32] == pytest.approx(rates[128], rel=1e-9)


def test_the_simulated_vit_is_within_the_guard():
    """A guard, not the target: every GPU-bound batch simulated within 12% of the profile (-9.7 / -3.3 /
    -0.1% at 32 / 64 / 128 when written; the batch-32 miss is DeepPool's host time at that batch, as in
    the CNN blocks of validation/deeppool_model.py)."""
    errors = deeppool_vit.whole_model_errors()
    print(deeppool_vit.by_part().to_string())
    assert set(errors) == {32, 64, 128}
    assert all(abs(e) <= 0.12 for e in errors.values())


def test_the_vit_whole_model_is_within_the_target():
    """Issue 19's DeepPool whole-model target as validation/deeppool_model.py reads it: median |error| over
    the GPU-bound batches <= 5%, every row held out (3.3% when written)."""
    errors = deeppool_vit.whole_model_errors()
    assert statistics.median(abs(e) for e in errors.values()) <= deeppool_vit.WHOLE_MODEL_TARGET


@pytest.mark.xfail(strict=True, reason="issue 19 DeepPool whole model, the stricter reading (every batch within 5%) "
                                       "unmet for the ViT: batch 32 -9.7% (64 -3.3%, 128 -0.1%); the CNN blocks "
                                       "miss it at batch 32 too (validation/deeppool_model.py)")
def test_every_vit_batch_is_within_the_target():
    errors = deeppool_vit.whole_model_errors()
    assert max(abs(e) for e in errors.values()) <= deeppool_vit.WHOLE_MODEL_TARGET


def test_the_script_prints_the_figure_and_fails_past_tolerance():
    out = subprocess.run([sys.executable, "-m", "validation.deeppool_vit"], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert "whole model (every row held out)" in out.stdout
    assert out.returncode == (0 if "target 5%: met" in out.stdout else 1)


def test_the_script_prints_every_row_and_one_block_pairs_kernels(capsys):
    """``--rows``: the 45 rows of the three batches (DeepPool gives an attention and an MLP block one time);
    ``--ops 32``: every kernel of the first pair, whose times add up to the two rows' kernels."""
    assert deeppool_vit.main(["--rows", "--ops", "32"]) == 0
    out = capsys.readouterr().out
    assert out.count("TransBlockA") == 18 and "a0.scores.bmm" in out and "b0.linear.0.bias_add" in out
    ops = deeppool_vit.op_table(32)
    model = deeppool_vit._model()
    kernels = [op for row in ("TransBlockA", "TransBlockB") for layer in deeppool_vit.row_layers(32, row, 0)
               for op in (*layer.forward, *layer.backward)]
    assert len(ops) == len(kernels)
    assert ops.us.sum() == pytest.approx(1e6 * sum(model.time_s(op) for op in kernels))
