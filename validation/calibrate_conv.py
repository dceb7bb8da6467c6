"""Calibrate TF32 convolutions on the A100 from DeepPool's per-layer profiles.

Data: ``data/deeppool_a100_v1_layers.csv.gz``, the rows of the four
DeepPool ``*LayerGpuProfileA100.txt`` files in the V1_PERCENTILE format (VGG-16, ResNet-34,
Inception-v3, ViT; batches 1-128; the convolutions at batches >= :data:`MIN_BATCH` are used, the
48 linear layers are not: too few to fit and cuBLAS, not cuDNN; filtered from ``shared/published/seeds/deeppool_layer_profiles.csv``,
DeepPoolML/DeepPool@7f823f2, MIT). Each row is one layer's forward + backward time (ms, the mean of
CUDA-event intervals during normal training, first 100 iterations skipped; seeds/README.md).

**Precision.** DeepPool's C++ runtime trains fp32 tensors; cuDNN runs fp32 convolutions in TF32
by default on Ampere (``allow_tf32``) and cuBLAS did so for matmuls until PyTorch 1.12. The rates
confirm it: 30-40 TFLOP/s on the large convolutions, above the A100's 19.5 TFLOP/s fp32 peak and
far below its 312 fp16 peak. So the rows are TF32 kernels (an inference from the rates, stated).
**Which A100.** The file names say A100 without the variant; the 40 GB SXM4 (AWS p4d) is taken. The
convolutions are compute-bound at batches >= 8, so the HBM bandwidth hardly enters.

**Two models.** Each layer is built by the network builder (workloads/networks/builder.py: a
convolution is one implicit GEMM forward, M = N·H_out·W_out, N = C_out, K = C_in·k_h·k_w, and two in
backward, data and weight gradients; the first layer of a network has no data gradient) and priced
by the compute model (simulator/cost/compute.py) with ``training.tf32``.

1. *By shape* (``conv_efficiency.tf32``, what the simulator prices convolutions with): the
   saturating tile model of :class:`hardware_specs.schema.ConvEfficiency` (output channels and
   reduction length of each pass, factors for strided, 1x1 and 1xk windows), fitted with a per-layer
   floor per network (:data:`FLOORED_NETWORKS`: DeepPool's host time per layer, which the ResNet and
   Inception rows at batch 32 reach) by least squares on log time over the fit half. Beside it, the
   *general* fit (:func:`fit_conv_general`): the same shape model with one DeepPool host model for
   every network (:class:`DeepPoolHost`: a host time added to each layer and a floor, fitted on the fit
   half of all networks together; no constant knows a network's name). Held-out per-layer median
   |error|: general 11.6% (Inception-v3 12.9%, ResNet-34 13.3%, VGG-16 6.8%), per-network floors
   10.5%, the specs' shape model without host time 15.8%. The A100 specs keep the per-network fit's
   shape model: the general fit's prices VGG's large layers 6.8% low, which moves DeepPool's
   whole-model batch-64/128 blocks past 5% (VGG 128 -5.9%, Inception 128 -6.9%, 64 +6.7%; within
   3.9% with the specs'). Either way ``clustersim simulate`` applies the same shape model to every
   network and no DeepPool host time.
   **1x3 / 3x1 windows** are implicit GEMMs over K = C_in·3 (conv.py's mapping; Chetlur et al. 2014,
   Sec. 3): the general fit's ``asymmetric_factor`` is 1.04, no 1-wide penalty. Their -47% without
   host time is DeepPool's batch-32 host time: Inception's 384->384 1x3 at 8x8 takes 0.50-0.57 ms at
   batch 32 and 0.26-0.28 ms at batch 64 (at batch 128 the per-network fit is within +6/+10%).
   A DeepPool ``conv2d`` row is the convolution and the in-place ReLU after it (:func:`deeppool_layer_ops` says
   why). Same FLOPs, different rates: VGG's 3x3 convolutions run at 35 TFLOP/s with 64 channels and
   100 with 512; ResNet's 88 GFLOP 3x3 layers at batch 128 at 40 (64 channels) to 90 (512).
2. *By size* (``gemm_curves.tf32``, kept for TF32 GEMMs such as linear layers): the A100 cuBLAS
   shape of validation/calibrate_a100.py (``BASE_SHAPE``), moved to the TF32 peak as
   validation/calibrate_microbench.py moves every precision (a GEMM of equal *duration* keeps its
   efficiency) and stretched along the size axis by a factor ``shift``, at a level; for each
   ``shift`` of :data:`SHIFTS` the level is fitted by least squares on log time over the fit half
   (convolutions priced on the curve alone); the pair with the smallest fit loss is taken. One size
   curve cannot tell a 64-channel layer from a 512-channel one of the same FLOPs: held-out 21%.

**Split.** A row is held out when the md5 of its layer id (type, parameters, batch, input shape)
is odd: a layer measured in several blocks or files stays in one half. tests/test_conv_calibration.py
checks the held-out half (median |error| <= 15%, the issue-19 target for per-layer times).

``python -m validation.calibrate_conv`` prints both fits, their errors by half, host model, network,
window and batch (exit 1 when the general host model's held-out median, overall or of a network, is
past 15%), and the ``gemm_curves.tf32`` and ``conv_efficiency.tf32`` blocks for the A100 specs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares, minimize_scalar

from hardware_specs.catalog import ACCELERATORS
from hardware_specs.schema import (
    Accelerator,
    ComputeEfficiency,
    ConvEfficiency,
    EfficiencyPoint,
    PrecisionCurve,
)
from simulator.cost.compute import ComputeModel
from simulator.cost.conv import conv_channels_reduction
from validation.calibrate_a100 import BASE_SHAPE
from workloads.networks.builder import NetBuilder

DATA = Path(__file__).resolve().parent / "data" / "deeppool_a100_v1_layers.csv.gz"
ACCELERATOR = "a100-sxm-40g"
A100_BF16_PEAK = 312.0
HELDOUT_MEDIAN_TARGET = 0.15
#: Rows below this batch measure DeepPool's per-layer host cost more than the kernels: their rates
#: rise in proportion to the batch in every network (a fixed time per layer), so they are left out.
MIN_BATCH = 32


def is_heldout(key: str) -> bool:
    """Odd md5 of the layer id = held-out, even = fit (as validation/calibrate_microbench.py)."""
    return int(hashlib.md5(key.encode()).hexdigest(), 16) % 2 == 1


@dataclass(frozen=True)
class LayerRow:
    key: str            # DeepPool's layer id, verbatim
    row: int            # 0-based row of the data file
    network: str        # the profile file's network (VGG, ResNet, Inception, ViT)
    layer_type: str     # conv2d | linear
    params_json: str    # the layer's parameters as DeepPool prints them
    batch: int
    input_dim: tuple[int, ...]
    measured_s: float   # forward + backward

    @property
    def heldout(self) -> bool:
        return is_heldout(self.key)


@cache
def layer_rows() -> tuple[LayerRow, ...]:
    df = pd.read_csv(DATA)
    out = []
    for index, r in df.iterrows():
        if r["layer_type"] != "conv2d" or int(r["batch_size_per_gpu"]) < MIN_BATCH:
            continue
        dims = json.loads(r["input_dim"]) if str(r["input_dim"]).startswith("[") else [int(r["input_dim"])]
        out.append(LayerRow(str(r["layer_id_verbatim"]), int(index), str(r["profile_file"]).split("Layer")[0],
                            str(r["layer_type"]), str(r["layer_params_json"]), int(r["batch_size_per_gpu"]),
                            tuple(int(d) for d in dims), float(r["fwbw_time_avg_ms"]) / 1e3))
    return tuple(out)


@cache
def layer_ops(row: LayerRow) -> tuple:
    """The builder's forward and backward kernels of one profiled layer at its batch (fp32 bytes)."""
    b = NetBuilder("deeppool-layer", row.batch, 4)
    p = json.loads(row.params_json)
    if row.layer_type == "linear":
        x = b._new((p["in_features"],), "previous")
        b.linear("layer", x, p["out_features"], bias=bool(p.get("bias", True)))
    else:
        first = p["in_channels"] == 3          # a network's first convolution: its input needs no gradient
        shape = row.input_dim
        x = b.input(*shape) if first else b._new(shape, "previous")
        b.conv2d("layer", x, p["out_channels"], p["kernel_size"], p["stride"], p["padding"])
    layer = b.layers[-1]
    return tuple(layer.forward) + tuple(layer.backward)


