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
  there the link ratio is 18 (900 / 50 GB/s per GPU) and no part bound holds;
- ``ratio<parts``: the same ratio below the smallest part ratio (GEMM, attention, HBM, the NVLink all-reduce and
  copy, and, for a run that spans nodes, the NIC bandwidth per GPU, datasheets; ÷ 1.05): a step that got slower
  than every part it is made of (B200 slower than H100 is the extreme case).

**torchtitan's MoE runs** (:func:`titan_moe_table`): the Mixtral example with ``training.framework: torchtitan``
in BF16, per-tensor FP8 and MXFP8 (over H100's FP8: judged as the FP8 ratio times the part's own MXFP8-over-FP8
gain, which the recipes' quantisation bytes bound), whose expert GEMMs run ``torch._grouped_mm`` / ``torch._scaled_grouped_mm``
(torchao's MXFP8 and FP8 MoE path). Those kernels were measured on B200 only (torchao's benchmark,
gemm_microbench.csv rows 57-75: bf16 at 0.37 of the dense curve at a group's shape; B300/GB200/GB300 carry it;
per-tensor FP8 carries the MXFP8 path by validation/calibrate_microbench.py ``GROUPED_CARRY_RULE``). H100 does not
carry them (``grouped_not_carried``: PyTorch's grouped GEMM is a per-architecture build, and B200's 0.37 with one
group is its sm100 build's): its experts are dense GEMMs, *assumed*. Each ratio whose grouped kernel is priced from
rows on both parts, or assumed on both, is judged against the parts' ratios (``parts_min``: the GEMM, attention,
HBM, NVLink all-reduce and copy ratios the experts' all-to-alls and the gradients ride on, ÷ 1.05; ``parts_max``:
the GEMM, attention and HBM ratios of the precision, × 1.05) and flagged (``FLAG ratio<parts`` / ``ratio>parts``)
when out of them. A comparison whose grouped kernel is priced from rows on one part and assumed (dense) on the
other is **not judged** (``NOT JUDGED (evidence asymmetric: one side measured, one assumed)``): neither a pass
nor a failure, and no exit 1 on its account; an MXFP8 row's own recipe gain (the part against itself) is still
judged. Beside each stands ``ratio_both_dense``: both parts' experts as dense GEMMs (the reading if
``torch._grouped_mm`` ran at its dense level on both), a bracket, not judged.

