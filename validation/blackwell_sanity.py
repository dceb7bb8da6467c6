"""Blackwell sanity table: predicted model TFLOP/s per GPU and MFU on H100, B200 and GB200 NVL72 for the same
NeMo-like runs, beside what the parts' microbenchmarks say one should expect (issue 23).

No Blackwell end-to-end row exists in this project (by design: its B200/GB200 predictions must come from
specs and microbenchmarks alone), so nothing here is a validation error: it is a consistency check. Each
run is an H100 configuration NeMo published (validation/modern/nemo.py maps the row: its layout, batch and
Megatron-Core settings) or a shipped H100 example (GPT-3 175B, Mixtral 8x7B), simulated with the catalog
constants (no framework profile) on its H100 node, then on DGX B200 and GB200 NVL72 with nothing else
changed, in BF16, FP8 (per-tensor current scaling, NeMo's default) and, on Blackwell, MXFP8.

Beside each B200 / GB200 ÷ H100 ratio stand the microbenchmark ratios of the parts
(validation/data/microbench/): GEMM MAMF bf16 and fp8 (gemm_microbench.csv rows 6/8/10, 21/17/20), the
attention of one measured Llama-3.1-8B step (attention_kernels.csv row 422 FA4 on B200 over row 421 FA3 on
H200, the H100's die), HBM bandwidth (datasheets), the 8-GPU NVLS all-reduce bus bandwidth at 8 GiB
(collectives_bandwidth.csv row 100 B200 over row 90 H200, NVLink 4 as H100's) and the NVLink p2p copy
(row 117 GB200 over row 116 H100).

Flags (the exit code is 1 when any is raised):
- ``mfu>mamf``: a run's MFU (model FLOP/s over the precision's dense peak) above the part's MAMF efficiency
  in that precision: a whole step faster than the best single GEMM the part was measured to run;
- ``ratio>parts``: a Blackwell ÷ H100 ratio (against H100 with FlashAttention-3, the kernel the attention
  ratio is measured against) above the largest microbenchmark ratio of its precision (GEMM, attention, HBM;
  × 1.05): a step that got faster than every part it is made of. Not applied where the Blackwell run's
  traffic moves from InfiniBand to NVLink (GB200 NVL72's 72-GPU domain holding what spans 8-GPU H100 nodes):
  there the link ratio is 18 (900 / 50 GB/s per GPU) and no part bound holds.

``python -m validation.blackwell_sanity`` prints the table (``--json`` for the rows).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import pandas as pd
import yaml

from hardware_specs.catalog import ACCELERATORS, NODES

MICROBENCH = Path(__file__).parent / "data" / "microbench"
EXAMPLES = Path(__file__).parent.parent / "examples"
PARTS = {"H100": ("dgx-h100", "h100-sxm-80g"), "B200": ("dgx-b200", "b200"), "GB200": ("gb200-nvl72", "gb200")}
#: (label, source): a NeMo DGX H100 row (validation/modern/nemo.py row index) or a shipped example.
RUNS = [("Llama3 8B", ("nemo", 66)), ("Llama3 70B", ("nemo", 67)), ("Llama3.1 405B", ("nemo", 68)),
        ("GPT-3 175B", ("example", "gpt3-175b-fp8-512-h100.yaml")),
        ("Mixtral 8x7B", ("example", "mixtral-8x7b-ep8-h100.yaml")), ("DeepSeek-V3", ("nemo", 69))]
#: (label, training settings); MXFP8 only where the part has block-scaled tensor cores
PRECISIONS = [("BF16", {"precision": "bf16"}), ("FP8", {"precision": "fp8", "fp8_recipe": "current"}),
              ("MXFP8", {"precision": "fp8", "fp8_recipe": "mxfp8"})]
#: microbenchmark rows (file line numbers, header = line 1) and what each cell should read
GEMM_MAMF = {("H100", "bf16"): 6, ("B200", "bf16"): 8, ("GB200", "bf16"): 10,
             ("H100", "fp8"): 21, ("B200", "fp8"): 17, ("GB200", "fp8"): 20}
RATIO_MARGIN = 1.05


def _cell(csv: str, line: int, column: str) -> float:
    return float(pd.read_csv(MICROBENCH / csv).iloc[line - 2][column])


def mamf_efficiency(part: str, precision: str) -> float:
    """The part's best measured GEMM over its dense peak in that precision (MAMF, gemm_microbench.csv)."""
    accel = ACCELERATORS.get(PARTS[part][1])
    return _cell("gemm_microbench.csv", GEMM_MAMF[(part, precision)], "achieved_tflops") / accel.peak_tflops[precision]