SHIFTS = (1.0, 3.0, 10.0, 30.0, 100.0, 200.0, 300.0, 500.0, 1000.0)


def tf32_curve(level: float, shift: float, accel: Accelerator) -> list[EfficiencyPoint]:
    """``BASE_SHAPE`` at ``level``, moved to the TF32 peak (equal duration, equal efficiency) and
    stretched ``shift`` times along the size axis."""
    ratio = accel.peak_tflops["tf32"] / A100_BF16_PEAK * shift
    return [EfficiencyPoint(gflop=float(f"{g * ratio:.4g}"), efficiency=round(min(1.0, level * s), 4))
            for g, s in BASE_SHAPE]


def with_tf32_curve(accel: Accelerator, level: float, shift: float, fitted_on: str | None = None) -> Accelerator:
    curves = dict(accel.efficiency.gemm_curves)
    curves["tf32"] = PrecisionCurve(points=tf32_curve(level, shift, accel), source="validation/calibrate_conv.py",
                                    fitted_on=fitted_on)
    eff = accel.efficiency.model_copy(update={"gemm_curves": curves, "in_training_gemm_factor": 1.0,
                                              "conv_efficiency": {}, "linear_as_pointwise_conv": (),
                                              "linear_as_pointwise_conv_range": {}})
    return accel.model_copy(update={"efficiency": ComputeEfficiency.model_validate(eff.model_dump())})


