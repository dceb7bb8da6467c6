"""DeepPool's A100 ViT profile as a held-out whole-model check of an imported eager ViT (issue 19).

Data: the ``vitLayerGpuProfileA100.txt`` rows of ``data/deeppool_a100_v1_layers.csv.gz`` (validation/
calibrate_conv.py says what a row is: one layer's forward + backward time in DeepPool's C++ runtime,
fp32 tensors, TF32 kernels). No constant anywhere is fitted on these rows: every row is held out.

**The network.** DeepPool's rows name their parameters ``prep{dim, dropout, img_dim, in_channels,
patch_dim}``, ``TransBlockA{dim, dim_head, heads}``, ``TransBlockB{dim, dim_linear_block}``,
``prepOut{}`` and ``linear``: the arguments of self-attention-cv's ``ViT`` (The AI Summer,
``self_attention_cv/vit/vit.py``, ``transformer_vanilla/{transformer_block,mhsa}.py``, version 1.2.3,
read from its PyPI wheel; an inference from the names, DeepPool's model file is not in this project's
data) with dim 512, 4 heads of 128, MLP 1024, 6 blocks, 256 x 256 images in 16 x 16 patches (256
tokens + a class token): not torchvision's ViT. As that code runs it, :func:`build` describes it with the
layer builder's kernels (the ones the PyTorch importer maps the same operations to):

- ``prep``: the image rearranged into patches (a copy; the image needs no gradient), a linear
  projection 768 -> 512 with bias (a GEMM, then the bias added in place: below), the class token
  concatenated in front, position embeddings added;
- ``TransBlockA`` (post-norm, ``y = norm_1(mhsa(x) + x)``): one qkv linear without bias, q, k, v
  unbound from it and copied for ``einsum`` (its ``bmm`` needs the heads folded into the batch), the
  scores q.k^T per head, multiplied by the scale (a pass over the scores), softmax, the weighted sum
  with v, the heads merged (a copy), the output linear without bias, the residual add, layer norm;
- ``TransBlockB`` (``norm_2(linear(y) + y)``): linear 512 -> 1024, GELU, linear 1024 -> 512, add, norm
  (each linear a GEMM and an in-place bias add);
- ``prepOut``: the class token's output ``y[:, 0, :]`` (a view; its backward fills the sequence's zero
  gradient and copies the token's in); ``linear``: the 1000-way head.

**The PyTorch it ran on.** The profiles predate DeepPool's autocast option (January 2022; seeds/README.md),
so PyTorch 1.10 or older, and their matmuls run in TF32 (the blocks' rates exceed the 19.5 TFLOP/s fp32
peak: cuBLAS took TF32 by default until 1.12). That PyTorch's ``at::linear`` (aten/src/ATen/native/
Linear.cpp) fuses the bias into ``addmm`` only for a 2-D input; for the (batch, tokens, features) inputs
here it runs ``matmul`` (the batch folded into the GEMM's rows) and then ``output.add_(bias)``, one more
elementwise kernel reading and writing the output (:func:`_linear_3d`); the head's 2-D input takes addmm.

Autograd's gradient sums (a block's input feeds its first linear and its residual add) are the layer
graph's (workloads/layer_graph.py); the three unbound pieces of qkv are one reader, and their stacked
gradient comes back to the qkv linear as a permuted view that its backward reshapes into a copy. Priced in the A100
40 GB's fp32/TF32 compute model of the specs (the linears as 1x1 convolution passes on the specs'
``conv_efficiency.tf32``, ``linear_as_pointwise_conv``; the attention GEMMs on the TF32 curve), each row's
forward and backward issue-bound by DeepPool's host time per kernel fitted on the CNN blocks
(validation/deeppool_model.py ``fitted_host_s``).

**What the profile can and cannot say.** DeepPool's V1 timer gives every TransBlockA and TransBlockB
the same time to 0.1% at every batch (9.74 ms at 128) although an attention block does 1.25x the FLOPs
of an MLP block: the per-layer split is not the blocks' own (the rows are differences of sorted
cumulative event times, seeds/README.md), so only their sum, the whole model, is compared. Below batch
32 the blocks are host-bound (1.1-1.5 ms each from batch 1 to 16, batch-independent): left out.

**What moved it** (whole model at batch 32 / 64 / 128, simulated against measured): torchvision's ViT
of the same sizes in the catalog (pre-norm, fused attention, a patch convolution; session 5's what-if,
summed kernels without host time, on this A100 40 GB before this session's changes) -13.5 / -17.3 / -22.6%; the network DeepPool ran, eager, with the
graph's gradient sums and DeepPool's host time -7.0 / -11.5 / -17.4%; with two kernels every PyTorch
backward runs that the builder left out (layer norm's weight and bias gradients, ``GammaBetaBackward``
in ATen's ``layer_norm_kernel.cu``; a bias's gradient, the output gradient summed over rows) and the qkv
gradient's copy, -3.4 / -7.8 / -13.6% (session 6). That miss grew with the batch because the linears
(74% of the FLOPs) were priced on the TF32 *size* curve fitted on DeepPool's convolutions, whose efficiency
rises with a GEMM's FLOPs (the qkv GEMM 40 -> 62 TFLOP/s from batch 32 to 128), while the profile's blocks
add one time per image from batch 32 on (per attention + MLP pair, 0.144 ms per image from 32 to 64 and
0.146 from 64 to 128): the GPU's rate for these shapes is already flat there. Session 7: (1) the specs price a TF32 linear as the 1x1
convolution pass it is (M = rows, N = out features, K = in features; Chetlur et al. 2014, Sec. 3) on the
*shape* model fitted on the same DeepPool convolutions (held-out convolutions 10.5% against the size
curve's 21%), which reads channels and reduction length and not the rows: 36-52 TFLOP/s here at every
batch; -11.4 / -5.1 / -1.9%. (2) The bias adds of the 3-D linears above: **-9.7 / -3.3 / -0.1%**. Neither
alone meets the target (the bias adds alone on the size curve: -1.8 / -6.0 / -11.8%). Said plainly: both
were chosen after seeing these rows, and no constant was fitted on them; the general convolution fit of
calibrate_conv (with its DeepPool host time per layer, 211 us, and a 1x1 factor of 0.79 rather than the
specs' 0.455) would price the linears 1.5x faster and the whole model -19% at every batch. The attention
GEMMs (QK^T and AV over 257 x 257, misaligned for TF32) stay at the curve's 10 TFLOP/s, unmeasured.

**Target.** The issue's DeepPool whole-model figure read as validation/deeppool_model.py reads it for
the CNN blocks: the median |error| over the whole models (here the GPU-bound batches 32, 64, 128)
within :data:`WHOLE_MODEL_TARGET` (5%); the stricter reading, every batch within 5%, is printed beside
it. ``python -m validation.deeppool_vit`` prints the rows by part and batch and exits 1 past the target
(``--rows``: every row; ``--ops BATCH``: the kernels of one attention and one MLP block, their times and rates).
"""