def part_ratios(part: str) -> dict[str, float]:
    """``part`` ÷ H100 by microbenchmark (what a step made of those kernels can gain at most, or about)."""
    def mamf(p, prec):
        return _cell("gemm_microbench.csv", GEMM_MAMF[(p, prec)], "achieved_tflops")
    attention = _cell("attention_kernels.csv", 422, "achieved_tflops") / _cell("attention_kernels.csv", 421,
                                                                                 "achieved_tflops")
    accel, h100 = ACCELERATORS.get(PARTS[part][1]), ACCELERATORS.get("h100-sxm-80g")
    return {"gemm_bf16": mamf(part, "bf16") / mamf("H100", "bf16"), "gemm_fp8": mamf(part, "fp8") / mamf("H100", "fp8"),
            "attention": attention * accel.peak_tflops["bf16"] / ACCELERATORS.get("b200").peak_tflops["bf16"],
            "hbm": accel.hbm_bandwidth_gb_per_s / h100.hbm_bandwidth_gb_per_s,
            "nvls_all_reduce": _cell("collectives_bandwidth.csv", 100, "busbw_gb_per_s")
            / _cell("collectives_bandwidth.csv", 90, "busbw_gb_per_s"),
            "nvlink_p2p": _cell("collectives_bandwidth.csv", 117, "busbw_gb_per_s")
            / _cell("collectives_bandwidth.csv", 116, "busbw_gb_per_s")}


#: the GEMM shape the simulator's own kernel ratio is read at: a Llama 3 70B MLP up-projection of one 8K-token
#: micro-batch at TP 4 (m tokens, n = 2 x 28672 / 4, k = hidden 8192)
SIM_GEMM_SHAPE = (8192, 14336, 8192)


def simulated_ratios(part: str) -> dict[str, float]:
    """The same ratios as the simulator prices them (``part`` ÷ H100): one GEMM of :data:`SIM_GEMM_SHAPE` per
    precision (curve × in-step factor), the measured step's attention (:func:`validation.calibrate_microbench.
    in_step_predicted_tflops`) against H100's default kernel and against FA3, and the memory-bound bandwidth."""
    from simulator.cost.attention_kernel import with_attention_kernel
    from simulator.cost.compute import ComputeModel
    from validation.calibrate_microbench import in_step_predicted_tflops
    from workloads.graph import Op

    m, n, k = SIM_GEMM_SHAPE
    op = Op("fc1", "gemm", 2.0 * m * n * k, 2.0 * (m * k + k * n + m * n), m, n, k)
    accel, h100 = ACCELERATORS.get(PARTS[part][1]), ACCELERATORS.get("h100-sxm-80g")
    out = {f"gemm_{p}": ComputeModel(h100, p).time_s(op) / ComputeModel(accel, p).time_s(op) for p in ("bf16", "fp8")}
    mine = in_step_predicted_tflops(accel)
    out["attention_vs_fa2"] = mine / in_step_predicted_tflops(h100)
    out["attention_vs_fa3"] = mine / in_step_predicted_tflops(with_attention_kernel(h100, "fa3", "flash"))
    out["memory_bound"] = (accel.hbm_bandwidth_gb_per_s * accel.efficiency.memory_bound_efficiency
                           / (h100.hbm_bandwidth_gb_per_s * h100.efficiency.memory_bound_efficiency))
    return out


def _h100_scenario(source: tuple[str, object]) -> dict:
    kind, what = source
    if kind == "nemo":
        from validation.modern.nemo import cases

        (case,) = [c for c in cases()[0] if c.row == what]
        return copy.deepcopy(case.scenario)
    return yaml.safe_load((EXAMPLES / str(what)).read_text())


def simulate_run(raw: dict, part: str, training: dict) -> dict:
    from simulator.simulate import simulate_point

    raw = copy.deepcopy(raw)
    raw["cluster"]["node"] = PARTS[part][0]
    raw["training"] = {**raw.get("training", {}), **training}
    return simulate_point(raw, run_if_oom=True)


def _rounded(value: float | None, digits: int) -> float | None:
    return round(value, digits) if value else None