def simulated_s(model: ComputeModel, row: LayerRow) -> float:
    """The compute model's time of the layer's kernels (``model``: fp32 with TF32, one accelerator)."""
    return sum(model.time_s(op) for op in layer_ops(row) if op.kind != "collective")


def tf32_model(level: float, shift: float) -> ComputeModel:
    return ComputeModel(with_tf32_curve(ACCELERATORS.get(ACCELERATOR), level, shift), "fp32", tf32=True)


def _loss(rows: list[LayerRow], level: float, shift: float) -> float:
    model = tf32_model(level, shift)
    return sum(math.log(simulated_s(model, r) / r.measured_s) ** 2 for r in rows)


def fit_curve(rows: list[LayerRow]) -> tuple[float, float]:
    """(level, shift) with the smallest sum of squared log errors over ``rows``."""
    best: tuple[float, float, float] | None = None
    for shift in SHIFTS:
        level = float(minimize_scalar(lambda v, s=shift: _loss(rows, v, s), bounds=(0.05, 1.0), method="bounded",
                                      options={"xatol": 1e-4}).x)
        loss = _loss(rows, level, shift)
        if best is None or loss < best[0]:
            best = (loss, level, shift)
    return best[1], best[2]


def fit_rows_label(rows: list[LayerRow]) -> str:
    return (f"validation/data/deeppool_a100_v1_layers.csv.gz, fit half (md5 of the layer id even): "
            f"{len(rows)} rows of {', '.join(sorted({r.network for r in rows}))}")


@cache
def fitted() -> tuple[float, float, str]:
    """(level, shift, the rows they were fitted on)."""
    rows = [r for r in layer_rows() if not r.heldout]
    return (*fit_curve(rows), fit_rows_label(rows))


def errors(half: str = "heldout") -> pd.DataFrame:
    """Per row: simulated / measured - 1 with the fitted curve."""
    level, shift, _ = fitted()
    model = tf32_model(level, shift)
    rows = [r for r in layer_rows() if half == "all" or (half == "heldout") == r.heldout]
    return pd.DataFrame([{"network": r.network, "layer_type": r.layer_type, "batch": r.batch, "key": r.key,
                          "measured_ms": 1e3 * r.measured_s, "simulated_ms": 1e3 * simulated_s(model, r),
                          "error": simulated_s(model, r) / r.measured_s - 1} for r in rows])


def spec_block() -> dict:
    level, shift, label = fitted()
    accel = ACCELERATORS.get(ACCELERATOR)
    return {"points": [p.model_dump() for p in tf32_curve(level, shift, accel)],
            "source": f"TF32 convolution layers: level {level:.4f} on validation/calibrate_a100.py BASE_SHAPE "
                      f"stretched x{shift:g} in size (validation/calibrate_conv.py)",
            "fitted_on": label}


# -- the convolution model by shape (ConvEfficiency, simulator/cost/conv.py) -------------------------

#: ConvEfficiency fields in the order the fit varies them, with their bounds.
CONV_FIELDS = ("level", "half_channels", "half_reduction", "strided_factor", "pointwise_factor",
               "asymmetric_factor")
