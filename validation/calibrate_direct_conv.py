"""Fit the bandwidth of direct (depthwise / grouped) convolution kernels on DLE's EfficientNet rows.

What is fitted: ``efficiency.direct_conv.bandwidth_efficiency`` (hardware_specs.schema.DirectConvEfficiency),
the achieved / peak HBM bandwidth of a convolution pass that cuDNN runs as a direct kernel on the CUDA
cores (simulator/cost/conv.py picks it over the grouped implicit GEMM when it is faster: every
depthwise pass of an MBConv block). Priced at the streaming-kernel roofline, EfficientNet-B0/B4
trained 2-3x faster in the simulator than NVIDIA DeepLearningExamples measures, TF32 and AMP alike,
on A100 and V100 (cnn_dle held-out +58% to +188%). No per-kernel depthwise measurement is in this
project's data (DeepPool's A100 profiles have no grouped layer; PipeDream's NASNet-A mobile profile
has depthwise layers, but at 0.3 ms each, its per-layer host floor, with no GPU named).

How: one fraction of peak HBM bandwidth per chip, the same for every precision, chosen so that the
median simulated / measured images/s of that chip's fit rows is 1 (bisection on its log; the rate
falls monotonically as the fraction falls). Per chip, because one fraction for both leaves V100 20%
too slow where A100 is right: a depthwise kernel that reaches a similar absolute rate on both is a
smaller fraction of the A100's 2.3x higher bandwidth. Fit rows: the fit half of ``cnn_training_throughput_dle.csv`` (validation/modern/case.py's md5 split of
the row key, the split the held-out check uses) whose network has depthwise convolutions (the
EfficientNet rows; the profile group tag ``-efficientnet``) on one GPU, set-aside rows excluded. One GPU
only: DLE's multi-GPU rows keep 0.75-0.97x of the one-GPU rate per GPU, a loss to synchronisation that no
kernel has (fitted on them, the bandwidth left the one-GPU rows 5-21% slow); the EfficientNet groups'
multi-GPU fit rows fit ``sync_jitter`` instead (validation/modern/profiles.py ``fit_jitter_only``). Held-out rows
are never read here: tests/test_modern_validation.py checks them.

``python -m validation.calibrate_direct_conv`` prints the fit and the fit-half errors per row;
``--write`` writes the ``direct_conv`` block into the accelerator specs of :data:`FITTED_ACCELERATORS`
(the fitted rows' chips) and :data:`SAME_CHIP` (the other memory size of the same chip).
"""

from __future__ import annotations

import argparse
import copy
import math
import re
import statistics
from pathlib import Path
from typing import Any

from validation.layout_ranking import _catalog_yaml, profiled_node
from validation.modern.case import ModernCase
from validation.modern.profiles import load_groups, with_constants

SET = "cnn_dle"
FAMILY_TAG = "-efficientnet"
BOUNDS = (0.005, 1.0)
BISECTION_STEPS = 14
#: the accelerators of the fit rows, and the same chips in another memory size (the value carries over)
FITTED_ACCELERATORS = ("a100-sxm-80g", "v100-sxm2-16g")
SAME_CHIP = {"a100-sxm-40g": "a100-sxm-80g", "v100-sxm-32g": "v100-sxm2-16g"}
SPECS = Path(__file__).resolve().parents[1] / "hardware_specs" / "accelerators"
SOURCE = ("validation/calibrate_direct_conv.py: the fraction of peak HBM bandwidth of direct depthwise/grouped "
          "convolution passes on this chip, fitted so that the median simulated/measured images/s of its fit rows is 1")


def fit_cases(accelerator: str) -> list[ModernCase]:
    """The fit-half, counted one-GPU DLE rows on ``accelerator`` of networks with depthwise convolutions."""
    from validation.modern.registry import built

    return [c for c in built(SET)[0] if not c.heldout and not c.set_aside and FAMILY_TAG in c.profile_group
            and c.accelerator == accelerator and c.scenario["cluster"]["num_gpus"] == 1]


def fitted_on(cases: list[ModernCase]) -> str:
    rows = ", ".join(f"{SET}:{c.row}" for c in sorted(cases, key=lambda c: c.row))
    return (f"cnn_training_throughput_dle.csv (validation/data/), fit half (md5 of the row key even), one-GPU "
            f"EfficientNet rows on {cases[0].accelerator}: {len(cases)} rows ({rows})")


def with_direct_conv(case: ModernCase, fraction: float, groups: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The case's scenario with its profile constants and ``direct_conv`` at ``fraction`` on its accelerator."""
    raw = copy.deepcopy(with_constants(case, groups.get(case.profile_group)))
    node = raw["cluster"]["node"]
    if isinstance(node, str):
        raw["cluster"]["node"] = node = profiled_node(node, copy.deepcopy(
            _catalog_yaml("accelerators", _catalog_yaml("nodes", node)["accelerator"])["efficiency"]))
    node["accelerator"]["efficiency"]["direct_conv"] = {"bandwidth_efficiency": fraction, "source": SOURCE}
    return raw


def ratios(cases: list[ModernCase], fraction: float, workers: int | None = 2) -> list[float]:
    """Simulated / measured images/s per case at ``fraction``."""
    from validation.modern.registry import simulate_many

    groups = load_groups(SET)
    results = simulate_many([with_direct_conv(c, fraction, groups) for c in cases], workers)
    out = []
    for case, result in zip(cases, results, strict=True):
        if "error" in result or not result.get("samples_per_s"):
            raise RuntimeError(f"row {case.row}: {result.get('error') or result.get('infeasible_reason')}")
        per_gpu = result["samples_per_s"] / case.scenario["cluster"]["num_gpus"]
        out.append(per_gpu / case.measured_rate_per_gpu)
    return out


def fit(accelerator: str, workers: int | None = 2) -> tuple[float, list[ModernCase], list[float]]:
    """The fraction whose median ratio over the chip's fit rows is 1, the rows and their ratios there."""
    cases = fit_cases(accelerator)
    lo, hi = (math.log(b) for b in BOUNDS)
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi) / 2
        if statistics.median(ratios(cases, math.exp(mid), workers)) > 1:
            hi = mid
        else:
            lo = mid
    fraction = round(math.exp((lo + hi) / 2), 4)
    return fraction, cases, ratios(cases, fraction, workers)