def table() -> pd.DataFrame:
    """One row per (run, precision, part). ``ratio_vs_h100``: over the same run on H100 as a user runs it
    (its default attention kernel: FlashAttention-2, fitted on the FA2 paper's H100 rows); ``ratio_vs_h100_fa3``:
    over H100 with FlashAttention-3, the kernel the measured attention ratio (B200 FA4 / H200 FA3 in one step)
    is taken against, which the ``ratio>parts`` flag reads. MXFP8 rows are over H100's FP8."""
    rows = []
    for label, source in RUNS:
        raw = _h100_scenario(source)
        h100: dict[tuple[str, str], float | None] = {}
        for prec_label, training in PRECISIONS:
            for part, (_, accel_name) in PARTS.items():
                accel = ACCELERATORS.get(accel_name)
                if prec_label == "MXFP8" and "mxfp8" not in accel.block_scaled_formats:
                    continue
                result = simulate_run(raw, part, training)
                tflops = result.get("model_tflops_per_gpu")
                peak_key = "bf16" if training["precision"] == "bf16" else "fp8"
                mfu = tflops / accel.peak_tflops[peak_key] if tflops else None
                if part == "H100":
                    h100[(prec_label, "auto")] = tflops
                    h100[(prec_label, "fa3")] = simulate_run(raw, part, {**training, "attention_kernel": "fa3"}).get(
                        "model_tflops_per_gpu")
                base = "FP8" if prec_label == "MXFP8" else prec_label
                ratio = tflops / h100[(base, "auto")] if tflops and h100.get((base, "auto")) else None
                ratio_fa3 = tflops / h100[(base, "fa3")] if tflops and h100.get((base, "fa3")) else None
                flags = []
                if mfu is not None and mfu > mamf_efficiency(part, peak_key):
                    flags.append("mfu>mamf")
                same_fabric = NODES.get(PARTS[part][0]).domain_gpus >= raw["cluster"]["num_gpus"] or \
                    NODES.get(PARTS[part][0]).domain_gpus == NODES.get(PARTS["H100"][0]).domain_gpus
                if ratio_fa3 is not None and part != "H100" and same_fabric:
                    r = part_ratios(part)
                    bound = max(r["gemm_bf16" if peak_key == "bf16" else "gemm_fp8"], r["attention"], r["hbm"])
                    if ratio_fa3 > bound * RATIO_MARGIN:
                        flags.append("ratio>parts")
                rows.append({"run": label, "precision": prec_label, "part": part, "num_gpus": raw["cluster"]["num_gpus"],
                             "tflops": _rounded(tflops, 1), "mfu": _rounded(mfu, 3),
                             "mamf_eff": round(mamf_efficiency(part, peak_key), 3),
                             "ratio_vs_h100": _rounded(ratio, 2), "ratio_vs_h100_fa3": _rounded(ratio_fa3, 2),
                             "bound": "" if part == "H100" else "parts" if same_fabric else "n/a (IB -> NVLink)",
                             "fits": bool(result.get("fits")), "flag": ",".join(flags),
                             "reason": result.get("infeasible_reason") or ""})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    t = table()
    ratios = {part: part_ratios(part) for part in ("B200", "GB200")}
    simulated = {part: simulated_ratios(part) for part in ("B200", "GB200")}
    if args.json:
        print(json.dumps({"rows": t.to_dict(orient="records"), "part_ratios_vs_h100": ratios,
                          "simulated_ratios_vs_h100": simulated}, indent=1))
    else:
        pd.set_option("display.width", 200)
        print("Predicted model TFLOP/s per GPU (catalog constants; ratio: over the same run on H100, MXFP8 over "
              "H100 FP8):\n" + t.drop(columns=["reason"]).to_string(index=False))
        print("\nMicrobenchmark ratios over H100 (what the parts say):")
        for part, r in ratios.items():
            print(f"  {part:<6} " + "  ".join(f"{k} {v:.2f}" for k, v in r.items()))
        m, n, k = SIM_GEMM_SHAPE
        print(f"The same ratios as the simulator prices them (GEMM {m}x{n}x{k}; the measured step's attention "
              "against H100's default FlashAttention-2 and against FlashAttention-3):")
        for part, r in simulated.items():
            print(f"  {part:<6} " + "  ".join(f"{k} {v:.2f}" for k, v in r.items()))
        for _, row in t[t.reason != ""].iterrows():
            print(f"  note: {row.run} {row.precision} {row.part}: {row.reason}")
    flagged = t[t["flag"] != ""]
    out = sys.stderr if args.json else sys.stdout  # --json: stdout stays one JSON document
    for _, row in flagged.iterrows():
        print(f"FLAG {row.flag}: {row.run} {row.precision} on {row.part} (MFU {row.mfu}, ratio {row.ratio_vs_h100})",
              file=out)
    print("FLAGGED" if len(flagged) else "CONSISTENT", file=out)
    return 1 if len(flagged) else 0


if __name__ == "__main__":
    raise SystemExit(main())