CONV_BOUNDS = ((0.05, 0.0, 0.0, 0.2, 0.3, 0.3), (1.0, 2000.0, 2e4, 2.0, 2.0, 2.0))
FLOOR_BOUNDS_S = (0.0, 2e-3)
#: Networks whose rows at batch >= MIN_BATCH reach DeepPool's per-layer host time (VGG's layers are
#: all far longer: its flatten row takes 10 us at every batch >= 8, the GPU sets the pace). Only the
#: per-network fit (:func:`fit_conv`) uses the names; the general one (:func:`fit_conv_general`) does not.
FLOORED_NETWORKS = ("inception", "resnet")
#: The host models a DeepPool row can be priced with (:func:`conv_errors`).
HOST_MODELS = ("general", "per_network", "none")


@dataclass(frozen=True)
class DeepPoolHost:
    """DeepPool's runtime around one profiled convolution layer, the same for every network (the
    *general* host model; fitted with the shape model on the fit half of all networks together):
    the row takes ``max(device + host_per_layer_s, floor_s)``.

    ``host_per_layer_s`` adds: DeepPool times each layer with CUDA events around the layer's kernels,
    so the host's work per layer (module dispatch, event records, cuDNN's per-call setup) shows in
    the interval whatever the batch: the same layer's rows at batches 64 and 128 differ by less than
    the kernels' share (Inception's 1280->192 1x1 at 8x8: 0.265 / 0.411 ms, an intercept of ~0.12 ms
    where the kernels scale through zero). ``floor_s``: the host-bound time of a layer when its
    kernels are shorter (the batch-32 rows of small layers take 0.4-0.8 ms, more than the same
    layers at batch 64). Neither is in the A100 specs: ``clustersim simulate`` prices a network's
    convolutions with the shape model alone, and its framework's host time comes from the framework
    spec (simulator/cost/framework.py)."""

    host_per_layer_s: float
    floor_s: float

    def row_s(self, device_s):
        return np.maximum(np.asarray(device_s) + self.host_per_layer_s, self.floor_s)


@dataclass(frozen=True)
class ConvRow:
    """A profiled convolution layer as the shape model sees it: its passes (FLOPs, output channels,
    reduction, kh, kw, stride, seconds of their HBM traffic) and the seconds of its other kernels
    (the in-place ReLU, launches)."""

    row: LayerRow
    passes: tuple[tuple[float, float, float, int, int, int, float], ...]
    other_s: float


@cache
def deeppool_layer_ops(row: LayerRow) -> tuple:
    """What one DeepPool ``conv2d`` row runs: the convolution and the in-place ReLU after it. The
    ReLU is inside the row: DeepPool's ``profile/A100_vgg.prof`` lists VGG's ReLUs apart, and its
    convolution + ReLU pairs add up to the V1 file's convolution rows (batch 64, 64->64 at 224x224:
    5.46 + 15.31 ms against 20.02 ms); the ResNet and Inception rows are taken to be built the
    same way (their files list no ReLU and no batch norm rows: whether a batch norm ran inside is
    not stated, and none is modelled; adding one to their rows fits worse: held-out 13.3% against
    11.6% with the general host model)."""
    b = NetBuilder("deeppool-layer", row.batch, 4)
    p = json.loads(row.params_json)
    first = p["in_channels"] == 3
    x = b.input(*row.input_dim) if first else b._new(row.input_dim, "previous")
    y = b.conv2d("layer", x, p["out_channels"], p["kernel_size"], p["stride"], p["padding"])
    b.relu("relu", y)
    return tuple(op for layer in b.layers for op in (*layer.forward, *layer.backward))


def conv_model(params, label: str | None = None, host: str = "") -> ConvEfficiency:
    values = dict(zip(CONV_FIELDS, (float(f"{v:.4g}") for v in params), strict=True))
    return ConvEfficiency(**values, source="validation/calibrate_conv.py: TF32 convolution passes by shape" + host,
                          fitted_on=label)


def catalog_model(conv: ConvEfficiency | None = None) -> ComputeModel:
    """The A100's compute model in fp32 with TF32, with ``conv`` as its TF32 convolution model."""
    accel = ACCELERATORS.get(ACCELERATOR)
    if conv is not None:
        eff = accel.efficiency.model_copy(update={"conv_efficiency": {**accel.efficiency.conv_efficiency,
                                                                      "tf32": conv}})
        accel = accel.model_copy(update={"efficiency": ComputeEfficiency.model_validate(eff.model_dump())})
    return ComputeModel(accel, "fp32", tf32=True)