from __future__ import annotations

import argparse
import math
import statistics
from dataclasses import replace
from functools import cache

import pandas as pd

from hardware_specs.catalog import ACCELERATORS
from simulator.cost.compute import ComputeModel
from simulator.cost.host_floor import issue_bound_s
from validation import calibrate_conv
from workloads.layer_graph import LayerGraph
from workloads.networks.builder import NetBuilder, Tensor

MODEL = "ViT (dim 512, patch 16, img 256)"
DIM, HEADS, DIM_HEAD, MLP, BLOCKS, IMAGE, PATCH, CLASSES = 512, 4, 128, 1024, 6, 256, 16, 1000
#: GPU-bound batches (the blocks' time grows in proportion to the batch from 32 on)
BATCHES = (32, 64, 128)
WHOLE_MODEL_TARGET = 0.05
#: DeepPool's row types in block order, and the layer-name prefix each row's layers carry here
ROW_PREFIX = {"prep": "prep.", "TransBlockA": "a", "TransBlockB": "b", "prepOut": "prepOut", "linear": "mlp_head"}


def build(net: NetBuilder) -> None:
    """self-attention-cv's ViT as DeepPool profiled it (module docstring), layer by layer on ``net``."""
    tokens = (IMAGE // PATCH) ** 2
    t, e = tokens + 1, DIM
    patches = Tensor((tokens, 3 * PATCH * PATCH), None, -1)   # the rearranged image: needs no gradient
    x = _linear_3d(net, "prep.project_patches", patches, DIM)
    rearrange = net._memory_op("prep.rearrange.copy", net.batch * tokens * 3 * PATCH * PATCH, 1, 1)
    net.layers[-1] = replace(net.layers[-1], forward=(rearrange, *net.layers[-1].forward))
    x = net.add_parameter("prep.pos_emb1D", net.prepend_token("prep.cls_token", x))
    for i in range(BLOCKS):
        a = f"a{i}."
        qkv = net.linear(f"{a}to_qvk", x, 3 * HEADS * DIM_HEAD, bias=False)
        # the q, k, v gradients stacked (unbind's backward) come back as a permuted view of qkv's
        # gradient, which the linear's backward reshapes into a copy before its GEMMs
        regather = net._memory_op(f"{a}to_qvk.grad_reshape.copy", net.batch * t * 3 * HEADS * DIM_HEAD, 1, 1)
        net.layers[-1] = replace(net.layers[-1], backward=(regather, *net.layers[-1].backward))
        piece = Tensor((HEADS, t, DIM_HEAD), qkv.producer, qkv.storage, qkv.numel)   # a view of qkv, unbound
        q, k, v = (_piece_copy(net, f"{a}{name}", piece, f"{a}unbind") for name in "qkv")
        scores = net.batched_matmul(f"{a}scores", q, k, t, t, DIM_HEAD, HEADS, q, k, (HEADS, t, t))
        probs = net.softmax(f"{a}softmax", net.scale_constant(f"{a}scale", scores))
        out = net.batched_matmul(f"{a}values", probs, v, t, DIM_HEAD, t, HEADS, probs, v, (HEADS, t, DIM_HEAD))
        out = net.copy(f"{a}merge_heads", out, (t, HEADS * DIM_HEAD))
        y = net.linear(f"{a}W_0", out, e, bias=False)
        x = net.layernorm(f"{a}norm_1", net.add(f"{a}residual", y, x))
        b = f"b{i}."
        y = net.activation(f"{b}gelu", _linear_3d(net, f"{b}linear.0", x, MLP), "gelu")
        y = _linear_3d(net, f"{b}linear.3", y, e)
        x = net.layernorm(f"{b}norm_2", net.add(f"{b}residual", y, x))
    net.linear("mlp_head", net.select_token("prepOut", x), CLASSES)


def _linear_3d(net: NetBuilder, name: str, x: Tensor, out_features: int) -> Tensor:
    """``nn.Linear`` with a bias on a (batch, tokens, features) input as the PyTorch of the profile runs
    it: ``at::linear`` (aten/src/ATen/native/Linear.cpp) fuses the bias into one ``addmm`` only for a 2-D
    input; a 3-D one takes ``matmul`` (the batch folded into the GEMM's rows) and then ``output.add_(bias)``,
    one more elementwise kernel that reads and writes the output (module docstring)."""
    y = net.linear(name, x, out_features)
    rows = net.batch * math.prod(y.shape[:-1])
    bias_add = net._memory_op(f"{name}.bias_add", rows * out_features, 1, 1)
    net.layers[-1] = replace(net.layers[-1], forward=(*net.layers[-1].forward, bias_add))
    return y


def _piece_copy(net: NetBuilder, name: str, piece: Tensor, split: str) -> Tensor:
    """One unbound piece of qkv (a strided view of it) copied for ``einsum``'s batched GEMM."""
    out = net.copy(name, piece, piece.shape, piece_of=split)
    net.layers[-1] = replace(net.layers[-1], input_shape=None)   # a piece, not the whole qkv output
    return out


@cache
def graph(batch: int) -> LayerGraph:
    net = NetBuilder("deeppool-vit", batch, 4)
    build(net)
    return net.output()


def row_layers(batch: int, row_type: str, block: int) -> list:
    """The layers of one DeepPool row: ``block`` counts the row's type from 0 (the k-th TransBlockA)."""
    prefix = ROW_PREFIX[row_type]
    if row_type in ("TransBlockA", "TransBlockB"):
        prefix = f"{prefix}{block}."
    return [layer for layer in graph(batch).layers if layer.name == prefix or layer.name.startswith(prefix)]


@cache
def _model() -> ComputeModel:
    return ComputeModel(ACCELERATORS.get(calibrate_conv.ACCELERATOR), "fp32", tf32=True)


def row_simulated_s(batch: int, row_type: str, block: int, host_s: float) -> float:
    """A row's forward and backward, each issue-bound at ``host_s`` per kernel (simulator/cost/host_floor.py)."""
    layers = row_layers(batch, row_type, block)
    model = _model()
    forward = [model.time_s(op) for layer in layers for op in layer.forward]
    backward = [model.time_s(op) for layer in reversed(layers) for op in layer.backward]
    return issue_bound_s(forward, host_s) + issue_bound_s(backward, host_s)


@cache
def rows() -> pd.DataFrame:
    """DeepPool's ViT rows at :data:`BATCHES` with their simulated times."""
    from validation.deeppool_model import fitted_host_s

    df = pd.read_csv(calibrate_conv.DATA)
    df = df[(df.model == MODEL) & df.batch_size_per_gpu.isin(BATCHES)].copy()
    df["block"] = df.groupby(["batch_size_per_gpu", "layer_type"]).cumcount()
    host = fitted_host_s()
    df["measured_ms"] = df.fwbw_time_avg_ms
    df["simulated_ms"] = [1e3 * row_simulated_s(int(r.batch_size_per_gpu), r.layer_type, int(r.block), host)
                          for r in df.itertuples()]
    return df


def by_part() -> pd.DataFrame:
    """Per batch: the patch embedding (prep), the twelve blocks, the head (prepOut + linear) and the whole
    model, measured against simulated."""
    df = rows()
    part = df.layer_type.map({"prep": "patch embedding", "TransBlockA": "blocks", "TransBlockB": "blocks",
                              "prepOut": "head", "linear": "head"})
    out = []
    for (batch, name), g in df.assign(part=part).groupby(["batch_size_per_gpu", "part"], sort=False):
        out.append({"batch": batch, "part": name, "measured_ms": g.measured_ms.sum(), "simulated_ms": g.simulated_ms.sum()})
    for batch, g in df.groupby("batch_size_per_gpu"):
        out.append({"batch": batch, "part": "whole model", "measured_ms": g.measured_ms.sum(),
                    "simulated_ms": g.simulated_ms.sum()})
    table = pd.DataFrame(out)
    table["error"] = table.simulated_ms / table.measured_ms - 1
    return table


def whole_model_errors() -> dict[int, float]:
    table = by_part()
    whole = table[table.part == "whole model"]
    return {int(b): float(e) for b, e in zip(whole.batch, whole.error, strict=True)}


def op_table(batch: int) -> pd.DataFrame:
    """Every kernel of the first attention and MLP block at ``batch``: its pass, kind, GEMM shape, simulated
    time and achieved TFLOP/s (GEMMs) or GB/s (memory-bound kernels) -- where a block's time goes."""
    model = _model()
    out = []
    for row_type in ("TransBlockA", "TransBlockB"):
        for layer in row_layers(batch, row_type, 0):
            for pass_, ops in (("forward", layer.forward), ("backward", layer.backward)):
                for op in ops:
                    seconds = model.time_s(op)
                    out.append({"pass": pass_, "op": op.name, "kind": op.kind,
                                "mnk": f"{op.m}x{op.n}x{op.k}" + (f" x{op.batch}" if op.batch > 1 else "")
                                if op.flops else "", "us": 1e6 * seconds,
                                "tflop_s": op.flops / seconds / 1e12 if op.flops else float("nan"),
                                "gb_s": op.bytes_moved / seconds / 1e9})
    return pd.DataFrame(out)


def pointwise_rule_shapes() -> list[tuple[int, int, int]]:
    """The forward (M, N, K) of every GEMM the TF32 1x1-convolution rule was chosen on: the implicit GEMMs of
    the convolution rows that fitted ``conv_efficiency.tf32`` (validation/calibrate_conv.py, fit half) and the
    linear layers of this ViT at :data:`BATCHES` (where the rule was checked)."""
    shapes = [(op.m, op.n, op.k) for r in calibrate_conv.conv_rows() if not r.row.heldout
              for op in calibrate_conv.deeppool_layer_ops(r.row) if op.conv is not None and op.conv[0] == "fwd"]
    shapes += [(op.m, op.n, op.k) for batch in BATCHES for layer in graph(batch).layers for op in layer.forward
               if op.kind == "gemm" and op.conv is None]
    return shapes


def pointwise_rule_range() -> dict[str, int]:
    """Least and greatest of each dimension of :func:`pointwise_rule_shapes`: the A100 specs'
    ``linear_as_pointwise_conv_range.tf32`` (tests/test_linear_as_pointwise.py checks they agree)."""
    shapes = pointwise_rule_shapes()
    out = {}
    for i, dim in enumerate("mnk"):
        out[f"{dim}_min"] = min(s[i] for s in shapes)
        out[f"{dim}_max"] = max(s[i] for s in shapes)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m validation.deeppool_vit", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", action="store_true", help="also print every DeepPool row, measured against simulated")
    parser.add_argument("--ops", type=int, metavar="BATCH", help="also print the kernels of one attention and one MLP "
                                                                 "block at this batch, with their simulated times")
    args = parser.parse_args(argv)
    fmt = {"float_format": lambda v: f"{v:.3f}", "index": False}
    if args.rows:
        df = rows()
        print(df.assign(error=df.simulated_ms / df.measured_ms - 1)[
            ["batch_size_per_gpu", "layer_type", "block", "measured_ms", "simulated_ms", "error"]].to_string(**fmt))
    if args.ops is not None:
        ops = op_table(args.ops)
        print(ops.to_string(**fmt))
        print(f"batch {args.ops}: one attention + MLP block pair {ops.us.sum() / 1e3:.3f} ms of kernels "
              f"(GEMMs {ops[ops.kind != 'memory'].us.sum() / 1e3:.3f} ms)")
    table = by_part()
    print(table.sort_values(["batch", "part"]).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    g = graph(128)
    flops = g.forward_flops() + g.backward_flops()
    print(f"model FLOPs per image (forward + backward): {flops / 128 / 1e9:.2f} GFLOP; parameters "
          f"{g.total_params():,}")
    bounds = pointwise_rule_range()
    print("TF32 linears priced as 1x1 convolutions within the shapes the rule was chosen on: " + ", ".join(
        f"{d.upper()} {bounds[f'{d}_min']:,}..{bounds[f'{d}_max']:,}" for d in "mnk")
        + " (outside: the TF32 GEMM size curve, assumed)")
    errors = whole_model_errors()
    median = statistics.median(abs(e) for e in errors.values())
    worst = max(abs(e) for e in errors.values())
    met = median <= WHOLE_MODEL_TARGET
    print("whole model (every row held out): " + ", ".join(f"batch {b} {100 * e:+.1f}%" for b, e in errors.items())
          + f"; median |error| {100 * median:.1f}% (target {100 * WHOLE_MODEL_TARGET:.0f}%: "
          f"{'met' if met else 'NOT met'}), every batch within {100 * WHOLE_MODEL_TARGET:.0f}% (the stricter "
          f"reading): {'yes' if worst <= WHOLE_MODEL_TARGET else 'no'} (worst {100 * worst:.1f}%)")
    return 0 if met and math.isfinite(median) else 1


if __name__ == "__main__":
    raise SystemExit(main())