**Other current parts** (``--other-parts``, :func:`other_parts_table`): the same runs on HGX H200, 8x MI300X and
8x MI355X (MXFP8 on MI355X, whose CDNA4 matrix cores take OCP MX formats), with model TFLOP/s, MFU, tokens/s per
GPU and the ratio over H100, beside the one GEMM ratio the data measures for the part (MAMF, gemm_microbench.csv
rows 19/21, 13/6, 11/6). Printed, not judged: no attention, NVLS or p2p row of these parts exists (MI300X and MI355X
price attention as their GEMM curve x 0.7, assumed), and an AMD run keeps NeMo's H100 layout, whose TP group
drives only its peers' links of the Infinity Fabric mesh. NeMo's ``attention_kernel: cudnn`` (NVIDIA's library) is
left to the part's default on AMD.

**NeMo's rows on Blackwell** (``--nemo``, validation/blackwell_nemo.py): every representable row of
``nemo_perf_summary.csv`` as a NeMo user runs it (``training.framework: nemo``) on DGX H100, DGX B200, GB200 NVL72,
DGX B300 and GB300 NVL72 (FP8 rows also in MXFP8 on Blackwell), with the step split by class and each speed-up
(B200 / H100, GB200 / H100, GB200 / B200, B300 / H100, B300 / B200, GB300 / B300) against bounds rebuilt class by
class from the parts' microbenchmark ratios; exit 1 when one falls outside (its docstring derives the bounds).

``python -m validation.blackwell_sanity`` prints the tables (``--json`` for the rows).
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


def part_flags(ratio: float, r: dict[str, float], peak_key: str, same_fabric: bool, nic: float | None) -> list[str]:
    """``ratio>parts`` / ``ratio<parts`` of one Blackwell ÷ H100 ratio against the part ratios ``r``
    (:func:`part_ratios`): above the largest compute ratio of the precision (GEMM, attention, HBM; only where the
    traffic stays on the same kind of fabric), below the smallest of those and the NVLink ratios, and ``nic`` (the
    NIC ratio, for a run that spans nodes); 5% margin either way."""
    compute = [r["gemm_bf16" if peak_key == "bf16" else "gemm_fp8"], r["attention"], r["hbm"]]
    links = [r["nvls_all_reduce"], r["nvlink_p2p"], *([nic] if nic is not None else [])]
    flags = []
    if same_fabric and ratio > max(compute) * RATIO_MARGIN:
        flags.append("ratio>parts")
    if ratio < min(compute + links) / RATIO_MARGIN:
        flags.append("ratio<parts")
    return flags


def nic_ratio(part: str) -> float:
    """``part``'s node's NIC line rate per GPU over DGX H100's (datasheets: both 400 Gb/s per GPU, ratio 1)."""
    def per_gpu(node: str) -> float:
        n = NODES.get(node)
        return n.nics_per_node * n.nic_bandwidth_gbit_per_s / n.gpus_per_node
    return per_gpu(PARTS[part][0]) / per_gpu(PARTS["H100"][0])


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
                if ratio_fa3 is not None and part != "H100":
                    spans = raw["cluster"]["num_gpus"] > NODES.get(PARTS["H100"][0]).domain_gpus
                    flags += part_flags(ratio_fa3, part_ratios(part), peak_key, same_fabric,
                                        nic_ratio(part) if spans else None)
                rows.append({"run": label, "precision": prec_label, "part": part, "num_gpus": raw["cluster"]["num_gpus"],
                             "tflops": _rounded(tflops, 1), "mfu": _rounded(mfu, 3),
                             "mamf_eff": round(mamf_efficiency(part, peak_key), 3),
                             "ratio_vs_h100": _rounded(ratio, 2), "ratio_vs_h100_fa3": _rounded(ratio_fa3, 2),
                             "bound": "" if part == "H100" else "parts" if same_fabric else "n/a (IB -> NVLink)",
                             "fits": bool(result.get("fits")), "flag": ",".join(flags),
                             "reason": result.get("infeasible_reason") or ""})
    return pd.DataFrame(rows)


#: torchtitan's MoE runs: (label, shipped H100 example), with ``training.framework: torchtitan``
TITAN_MOE_RUNS = [("Mixtral 8x7B", "mixtral-8x7b-ep8-h100.yaml")]
TITAN_PRECISIONS = [("BF16", {"precision": "bf16"}), ("FP8", {"precision": "fp8", "fp8_recipe": "current"}),
                    ("MXFP8", {"precision": "fp8", "fp8_recipe": "mxfp8"})]
WHAT_IF = "what-if of validation/blackwell_sanity.py"


def _variant(part: str, grouped_gemm: dict) -> dict:
    """The part's node with its accelerator's grouped-GEMM entries changed (a node variant, hardware_specs/
    variants.py): entries to add, or a key's ``frameworks`` emptied of torchtitan to leave it out."""
    return {"base": PARTS[part][0], "overrides": {"accelerator": {"efficiency": {"grouped_gemm": grouped_gemm}}}}


def _without_grouped(part: str) -> dict:
    """The part with its torchtitan grouped kernels left out: its experts dense GEMMs (the both-dense bracket)."""
    keys = ACCELERATORS.get(PARTS[part][1]).efficiency.grouped_gemm
    return _variant(part, {key: {"frameworks": [f"none ({WHAT_IF}: experts dense)"]} for key in keys})


def _grouped_state(raw: dict, node: str | dict, training: dict) -> str:
    from simulator.cost.provenance import grouped_gemm_kernels
    from simulator.scenario import load_scenario

    run = copy.deepcopy(raw)
    run["cluster"]["node"] = node
    run["training"] = {**run.get("training", {}), **training}
    (kernel,) = grouped_gemm_kernels(load_scenario(run))
    return kernel["state"]


def _titan_tflops(raw: dict, node: str | dict, training: dict) -> float | None:
    from simulator.simulate import simulate_point

    run = copy.deepcopy(raw)
    run["cluster"]["node"] = node
    run["training"] = {**run.get("training", {}), **training}
    return simulate_point(run, run_if_oom=True).get("model_tflops_per_gpu")


def titan_moe_table() -> pd.DataFrame:
    """One row per (run, precision, part) of :data:`TITAN_MOE_RUNS` under torchtitan: model TFLOP/s, MFU, the
    ratio over H100 as a user gets it (MXFP8 over H100's FP8), the grouped kernel's state on the part and on
    H100, the both-dense bracket (``ratio_both_dense``), the parts' bounds (``parts_min``: the smallest of the
    GEMM, attention, HBM and NVLink ratios; ``parts_max``: the largest of the GEMM, attention and HBM ratios of the
    precision) and the verdict (see the module docstring)."""
    rows = []
    for label, example in TITAN_MOE_RUNS:
        raw = _h100_scenario(("example", example))
        raw["training"] = {**raw.get("training", {}), "framework": "torchtitan"}
        h100: dict[str, float | None] = {}
        h100_dense: dict[str, float | None] = {}
        for prec_label, training in TITAN_PRECISIONS:
            for part, (node, accel_name) in PARTS.items():
                accel = ACCELERATORS.get(accel_name)
                if prec_label == "MXFP8" and "mxfp8" not in accel.block_scaled_formats:
                    continue
                peak_key = "bf16" if training["precision"] == "bf16" else "fp8"
                tflops = _titan_tflops(raw, node, training)
                row = {"run": label, "precision": prec_label, "part": part, "tflops": _rounded(tflops, 1),
                       "mfu": _rounded(tflops / accel.peak_tflops[peak_key] if tflops else None, 3),
                       "grouped": _grouped_state(raw, node, training)}
                if part == "H100":
                    h100[prec_label] = tflops
                    h100_dense[prec_label] = _titan_tflops(raw, _without_grouped("H100"), training)
                    rows.append(row)
                    continue
                base = "FP8" if prec_label == "MXFP8" else prec_label
                h100_training = dict(TITAN_PRECISIONS)[base]
                ratio = tflops / h100[base] if tflops and h100.get(base) else None
                dense = _titan_tflops(raw, _without_grouped(part), training)
                r = part_ratios(part)
                parts = [r["gemm_bf16" if peak_key == "bf16" else "gemm_fp8"], r["attention"], r["hbm"]]
                links = [r["nvls_all_reduce"], r["nvlink_p2p"]]  # the experts' all-to-alls stay on NVLink
                row.update({"ratio_vs_h100": _rounded(ratio, 2), "grouped_h100": _grouped_state(raw, PARTS["H100"][0],
                                                                                               h100_training),
                            "ratio_both_dense": _rounded(dense / h100_dense[base]
                                                         if dense and h100_dense.get(base) else None, 2),
                            "parts_min": round(min(parts + links), 2), "parts_max": round(max(parts), 2)})
                if prec_label == "MXFP8":  # over H100's per-tensor FP8: the part's own MXFP8-over-FP8 gain apart
                    fp8 = next(x for x in rows if x["part"] == part and x["precision"] == "FP8")
                    row["recipe_gain"] = _rounded(tflops / fp8["tflops"] if tflops and fp8["tflops"] else None, 2)
                    row["ratio_like_for_like"] = fp8["ratio_vs_h100"]
                row["verdict"] = _titan_verdict(row)
                rows.append(row)
    return pd.DataFrame(rows)


#: the most MXFP8 can gain over per-tensor current scaling on one part with the same GEMM rate: a step that were
#: all quantisation, 5 against 3.03 bytes per element (simulator/cost/compute.py QUANTISE_BYTES_PER_ELEMENT)
def _max_recipe_gain() -> float:
    from simulator.cost.compute import QUANTISE_BYTES_PER_ELEMENT as q
    return q["current"] / q["mxfp8"]


def _out_of_parts(ratio: float | None, low: float, high: float) -> str:
    """``ratio<parts``: slower than the slowest part ratio allows (below 1 where every part is faster: the
    whole step slower on Blackwell though nothing measured is); ``ratio>parts``: faster than the fastest."""
    if ratio is None:
        return ""
    if ratio < low / RATIO_MARGIN:
        return "ratio<parts"
    if ratio > high * RATIO_MARGIN:
        return "ratio>parts"
    return ""


#: the verdict of a comparison that sets a kernel priced from rows on one part against an assumed one on the other
NOT_JUDGED = "NOT JUDGED (evidence asymmetric: one side measured, one assumed)"


def _titan_verdict(row: dict) -> str:
    """``consistent``, ``FLAG <kind>`` or :data:`NOT_JUDGED`. Where the grouped kernel is priced from rows
    (measured, or carried by a stated rule) on one part and assumed dense on the other the ratio is not like for
    like: :data:`NOT_JUDGED`, with both states and the both-dense bracket (no flag, no exit 1). Else ``ratio<parts``
    / ``ratio>parts`` where the ratio is out of the parts' ratios. An MXFP8 row (over H100's per-tensor FP8: two
    recipes) is judged as the part's FP8 ratio (like for like) times its own MXFP8-over-FP8 gain, which must lie
    between 1 and what the recipes' quantisation bytes allow (``recipe-gain``, judged on the part itself even where
    the cross-part ratio is not); the reason is printed."""
    asymmetric = (row["grouped"] == "assumed") != (row["grouped_h100"] == "assumed")
    not_judged = (f"{NOT_JUDGED}: the grouped kernel is {row['grouped']} on {row['part']} and "
                  f"{row['grouped_h100']} on H100 ({row['ratio_vs_h100']}x; both dense {row['ratio_both_dense']}x, "
                  "a bracket)")
    if row.get("recipe_gain") is not None:  # MXFP8 over H100's FP8: two recipes; judged as FP8 x the part's own gain
        gain, like = row["recipe_gain"], row["ratio_like_for_like"]
        if not 1 / RATIO_MARGIN <= gain <= _max_recipe_gain() * RATIO_MARGIN:
            return (f"FLAG recipe-gain: MXFP8 {gain}x per-tensor FP8 on {row['part']} itself, outside 1-"
                    f"{_max_recipe_gain():.2f}x (the recipes' quantisation bytes; 5% margin)")
        if asymmetric:
            return (f"{not_judged}; MXFP8 {gain}x per-tensor FP8 on {row['part']} itself, within 1-"
                    f"{_max_recipe_gain():.2f}x")
        miss = _out_of_parts(like, row["parts_min"], row["parts_max"])
        if miss:
            return f"FLAG {miss}: per-tensor FP8 like for like {like}x against the parts' {row['parts_min']}-" \
                   f"{row['parts_max']}x (5% margin)"
        return (f"consistent: {row['ratio_vs_h100']}x over H100's per-tensor FP8 = {like}x like for like (FP8 on "
                f"both, within the parts' ratios) x {gain}x MXFP8 over per-tensor FP8 on {row['part']} itself (its "
                f"quantisation moves fewer bytes: 3.03 against 5 per element)")
    if asymmetric:
        return not_judged
    miss = _out_of_parts(row["ratio_vs_h100"], row["parts_min"], row["parts_max"])
    if miss:
        return (f"FLAG {miss}: {row['ratio_vs_h100']}x against the parts' {row['parts_min']}-{row['parts_max']}x "
                f"(5% margin), grouped kernel {row['grouped']} on {row['part']} and {row['grouped_h100']} on H100")
    return "consistent"


def titan_summary(titan: pd.DataFrame) -> str:
    """The written verdict on torchtitan's MoE rows."""
    rows = titan[titan.part != "H100"]
    flagged = rows[rows.verdict.str.startswith("FLAG")]
    not_judged = rows[rows.verdict.str.startswith(NOT_JUDGED)]
    judged = len(rows) - len(not_judged)
    dense = rows.ratio_both_dense.dropna()
    states = ", ".join(sorted({f"{r.part} {r.precision} {r.grouped} / H100 {r.grouped_h100}"
                               for r in rows.itertuples()}))
    verdict = (f"{judged - len(flagged)} of {judged} judged Blackwell ÷ H100 ratios of torchtitan's MoE runs "
               "consistent with the parts' ratios" if judged else
               "no Blackwell ÷ H100 ratio of torchtitan's MoE runs judged")
    head = (f"  summary: {verdict}; {len(not_judged)} of {len(rows)} not judged (evidence asymmetric: "
            f"one side measured, one assumed; {rows.ratio_vs_h100.min():.2f}-{rows.ratio_vs_h100.max():.2f}x as a "
            f"user gets them); grouped kernel states: {states}. torchtitan's grouped kernels were measured on B200 "
            "only (torchao's benchmark on a PyTorch 2.10 nightly: bf16 torch._grouped_mm at 0.37 of B200's dense "
            "curve at each row's per-expert shape, its sm100 build); H100 does not carry that level (no Hopper "
            "measurement of torch._grouped_mm: validation/calibrate_microbench.py grouped_not_carried) and prices "
            "its experts as dense GEMMs (assumed). ")
    return head + (f"With both parts' experts dense (like for like, neither measured) the ratios are "
                   f"{dense.min():.2f}-{dense.max():.2f}x." if not dense.empty else "")


#: parts of the ``--other-parts`` table: (node, accelerator), and the MAMF row of each precision the data has
OTHER_PARTS = {"H200": ("hgx-h200", "h200-sxm-141g"), "MI300X": ("mi300x-8", "mi300x"), "MI355X": ("mi355x-8", "mi355x")}
OTHER_MAMF = {("H200", "fp8"): 19, ("MI300X", "bf16"): 13, ("MI355X", "bf16"): 11}


def _other_run(raw: dict, node: str, training: dict) -> dict:
    from simulator.simulate import simulate_point

    run = copy.deepcopy(raw)
    run["cluster"]["node"] = node
    run["training"] = {**run.get("training", {}), **training}
    if ACCELERATORS.get(NODES.get(node).accelerator).vendor != "nvidia":
        run["training"].pop("attention_kernel", None)  # cuDNN fused attention is NVIDIA's: the part's default
    return simulate_point(run, run_if_oom=True)


def other_parts_table(runs: list | None = None) -> pd.DataFrame:
    """One row per (run, precision, part) of :data:`OTHER_PARTS` and H100 (the module docstring's *Other current
    parts*): model TFLOP/s, MFU, tokens/s per GPU, the ratio over H100 (MXFP8 over H100's FP8) and the part's
    MAMF GEMM ratio over H100's in that precision where a row measures it. Not judged."""
    rows = []
    for label, source in runs or RUNS:
        raw = _h100_scenario(source)
        h100: dict[str, float | None] = {}
        for prec_label, training in PRECISIONS:
            peak_key = "bf16" if training["precision"] == "bf16" else "fp8"
            for part, (node, accel_name) in {"H100": PARTS["H100"], **OTHER_PARTS}.items():
                accel = ACCELERATORS.get(accel_name)
                if prec_label == "MXFP8" and "mxfp8" not in accel.block_scaled_formats:
                    continue
                result = _other_run(raw, node, training)
                tflops, tokens = result.get("model_tflops_per_gpu"), result.get("tokens_per_s")
                if part == "H100":
                    h100[prec_label] = tflops
                base = h100.get("FP8" if prec_label == "MXFP8" else prec_label)
                mamf = OTHER_MAMF.get((part, peak_key))
                gemm = (_cell("gemm_microbench.csv", mamf, "achieved_tflops")
                        / _cell("gemm_microbench.csv", GEMM_MAMF[("H100", peak_key)], "achieved_tflops")) if mamf else None
                num_gpus = raw["cluster"]["num_gpus"]
                rows.append({"run": label, "precision": prec_label, "part": part, "num_gpus": num_gpus,
                             "tflops": _rounded(tflops, 1),
                             "mfu": _rounded(tflops / accel.peak_tflops[peak_key] if tflops else None, 3),
                             "tokens_per_s_per_gpu": _rounded(tokens / num_gpus if tokens else None, 1),
                             "ratio_vs_h100": _rounded(tflops / base if tflops and base else None, 2),
                             "gemm_mamf_ratio": _rounded(gemm, 2) if part != "H100" else None,
                             "fits": bool(result.get("fits"))})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--other-parts", action="store_true",
                        help="also print the runs on H200, MI300X and MI355X against H100 (not judged)")
    parser.add_argument("--nemo", action="store_true",
                        help="instead: every representable NeMo H100 row on B200, GB200, B300 and GB300 as a NeMo user "
                             "asks (training.framework: nemo), the step split and the speed-ups against the bounds "
                             "the parts' microbenchmarks allow (validation/blackwell_nemo.py); exit 1 on a flag")
    parser.add_argument("--nemo-rows", help="with --nemo: comma-separated nemo_perf_summary.csv data rows (default: all)")
    args = parser.parse_args(argv)
    if args.nemo_rows and not args.nemo:
        parser.error("--nemo-rows needs --nemo")
    if args.nemo:
        from validation.blackwell_nemo import report

        try:
            rows = [int(x) for x in args.nemo_rows.split(",")] if args.nemo_rows else None
        except ValueError:
            parser.error(f"--nemo-rows: comma-separated row numbers, got {args.nemo_rows!r}")
        try:
            return report(rows, as_json=args.json)
        except ValueError as exc:
            parser.error(f"--nemo-rows: {exc}")
    other = other_parts_table() if args.other_parts else None
    t = table()
    titan = titan_moe_table()
    ratios = {part: part_ratios(part) for part in ("B200", "GB200")}
    simulated = {part: simulated_ratios(part) for part in ("B200", "GB200")}
    if args.json:
        print(json.dumps({"rows": t.to_dict(orient="records"), "part_ratios_vs_h100": ratios,
                          "simulated_ratios_vs_h100": simulated,
                          "torchtitan_moe_rows": titan.to_dict(orient="records"),
                          **({"other_parts_rows": other.to_dict(orient="records")} if other is not None else {})},
                         indent=1))
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
        print("\ntorchtitan's MoE runs (training.framework: torchtitan; experts as torch._grouped_mm / "
              "torch._scaled_grouped_mm, measured on B200, not carried to H100 (dense there, assumed); MXFP8 over "
              "H100 FP8; ratio_both_dense: both parts' experts dense):\n" + titan.drop(columns=["verdict"]).to_string(index=False))
        for _, row in titan[titan.part != "H100"].iterrows():
            print(f"  verdict {row.run} {row.precision} {row.part}: {row.verdict}")
        print(titan_summary(titan))
        if other is not None:
            print("\nOther current parts (not judged: no attention, NVLS or p2p row of them; attention on MI300X / "
                  "MI355X is their GEMM curve x 0.7, assumed; NeMo's H100 layouts; ratio: over H100, MXFP8 over "
                  "H100 FP8; gemm_mamf_ratio: the part's best measured GEMM over H100's, where a row exists):\n"
                  + other.to_string(index=False))
    flagged = t[t["flag"] != ""]
    out = sys.stderr if args.json else sys.stdout  # --json: stdout stays one JSON document
    for _, row in flagged.iterrows():
        print(f"FLAG {row.flag}: {row.run} {row.precision} on {row.part} (MFU {row.mfu}, ratio {row.ratio_vs_h100})",
              file=out)
    titan_flagged = titan[titan.verdict.fillna("").str.startswith("FLAG")]
    for _, row in titan_flagged.iterrows():
        print(f"{row.verdict}: torchtitan {row.run} {row.precision} on {row.part} (both dense "
              f"{row.ratio_both_dense})", file=out)
    for _, row in titan[titan.verdict.fillna("").str.startswith(NOT_JUDGED)].iterrows():
        print(f"{NOT_JUDGED}: torchtitan {row.run} {row.precision} on {row.part} ({row.ratio_vs_h100}x: grouped kernel "
              f"{row.grouped} there, {row.grouped_h100} on H100; both dense {row.ratio_both_dense}x)", file=out)
    any_flag = len(flagged) + len(titan_flagged)
    print("FLAGGED" if any_flag else "CONSISTENT", file=out)
    return 1 if any_flag else 0


if __name__ == "__main__":
    raise SystemExit(main())