@cache
def conv_rows() -> tuple[ConvRow, ...]:
    model = catalog_model()
    out = []
    for r in layer_rows():
        ops = deeppool_layer_ops(r)
        convs = [op for op in ops if op.conv is not None]
        passes = tuple((op.flops, *conv_channels_reduction(op), op.conv[1], op.conv[2], op.conv[3],
                        op.bytes_moved / model.mem_bw) for op in convs)
        other = sum(model.time_s(op) for op in ops if op.conv is None) + len(convs) * model.launch_s
        out.append(ConvRow(r, passes, other))
    return tuple(out)


def _device_s(params, rows: list[ConvRow], peak_flops: float) -> np.ndarray:
    """The shape model's kernel time of each row (the formula of ConvEfficiency.efficiency, vectorised
    for the fit; :func:`conv_errors` prices the rows through the compute model itself)."""
    level, half_c, half_k, strided, pointwise, asym = params
    out = []
    for r in rows:
        t = r.other_s
        for flops, c, k, kh, kw, stride, memory_s in r.passes:
            eff = level * c / (c + half_c) * k / (k + half_k)
            eff *= (strided if stride > 1 else 1.0) * (pointwise if kh == kw == 1 else asym if kh != kw else 1.0)
            t += max(flops / (peak_flops * min(1.0, eff)), memory_s)
        out.append(t)
    return np.array(out)


def _predicted_s(params, floors_s: dict[str, float], rows: list[ConvRow], peak_flops: float) -> np.ndarray:
    """Row times with a floor per network (the *per-network* host model)."""
    device = _device_s(params, rows, peak_flops)
    return np.maximum(device, np.array([floors_s.get(r.row.network, 0.0) for r in rows]))


def _general_s(params, host: DeepPoolHost, rows: list[ConvRow], peak_flops: float) -> np.ndarray:
    """Row times with the general host model (:class:`DeepPoolHost`)."""
    return host.row_s(_device_s(params, rows, peak_flops))


#: Starting points of the least-squares fits (shape parameters; the fits are not convex, so each
#: starts from these and keeps the smallest loss).
STARTS = ((0.7, 30.0, 1000.0, 0.6, 1.0, 0.8), (0.82, 104.0, 168.0, 0.49, 0.455, 0.65),
          (0.9, 70.0, 230.0, 0.55, 0.68, 1.0))


def _least_squares(residuals, host_starts: tuple[tuple[float, ...], ...], n_host: int):
    lo = (*CONV_BOUNDS[0], *(FLOOR_BOUNDS_S[0] for _ in range(n_host)))
    hi = (*CONV_BOUNDS[1], *(FLOOR_BOUNDS_S[1] for _ in range(n_host)))
    best = None
    for shape in STARTS:
        for host in host_starts:
            x0 = np.array([*shape, *host])
            result = least_squares(residuals, x0, bounds=(lo, hi), x_scale=x0)
            if best is None or result.cost < best.cost:
                best = result
    return best.x


def fit_conv(rows: list[ConvRow]) -> tuple[tuple[float, ...], dict[str, float]]:
    """(ConvEfficiency parameters, DeepPool's per-layer floor per network of :data:`FLOORED_NETWORKS`)
    with the smallest sum of squared log errors over ``rows`` (scipy least_squares, trust-region
    reflective within :data:`CONV_BOUNDS`, from the first of :data:`STARTS`). The floor is the
    runtime's host time per layer, which differs between the networks' profiles (ResNet-34's rows at
    batch 32: 0.56-0.76 ms, Inception-v3's: 0.24-0.80 ms). A new network has no such floor: see
    :func:`fit_conv_general`."""
    peak = catalog_model().peak_flops
    measured = np.array([r.row.measured_s for r in rows])
    n = len(CONV_FIELDS)

    def residuals(x):
        return np.log(_predicted_s(x[:n], dict(zip(FLOORED_NETWORKS, x[n:], strict=True)), rows, peak) / measured)

    x0 = np.array([*STARTS[0], *(4e-4 for _ in FLOORED_NETWORKS)])
    lo = (*CONV_BOUNDS[0], *(FLOOR_BOUNDS_S[0] for _ in FLOORED_NETWORKS))
    hi = (*CONV_BOUNDS[1], *(FLOOR_BOUNDS_S[1] for _ in FLOORED_NETWORKS))
    x = least_squares(residuals, x0, bounds=(lo, hi), x_scale=x0).x
    return (tuple(float(f"{v:.4g}") for v in x[:n]),
            {net: float(f"{v:.4g}") for net, v in zip(FLOORED_NETWORKS, x[n:], strict=True)})