def block(fraction: float, cases: list[ModernCase]) -> str:
    return (f"  direct_conv:\n    bandwidth_efficiency: {fraction}\n    source: \"{SOURCE}\"\n"
            f"    fitted_on: \"{fitted_on(cases)}\"\n")


BLOCK = re.compile(r"  direct_conv:\n(?:    .*\n)+")


def write(fits: dict[str, tuple[float, list[ModernCase]]]) -> list[Path]:
    """Write each chip's block into its accelerator specs (replacing an earlier one; else before
    ``memory_bound_efficiency:``)."""
    written = []
    for name in (*FITTED_ACCELERATORS, *SAME_CHIP):
        path = SPECS / f"{name}.yaml"
        text = path.read_text()
        new = block(*fits[SAME_CHIP.get(name, name)])
        if name in SAME_CHIP:
            new = new.replace("    fitted_on:", f"    # the same chip as {SAME_CHIP[name]}: its fitted value\n"
                                                 "    fitted_on:")
        text = BLOCK.sub(new, text) if BLOCK.search(text) else text.replace(
            "  memory_bound_efficiency:", new + "  memory_bound_efficiency:", 1)
        path.write_text(text)
        written.append(path)
    return written


PIPEDREAM_CONVS = Path(__file__).resolve().parent / "data" / "pipedream_resnext_convs.csv"
CONV2D = re.compile(r"Conv2d\((\d+), (\d+), kernel_size=\((\d+), (\d+)\), stride=\((\d+), \d+\)"
                    r"(?:, padding=\((\d+), \d+\))?(?:, groups=(\d+))?")


def pipedream_conv_ratios(accelerator: str = "v100-sxm2-16g") -> dict[tuple[str, bool], float]:
    """Median measured / simulated forward + backward time of PipeDream's fp32 convolution layers,
    per (model, grouped), priced on ``accelerator`` in fp32 (CUDA cores). The GPU of the profiles is
    not named, so only the grouped layers' ratio against the dense layers' ratio of the same profile
    says something: equal when grouped convolutions are priced as well as dense ones. Each layer is
    rebuilt from its ``Conv2d(...)`` text and output size (input side = output side x stride)."""
    import pandas as pd

    from hardware_specs.catalog import ACCELERATORS
    from simulator.cost.compute import ComputeModel
    from workloads.networks.builder import NetBuilder

    model = ComputeModel(ACCELERATORS.get(accelerator), "fp32")
    by: dict[tuple[str, bool], list[float]] = {}
    for row in pd.read_csv(PIPEDREAM_CONVS).itertuples():
        m = CONV2D.match(row.node_desc)
        if m is None:
            raise ValueError(f"unparsed layer {row.node_desc!r}")
        c_in, c_out, kh, kw, stride = (int(m[i]) for i in range(1, 6))
        padding, groups = int(m[6] or 0), int(m[7] or 1)
        side = round((row.activation_size_bytes_total / 4 / row.batch / c_out) ** 0.5) * stride
        net = NetBuilder(row.model, int(row.batch), 4)
        x = net._new((c_in, side, side), "previous")
        net.conv2d("conv", x, c_out, (kh, kw), stride, padding, groups)
        layer = net.layers[-1]
        simulated_ms = 1e3 * model.ops_time_s((*layer.forward, *layer.backward))
        by.setdefault((row.model, groups > 1), []).append((row.forward_time_ms + row.backward_time_ms) / simulated_ms)
    return {key: statistics.median(values) for key, values in by.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m validation.calibrate_direct_conv", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="write the direct_conv block into the accelerator specs")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    fits = {}
    for accelerator in FITTED_ACCELERATORS:
        fraction, cases, fitted = fit(accelerator, args.workers)
        fits[accelerator] = (fraction, cases)
        print(f"{accelerator}: direct_conv.bandwidth_efficiency = {fraction} (fit rows: {len(cases)}; median "
              f"simulated/measured {statistics.median(fitted):.3f})")
        for case, ratio in zip(cases, fitted, strict=True):
            print(f"  row {case.row:>4} {case.label[:84]:<84} error {100 * (ratio - 1):+6.1f}%")
        print(block(fraction, cases))
    print("PipeDream fp32 convolutions, median measured/simulated on v100-sxm2-16g (grouped vs dense layers):")
    for (name, grouped), ratio in sorted(pipedream_conv_ratios().items()):
        print(f"  {name:<11} {'grouped' if grouped else 'dense':<8} {ratio:.2f}")
    if args.write:
        for path in write(fits):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
