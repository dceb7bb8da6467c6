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
   Inception rows at batch 32 reach) by least squares on log time over the fit half. A DeepPool
   ``conv2d`` row is the convolution and the in-place ReLU after it (:func:`deeppool_layer_ops` says
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

``python -m validation.calibrate_conv`` prints both fits, their errors by half, network, window and
batch, and the ``gemm_curves.tf32`` and ``conv_efficiency.tf32`` blocks for the A100 specs.
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
                                              "conv_efficiency": {}})
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
#: all far longer: its flatten row takes 10 us at every batch >= 8, the GPU sets the pace).
FLOORED_NETWORKS = ("inception", "resnet")


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
    not stated, and none is modelled)."""
    b = NetBuilder("deeppool-layer", row.batch, 4)
    p = json.loads(row.params_json)
    first = p["in_channels"] == 3
    x = b.input(*row.input_dim) if first else b._new(row.input_dim, "previous")
    y = b.conv2d("layer", x, p["out_channels"], p["kernel_size"], p["stride"], p["padding"])
    b.relu("relu", y)
    return tuple(op for layer in b.layers for op in (*layer.forward, *layer.backward))


def conv_model(params, label: str | None = None) -> ConvEfficiency:
    values = dict(zip(CONV_FIELDS, (float(f"{v:.4g}") for v in params), strict=True))
    return ConvEfficiency(**values, source="validation/calibrate_conv.py: TF32 convolution passes by shape",
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


def _predicted_s(params, floors_s: dict[str, float], rows: list[ConvRow], peak_flops: float) -> np.ndarray:
    """The shape model's time of each row (the formula of ConvEfficiency.efficiency, vectorised for
    the fit; :func:`conv_errors` prices the rows through the compute model itself)."""
    level, half_c, half_k, strided, pointwise, asym = params
    out = []
    for r in rows:
        t = r.other_s
        for flops, c, k, kh, kw, stride, memory_s in r.passes:
            eff = level * c / (c + half_c) * k / (k + half_k)
            eff *= (strided if stride > 1 else 1.0) * (pointwise if kh == kw == 1 else asym if kh != kw else 1.0)
            t += max(flops / (peak_flops * min(1.0, eff)), memory_s)
        out.append(max(t, floors_s.get(r.row.network, 0.0)))
    return np.array(out)


def fit_conv(rows: list[ConvRow]) -> tuple[tuple[float, ...], dict[str, float]]:
    """(ConvEfficiency parameters, DeepPool's per-layer floor per network of :data:`FLOORED_NETWORKS`)
    with the smallest sum of squared log errors over ``rows`` (scipy least_squares, trust-region
    reflective within :data:`CONV_BOUNDS`). The floor is the runtime's host time per layer, which
    differs between the networks' layer modules (ResNet-34's rows at batch 32: 0.56-0.76 ms,
    Inception-v3's: 0.24-0.80 ms)."""
    peak = catalog_model().peak_flops
    measured = np.array([r.row.measured_s for r in rows])
    n = len(CONV_FIELDS)

    def residuals(x):
        return np.log(_predicted_s(x[:n], dict(zip(FLOORED_NETWORKS, x[n:], strict=True)), rows, peak) / measured)

    x0 = np.array([0.7, 30.0, 1000.0, 0.6, 1.0, 0.8, *(4e-4 for _ in FLOORED_NETWORKS)])
    lo = (*CONV_BOUNDS[0], *(FLOOR_BOUNDS_S[0] for _ in FLOORED_NETWORKS))
    hi = (*CONV_BOUNDS[1], *(FLOOR_BOUNDS_S[1] for _ in FLOORED_NETWORKS))
    x = least_squares(residuals, x0, bounds=(lo, hi), x_scale=x0).x
    return (tuple(float(f"{v:.4g}") for v in x[:n]),
            {net: float(f"{v:.4g}") for net, v in zip(FLOORED_NETWORKS, x[n:], strict=True)})


@cache
def fitted_conv() -> tuple[ConvEfficiency, dict[str, float]]:
    """(the TF32 convolution model, DeepPool's per-layer floor in s by network), fitted on the fit half."""
    rows = [r for r in conv_rows() if not r.row.heldout]
    params, floors_s = fit_conv(rows)
    return conv_model(params, fit_rows_label([r.row for r in rows])), floors_s


def conv_errors(half: str = "heldout", floor: bool = True) -> pd.DataFrame:
    """Per row: simulated / measured - 1 with the fitted shape model, priced by the compute model;
    ``floor``: a row takes at least DeepPool's per-layer floor of its network (the runtime's host
    time per layer, which the ResNet and Inception rows at batch 32 measure: see :data:`MIN_BATCH`)."""
    conv, floors_s = fitted_conv()
    model = catalog_model(conv)
    rows = [r for r in layer_rows() if half == "all" or (half == "heldout") == r.heldout]
    out = []
    for r in rows:
        simulated = sum(model.time_s(op) for op in deeppool_layer_ops(r))
        if floor:
            simulated = max(simulated, floors_s.get(r.network, 0.0))
        p = json.loads(r.params_json)
        k = p["kernel_size"]
        window = f"{k}x{k}" if isinstance(k, int) else "x".join(map(str, k))
        out.append({"network": r.network, "batch": r.batch, "key": r.key, "window": window,
                    "stride": p["stride"], "measured_ms": 1e3 * r.measured_s, "simulated_ms": 1e3 * simulated,
                    "error": simulated / r.measured_s - 1})
    return pd.DataFrame(out)


def conv_spec_block() -> dict:
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
    print(f"\nTF32 convolutions by shape: {conv.model_dump(exclude={'source', 'fitted_on'})}, "
          f"DeepPool per-layer floor (us): { {net: round(1e6 * v) for net, v in floors_s.items()} }")
    for half in ("fit", "heldout"):
        for floor in (True, False):
            df = conv_errors(half, floor)
            print(f"{half}{'' if floor else ' (no floor)'}: {len(df)} rows, median |error| "
                  f"{100 * df.error.abs().median():.1f}%, max {100 * df.error.abs().max():.1f}%")
        print(df.groupby(["network", "window", "stride"]).error.agg(
            rows="size", median_abs=lambda e: float(np.median(np.abs(e))), median="median").to_string(
            float_format=lambda v: f"{100 * v:.1f}%"))
        by_batch = conv_errors(half).groupby("batch").error.apply(lambda e: statistics.median(abs(x) for x in e))
        print("  median |error| by batch: " + ", ".join(f"{b}: {100 * v:.1f}%" for b, v in by_batch.items()))
    print("conv_efficiency.tf32 for the A100 specs:", json.dumps(conv_spec_block(), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