def fit_conv_general(rows: list[ConvRow]) -> tuple[tuple[float, ...], DeepPoolHost]:
    """(ConvEfficiency parameters, :class:`DeepPoolHost`) with the smallest sum of squared log errors
    over ``rows`` of every network together: no parameter knows a network's name."""
    peak = catalog_model().peak_flops
    measured = np.array([r.row.measured_s for r in rows])
    n = len(CONV_FIELDS)

    def residuals(x):
        return np.log(_general_s(x[:n], DeepPoolHost(x[n], x[n + 1]), rows, peak) / measured)

    x = _least_squares(residuals, ((1e-4, 4e-4), (2e-4, 5e-4), (5e-5, 6e-4)), 2)
    return (tuple(float(f"{v:.4g}") for v in x[:n]),
            DeepPoolHost(float(f"{x[n]:.4g}"), float(f"{x[n + 1]:.4g}")))


def _host_label(host: DeepPoolHost) -> str:
    return (f", DeepPool conv2d rows modelled as convolution + in-place ReLU, fitted with DeepPool's general "
            f"host model (every network: +{1e6 * host.host_per_layer_s:.0f} us per layer, floor "
            f"{1e6 * host.floor_s:.0f} us; not part of the simulator's price)")


@cache
def fitted_conv() -> tuple[ConvEfficiency, dict[str, float]]:
    """(the TF32 convolution model the A100 specs carry, DeepPool's per-layer floor in s by network),
    fitted on the fit half with a floor per named network (:func:`fit_conv`). The shape model is the
    same for every network; the floors are DeepPool's and never enter ``clustersim simulate``."""
    rows = [r for r in conv_rows() if not r.row.heldout]
    params, floors_s = fit_conv(rows)
    return conv_model(params, fit_rows_label([r.row for r in rows])), floors_s


@cache
def fitted_conv_general() -> tuple[ConvEfficiency, DeepPoolHost]:
    """(a TF32 convolution model, DeepPool's general host model), fitted on the fit half of every
    network together (:func:`fit_conv_general`): what a DeepPool row of a network with no fit of its
    own gets."""
    rows = [r for r in conv_rows() if not r.row.heldout]
    params, host = fit_conv_general(rows)
    return conv_model(params, fit_rows_label([r.row for r in rows]), _host_label(host)), host


def row_time_s(model: ComputeModel, row: LayerRow, host: str = "general") -> float:
    """A DeepPool conv2d row's time: its kernels in ``model`` under the host model ``host``."""
    device = sum(model.time_s(op) for op in deeppool_layer_ops(row))
    if host == "general":
        return float(fitted_conv_general()[1].row_s(device))
    if host == "per_network":
        return max(device, fitted_conv()[1].get(row.network, 0.0))
    return device


def conv_errors(half: str = "heldout", host: str = "general") -> pd.DataFrame:
    """Per row: simulated / measured - 1 with the shape model fitted under the host model ``host``
    (:data:`HOST_MODELS`: ``general``, one DeepPool host model for every network, with the shape
    model fitted under it; ``per_network``, a floor per named network, with the specs' shape model;
    ``none``, the specs' shape model without host time), priced by the compute model."""
    if host not in HOST_MODELS:
        raise ValueError(f"host must be one of {HOST_MODELS}, not {host!r}")
    conv = fitted_conv_general()[0] if host == "general" else fitted_conv()[0]
    model = catalog_model(conv)
    rows = [r for r in layer_rows() if half == "all" or (half == "heldout") == r.heldout]
    out = []
    for r in rows:
        simulated = row_time_s(model, r, host)
        p = json.loads(r.params_json)
        k = p["kernel_size"]
        window = f"{k}x{k}" if isinstance(k, int) else "x".join(map(str, k))
        out.append({"network": r.network, "batch": r.batch, "key": r.key, "window": window,
                    "stride": p["stride"], "measured_ms": 1e3 * r.measured_s, "simulated_ms": 1e3 * simulated,
                    "error": simulated / r.measured_s - 1})
    return pd.DataFrame(out)


