"""Calibrate TF32 convolutions on the A100 from DeepPool's per-layer profiles.

Data: ``data/deeppool_a100_v1_conv_linear.csv.gz``, the ``conv2d`` and ``linear`` rows of the four
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

**Model.** Each layer is built by the network builder (workloads/networks/builder.py: a
convolution is one implicit GEMM forward, M = N·H_out·W_out, N = C_out, K = C_in·k_h·k_w, and two in
backward, data and weight gradients; the first layer of a network has no data gradient) and priced
by the compute model (simulator/cost/compute.py) with ``training.tf32``. Its efficiency curve is the
A100 cuBLAS shape of validation/calibrate_a100.py (``BASE_SHAPE``), moved to the TF32 peak as
validation/calibrate_microbench.py moves every precision (a GEMM of equal *duration* keeps its
efficiency) and stretched along the size axis by a factor ``shift`` (cuDNN's implicit-GEMM
convolutions approach their plateau at far larger sizes than cuBLAS GEMMs: a 4 GFLOP Inception
convolution runs at a quarter of the TF32 peak, a 400 GFLOP VGG one at two thirds), at a level.
For each ``shift`` of :data:`SHIFTS` the level is fitted by least squares on log time over the fit
half; the pair with the smallest fit loss is taken. The layers a
DeepPool convolution row stands for may include a fused bias and ReLU (VGG) or batch norm (the
ResNet files list no separate BN rows): the fitted level is the convolution *layer's* rate in
training, which is what a simulated CNN step needs.

**Split.** A row is held out when the md5 of its layer id (type, parameters, batch, input shape)
is odd: a layer measured in several blocks or files stays in one half. tests/test_conv_calibration.py
checks the held-out half (median |error| <= 15%, the issue-19 target for per-layer times).

``python -m validation.calibrate_conv`` prints the level, the held-out errors by network and
batch, and the ``gemm_curves.tf32`` block for the A100 specs.
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
from scipy.optimize import minimize_scalar

from hardware_specs.catalog import ACCELERATORS
from hardware_specs.schema import Accelerator, ComputeEfficiency, EfficiencyPoint, PrecisionCurve
from simulator.cost.compute import ComputeModel
from validation.calibrate_a100 import BASE_SHAPE
from workloads.networks.builder import NetBuilder

DATA = Path(__file__).resolve().parent / "data" / "deeppool_a100_v1_conv_linear.csv.gz"
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
    eff = accel.efficiency.model_copy(update={"gemm_curves": curves, "in_training_gemm_factor": 1.0})
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
    return (f"validation/data/deeppool_a100_v1_conv_linear.csv.gz, fit half (md5 of the layer id even): "
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