def conv_spec_block() -> dict:
    """The ``conv_efficiency.tf32`` block of the A100 specs (the per-network fit's shape model:
    module docstring says why not the general one's)."""
    conv, floors_s = fitted_conv()
    block = conv.model_dump()
    floors = ", ".join(f"{net} {1e6 * v:.0f} us" for net, v in floors_s.items())
    block["source"] = (f"validation/calibrate_conv.py: TF32 convolution passes by shape, DeepPool conv2d rows "
                       f"modelled as convolution + in-place ReLU, rows floored at DeepPool's per-layer host "
                       f"time ({floors}; fitted with it)")
    return block


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="python -m validation.calibrate_conv", description=__doc__.split("\n\n")[0]).parse_args(argv)
    level, shift, label = fitted()
    print(f"TF32 convolution curve: level {level:.4f}, size stretch x{shift:g}, fitted on {label}")
    for half in ("fit", "heldout"):
        df = errors(half)
        print(f"{half}: {len(df)} rows, median |error| {100 * df.error.abs().median():.1f}%, "
              f"max {100 * df.error.abs().max():.1f}%")
        table = df.groupby(["network", "layer_type"]).error.agg(
            rows="size", median_abs=lambda e: float(np.median(np.abs(e))), median=lambda e: float(np.median(e)))
        print(table.to_string(float_format=lambda v: f"{100 * v:.1f}%"))
        by_batch = df.groupby("batch").error.apply(lambda e: statistics.median(abs(x) for x in e))
        print("  median |error| by batch: " + ", ".join(f"{b}: {100 * v:.0f}%" for b, v in by_batch.items()))
    print("gemm_curves.tf32 for the A100 specs:", json.dumps(spec_block(), indent=1))
    conv, floors_s = fitted_conv()
    general, host = fitted_conv_general()
    print(f"\nTF32 convolutions by shape (A100 specs; per-network fit): {conv.model_dump(exclude={'source', 'fitted_on'})}")
    print(f"TF32 convolutions by shape (general fit): {general.model_dump(exclude={'source', 'fitted_on'})}")
    print(f"DeepPool host model, general (every network): +{1e6 * host.host_per_layer_s:.0f} us per layer, floor "
          f"{1e6 * host.floor_s:.0f} us; per-network comparison floors (us): "
          f"{ {net: round(1e6 * v) for net, v in floors_s.items()} }")
    for half in ("fit", "heldout"):
        for name in HOST_MODELS:
            df = conv_errors(half, name)
            by_net = ", ".join(f"{net} {100 * g.error.abs().median():.1f}%" for net, g in df.groupby("network"))
            print(f"{half} [{name}]: {len(df)} rows, median |error| {100 * df.error.abs().median():.1f}%, "
                  f"max {100 * df.error.abs().max():.1f}%; by network: {by_net}")
        df = conv_errors(half)
        print(f"{half} [general] by network, window and stride:")
        print(df.groupby(["network", "window", "stride"]).error.agg(
            rows="size", median_abs=lambda e: float(np.median(np.abs(e))), median="median").to_string(
            float_format=lambda v: f"{100 * v:.1f}%"))
        by_batch = df.groupby("batch").error.apply(lambda e: statistics.median(abs(x) for x in e))
        print("  median |error| by batch: " + ", ".join(f"{b}: {100 * v:.1f}%" for b, v in by_batch.items()))
    print("conv_efficiency.tf32 for the A100 specs:", json.dumps(conv_spec_block(), indent=1))
    held = conv_errors("heldout", "general")
    by_net = held.groupby("network").error.apply(lambda e: e.abs().median())
    met = bool(held.error.abs().median() <= HELDOUT_MEDIAN_TARGET and (by_net <= HELDOUT_MEDIAN_TARGET).all())
    print(f"issue 19 per-layer target (held-out median |error| <= {100 * HELDOUT_MEDIAN_TARGET:.0f}%, one DeepPool host "
          f"model for every network): {100 * held.error.abs().median():.1f}% overall, "
          + ", ".join(f"{net} {100 * v:.1f}%" for net, v in by_net.items()) + (": met" if met else ": NOT met (exit 1)"))
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
