"""Every representable NeMo H100 row re-simulated on Blackwell as a NeMo user would ask for it, with the step split
and the speed-up judged against what the parts' microbenchmarks allow for that step's mix (issue 23's unseen check).

Each row of ``nemo_perf_summary.csv`` that validation/modern/nemo.py maps to a scenario (its model, layout,
batch, precision and Megatron-Core settings; set-aside rows too, marked) is simulated with
``training.framework: nemo`` on DGX H100 (its measured node), then with nothing else changed on DGX B200,
GB200 NVL72, DGX B300 and GB300 NVL72 (the catalog's Blackwell nodes; ``clustersim specs list``). An FP8 row
runs the row's own recipe (per-tensor scaling: the H100 rows' FP8-CS / FP8 delayed) and, on Blackwell, also
MXFP8 (``training.fp8_recipe: mxfp8``: Megatron-Bridge's Blackwell FP8 recipes, the MXFP8 rows of its summary),
whose speed-up is taken over H100's per-tensor FP8 (what a buyer compares).

**The step split** (:func:`step_split`): the simulator's critical-path breakdown (``time_breakdown_s``: compute,
recompute, exposed communication, pipeline bubble, optimizer, host stall) with its compute and recompute divided
among GEMM, fused attention and memory-bound kernels in proportion to one rank's kernel seconds of those classes
over the model's layer graph (priced by the scenario's own ComputeModel, the framework factors applied); the host
stall is the NeMo profile's fixed time per MoE layer (``moe_layer_fixed_us``) where that is set. *Exposed communication* is what the
breakdown leaves on the critical path (tp/cp/ep/pp/dp), not the collectives' whole time.

**The bounds** (:func:`class_ratio_bands`, :func:`speedup_bounds`): each class of the reference part's split
speeds up on the new part by a ratio the microbenchmarks bracket, ``[lo, hi]``:

- GEMM: the part's best measured GEMM (MAMF, gemm_microbench.csv) over the reference's in the run's precision
  (MXFP8 on the fp8 rows: dense MXFP8 runs the fp8 curve by rule) and the datasheet dense-peak ratio, the lower
  of the two to the higher (a GEMM of the step is neither slower than the best shape's ratio allows by much, nor
  faster than a peak ratio: H100's fp8 MAMF is 0.71 of its peak, B200's 0.76, so the MAMF ratio exceeds the peak
  ratio in fp8). A part without a MAMF row (GB300) takes the peak ratio alone (*assumed*);
- fused attention: over H100, from the in-step FlashAttention-4 on B200 (attention_kernels.csv row 422, 834 TF)
  over FlashAttention-3 on H200 (row 421, 447 TF; H100's die) to the same FA4 over FlashAttention-2 on H100
  at the same sequence (the FA2 paper's fwd+bwd causal head-128 8K kernel, row 402, 308 TF; a kernel timed
  alone, so the ratio is a little low): NeMo's cuDNN attention is priced as the FA2 fit on H100 (NeMo 24.03's
  long-context rows match it, validation/modern/nemo.py) and as FA4 on Blackwell (simulator/cost/attention_kernel.py,
  *assumed*); cuDNN's own level on either part is measured nowhere. Other Blackwell parts scale B200's FA4 by
  their bf16 peak (the catalog's carry rule: *derived*). Between Blackwell parts: 1 to the peak ratio;
- memory-bound kernels and the optimizer step: the HBM bandwidth ratio (datasheets);
- the NeMo profile's fixed time per MoE layer: 1 (a fixed time the H100 fit carries unchanged: *assumed*) to the
  GEMM ratio;
- exposed communication: the smallest to the largest link ratio the run's groups ride on: the 8-GPU NVLS
  all-reduce (collectives_bandwidth.csv row 100 B200 over row 90 H200, NVLink 4 as H100's), the NVLink p2p copy
  (row 117 GB200 over 116 H100), and for a run over several nodes the NIC line rate per GPU (datasheets); where
  the part's NVLink domain holds more GPUs than the reference's and the run spans more than the reference's
  domain (GB200/GB300 NVL72 against 8-GPU nodes), traffic that crossed InfiniBand may ride NVLink: up to the
  NVLink-over-NIC bandwidth ratio per GPU (900 / 50 GB/s = 18);
- pipeline bubble: the compute classes' range (a bubble is idle stage compute time, with p2p in it).

The speed-up bounds are the step rebuilt class by class from the reference's split: ``T / sum(t_i / hi_i)`` and
``T / sum(t_i / lo_i)`` (each class at the edge of its band), widened by :data:`MARGIN` (5%) either way; on the
slow side the communication term is the reference's whole collective time C (hidden and exposed, from the timeline
of an unfolded run), all of it exposed at the slowest link ratio, since compute that shrinks on the faster part hides
less of it (the timeline's collectives: a lower estimate, as a chain task's own collectives show as compute); on the
fast side 0 where some link of the run is faster (the exposed part may hide entirely), else e at the link ratio. A predicted
B200 / H100, GB200 / B200 (and B300 / H100, GB300 / B300, B300 / B200) ratio outside them is a FLAG and
``python -m validation.blackwell_sanity --nemo`` exits 1.

What a NeMo user gets on Blackwell (``--json``'s ``framework_state`` is ``derived``: the H100 FP8 entry carried
to a faster part of the same vendor; simulator/cost/framework.py rule 4) is printed beside each row.

``python -m validation.blackwell_sanity --nemo`` prints the table and exits 1 on a flag (``--nemo-rows 66,67`` for
some rows, ``--json`` for the records); :func:`report` is that entry.
"""

from __future__ import annotations

import copy
import json
import sys
from collections import defaultdict
from pathlib import Path

import pandas as pd

from hardware_specs.catalog import ACCELERATORS, NODES

MICROBENCH = Path(__file__).parent / "data" / "microbench"
#: part -> catalog node (the node's accelerator is the part)
NODES_BY_PART = {"H100": "dgx-h100", "B200": "dgx-b200", "GB200": "gb200-nvl72", "B300": "dgx-b300",
                 "GB300": "gb300-nvl72"}
#: the comparisons judged: (part, reference part)
PAIRS = (("B200", "H100"), ("GB200", "H100"), ("GB200", "B200"), ("B300", "H100"), ("B300", "B200"),
         ("GB300", "B300"))
#: MAMF rows (gemm_microbench.csv file line numbers, header = line 1) by (part, precision)
MAMF_ROWS = {("H100", "bf16"): 6, ("B200", "bf16"): 8, ("GB200", "bf16"): 10, ("B300", "bf16"): 7,
             ("H100", "fp8"): 21, ("B200", "fp8"): 17, ("GB200", "fp8"): 20, ("B300", "fp8"): 18}
#: attention_kernels.csv lines: FA4 in the B200 step, FA3 in the H200 step, FA2 paper fwd+bwd H100 causal h128 16K
FA4_B200_STEP, FA3_H200_STEP, FA2_H100_KERNEL = 422, 421, 402
#: collectives_bandwidth.csv lines: 8-GPU NVLS all-reduce at 8 GiB (H200 = NVLink 4, B200 = NVLink 5), NVLink copy
NVLS_NVLINK4, NVLS_NVLINK5, P2P_NVLINK4, P2P_NVLINK5 = 90, 100, 116, 117
#: NVLink 5 per GPU (GB/s, one direction; datasheet) over a 400 Gb/s NIC per GPU (50 GB/s)
NVLINK5_OVER_NIC = 900 / 50
MARGIN = 1.05
COMM_KEYS = ("tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm")
SPLIT_CLASSES = ("gemm", "attention", "memory_bound", "moe_fixed", "comm_exposed", "bubble", "optimizer", "other")


def _cell(csv: str, line: int, column: str) -> float:
    return float(pd.read_csv(MICROBENCH / csv).iloc[line - 2][column])


def _accel(part: str):
    return ACCELERATORS.get(NODES.get(NODES_BY_PART[part]).accelerator)


def _nic_gb_per_gpu(part: str) -> float:
    node = NODES.get(NODES_BY_PART[part])
    return node.nics_per_node * node.nic_bandwidth_gbit_per_s / 8 / node.gpus_per_node


def _nvlink_generation(part: str) -> int:
    return 4 if part == "H100" else 5


def gemm_band(part: str, ref: str, precision: str) -> tuple[float, float, str]:
    """GEMM ratio band ``part`` over ``ref`` in ``precision`` (bf16 | fp8): MAMF ratio and peak ratio."""
    peak = _accel(part).peak_tflops[precision] / _accel(ref).peak_tflops[precision]
    rows = MAMF_ROWS.get((part, precision)), MAMF_ROWS.get((ref, precision))
    if None in rows:
        return peak, peak, f"peak {peak:.2f} (no MAMF row of {part if rows[0] is None else ref}: assumed)"
    mamf = _cell("gemm_microbench.csv", rows[0], "achieved_tflops") / _cell("gemm_microbench.csv", rows[1],
                                                                            "achieved_tflops")
    return min(mamf, peak), max(mamf, peak), f"MAMF {mamf:.2f} (rows {rows[0]}/{rows[1]}), peak {peak:.2f}"


def attention_band(part: str, ref: str) -> tuple[float, float, str]:
    """Fused attention ratio band (module docstring)."""
    peak = _accel(part).peak_tflops["bf16"] / _accel(ref).peak_tflops["bf16"]
    if ref != "H100":
        return min(1.0, peak), max(1.0, peak), f"1 to peak {peak:.2f} (same FA4 kernel)"
    fa4 = _cell("attention_kernels.csv", FA4_B200_STEP, "achieved_tflops") * \
        _accel(part).peak_tflops["bf16"] / ACCELERATORS.get("b200").peak_tflops["bf16"]
    lo = fa4 / _cell("attention_kernels.csv", FA3_H200_STEP, "achieved_tflops")
    hi = fa4 / _cell("attention_kernels.csv", FA2_H100_KERNEL, "achieved_tflops")
    return lo, hi, f"FA4/FA3 {lo:.2f} to FA4/FA2 {hi:.2f} (rows {FA4_B200_STEP}/{FA3_H200_STEP}/{FA2_H100_KERNEL})"


def hbm_ratio(part: str, ref: str) -> float:
    return _accel(part).hbm_bandwidth_gb_per_s / _accel(ref).hbm_bandwidth_gb_per_s


def comm_band(part: str, ref: str, num_gpus: int) -> tuple[float, float, str]:
    """Exposed-communication ratio band: NVLink (NVLS all-reduce, p2p copy), NIC per GPU where the run spans
    nodes, and NVLink over the NIC where the part's NVLink domain takes in traffic the reference sent over IB."""
    gens = _nvlink_generation(part), _nvlink_generation(ref)
    if gens == (5, 4):
        nvls = _cell("collectives_bandwidth.csv", NVLS_NVLINK5, "busbw_gb_per_s") / \
            _cell("collectives_bandwidth.csv", NVLS_NVLINK4, "busbw_gb_per_s")
        p2p = _cell("collectives_bandwidth.csv", P2P_NVLINK5, "busbw_gb_per_s") / \
            _cell("collectives_bandwidth.csv", P2P_NVLINK4, "busbw_gb_per_s")
        links, why = [nvls, p2p], [f"NVLS {nvls:.2f}", f"p2p {p2p:.2f}"]
    else:
        links, why = [1.0], ["NVLink 1.00"]
    ref_domain = NODES.get(NODES_BY_PART[ref]).domain_gpus
    if num_gpus > NODES.get(NODES_BY_PART[part]).gpus_per_node or num_gpus > ref_domain:
        nic = _nic_gb_per_gpu(part) / _nic_gb_per_gpu(ref)
        links.append(nic)
        why.append(f"NIC {nic:.2f}")
        if NODES.get(NODES_BY_PART[part]).domain_gpus > ref_domain and num_gpus > ref_domain:
            links.append(NVLINK5_OVER_NIC)
            why.append(f"NVLink over IB {NVLINK5_OVER_NIC:.0f}")
    return min(links), max(links), ", ".join(why)


def class_ratio_bands(part: str, ref: str, precision: str, num_gpus: int) -> dict[str, tuple[float, float, str]]:
    """``[lo, hi]`` speed-up of each split class of ``ref``'s step on ``part`` (module docstring)."""
    gemm = gemm_band(part, ref, precision)
    attention = attention_band(part, ref)
    hbm = hbm_ratio(part, ref)
    memory = (hbm, hbm, f"HBM {hbm:.2f}")
    compute_lo, compute_hi = min(gemm[0], attention[0], hbm), max(gemm[1], attention[1], hbm)
    return {"gemm": gemm, "attention": attention, "memory_bound": memory, "optimizer": memory,
            "moe_fixed": (1.0, max(1.0, gemm[1]), "1 (fixed, assumed) to GEMM"),
            "comm_exposed": comm_band(part, ref, num_gpus),
            "bubble": (compute_lo, compute_hi, "compute classes' range"),
            "other": (1.0, compute_hi, "1 to compute")}


def speedup_bounds(split: dict[str, float], bands: dict[str, tuple[float, float, str]],
                   comm_busy: float | None = None) -> tuple[float, float]:
    """The reference step rebuilt with every class at the low and at the high edge of its band, as speed-ups,
    widened by :data:`MARGIN`. The communication term: on the slow side the reference's collective time C
    (``comm_busy``: the timeline's communication tasks, hidden and exposed, at least the exposed time e) all exposed
    at the slowest link ratio (C / lo: the compute that hid it shrinks on the faster part); on the fast side 0
    where some link is faster (a faster collective may hide entirely), e / hi where none is. The timeline shows
    a collective run inside a chain task (TP overlap, the context-parallel ring) as compute, so C is a lower
    estimate of the collective time and the slow side errs tight."""
    total = sum(split.values())
    exposed = split["comm_exposed"]
    busy = max(exposed, comm_busy or 0.0)
    slow = sum(t / bands[c][0] for c, t in split.items() if t > 0 and c != "comm_exposed")
    slow += busy / bands["comm_exposed"][0]
    fast = sum(t / bands[c][1] for c, t in split.items() if t > 0 and c != "comm_exposed")
    if bands["comm_exposed"][1] <= 1.0:  # no faster link: what was exposed stays exposed (at least)
        fast += exposed / bands["comm_exposed"][1]
    return total / slow / MARGIN, total / fast * MARGIN


def kernel_shares(scenario) -> dict[str, float]:
    """One rank's kernel seconds by class (GEMM, fused attention, memory-bound) over the model's layer graph
    (forward, backward, recompute), as shares of their sum."""
    from simulator.cost.compute import ComputeModel
    from workloads.graph import is_fused_attention

    tr, par = scenario.training, scenario.parallelism
    compute = ComputeModel(scenario.accelerator, tr.precision, tr.fp8_gemms, tr.fp8_recipe, tf32=tr.tf32)
    seconds: dict[str, float] = defaultdict(float)
    for layer in scenario.layer_graph().layers:
        for ops in (layer.forward, layer.backward, layer.recompute_ops(par.recompute_mode)):
            for op in ops:
                if op.kind == "collective":
                    continue
                cls = "attention" if is_fused_attention(op) else "gemm" if op.kind == "gemm" else "memory_bound"
                seconds[cls] += compute.time_s(op)
    total = sum(seconds.values()) or 1.0
    return {c: t / total for c, t in seconds.items()}


def step_split(scenario, result: dict) -> dict[str, float]:
    """The step's seconds by class (module docstring). The NeMo profile's fixed time per MoE layer stretches the
    layer's passes (simulator/strategies/framework_terms.py ``layer_floor_stretch``) and shows as ``host_stall``:
    with ``moe_layer_fixed_us`` set (and no host dispatch floor) the host stall is that time."""
    b = result["time_breakdown_s"]
    compute = b.get("compute", 0.0) + b.get("recompute", 0.0)
    split = {c: compute * s for c, s in kernel_shares(scenario).items()}
    split["comm_exposed"] = sum(b.get(k, 0.0) for k in COMM_KEYS)
    split["bubble"] = b.get("pipeline_bubble", 0.0)
    split["optimizer"] = b.get("optimizer", 0.0)
    eff = scenario.accelerator.efficiency
    fixed = bool(eff.moe_layer_fixed_us) and not eff.host_dispatch_us_per_kernel
    split["moe_fixed" if fixed else "other"] = b.get("host_stall", 0.0)
    split["other"] = split.get("other", 0.0) + b.get("input_wait", 0.0)
    return {c: split.get(c, 0.0) for c in SPLIT_CLASSES}


def comm_busy_s(result) -> float | None:
    """The most seconds any simulated rank class spends in its collectives (every communication stream's tasks,
    hidden or not, summed), from the result's timeline; None without one."""
    busy: dict[str, float] = defaultdict(float)
    for e in result.timeline:
        if e.category.endswith("_comm"):
            busy[e.rank_class] += e.end_s - e.start_s
    return max(busy.values()) if busy else None


def run(raw: dict, part: str, training: dict | None = None) -> dict:
    """One scenario on ``part``'s node as a NeMo user runs it: the row's result, its split and state."""
    from simulator.scenario import load_scenario
    from simulator.simulate import simulate

    raw = copy.deepcopy(raw)
    raw["cluster"]["node"] = NODES_BY_PART[part]
    raw["training"] = {**raw["training"], "framework": "nemo", **(training or {})}
    sc = load_scenario(raw)
    simulated = simulate(sc, run_if_oom=True, fold=False)  # unfolded: the timeline is kept (the same step time)
    result = simulated.to_dict()
    return {"comm_busy_s": comm_busy_s(simulated),
            "tflops": result["model_tflops_per_gpu"], "tokens_per_s_per_gpu": result["tokens_per_s"] / sc.num_gpus,
            "step_s": result["step_time_s"], "fits": result["fits"], "peak_memory_gib": result["peak_memory_gib"],
            "hbm_gib": result["hbm_gib"], "framework_state": result.get("framework_state"),
            "split": step_split(sc, result)}


def _precisions(precision: str, part: str) -> list[tuple[str, dict]]:
    if precision == "bf16":
        return [("BF16", {})]
    out = [("FP8", {})]
    if part != "H100" and "mxfp8" in _accel(part).block_scaled_formats:
        out.append(("MXFP8", {"fp8_recipe": "mxfp8"}))
    return out


def nemo_cases(rows: list[int] | None = None):
    from validation.modern.nemo import cases

    built = cases()[0]
    unknown = sorted(set(rows or ()) - {c.row for c in built})
    if unknown:
        raise ValueError(f"not a representable nemo_perf_summary.csv row: {', '.join(map(str, unknown))}")
    return [c for c in built if rows is None or c.row in rows]


def table(rows: list[int] | None = None) -> list[dict]:
    """One record per (row, precision label): the runs on every part, the ratios of :data:`PAIRS` and their
    bounds and flags. MXFP8 ratios over an H100 reference are taken over H100's per-tensor FP8."""
    out = []
    for case in nemo_cases(rows):
        num_gpus = case.scenario["cluster"]["num_gpus"]
        base = {p: run(case.scenario, p) for p in NODES_BY_PART if p == "H100"}
        for label, training in _precisions(case.precision, "B200"):
            runs = dict(base)
            for part in NODES_BY_PART:
                if part != "H100":
                    runs[part] = run(case.scenario, part, training)
            record = {"row": case.row, "label": case.label, "precision": label, "num_gpus": num_gpus,
                      "heldout": case.heldout, "set_aside": bool(case.set_aside),
                      "h100_measured_tokens": case.measured_rate_per_gpu, "runs": runs, "pairs": {}}
            for part, ref in PAIRS:
                a, b = runs[part], runs[ref]
                if not (a["tflops"] and b["tflops"]):
                    continue
                ratio = a["tokens_per_s_per_gpu"] / b["tokens_per_s_per_gpu"]
                bands = class_ratio_bands(part, ref, "bf16" if label == "BF16" else "fp8", num_gpus)
                lo, hi = speedup_bounds(b["split"], bands, b["comm_busy_s"])
                flag = "ratio<parts" if ratio < lo else "ratio>parts" if ratio > hi else ""
                record["pairs"][f"{part}/{ref}"] = {"ratio": ratio, "lo": lo, "hi": hi, "flag": flag}
            out.append(record)
    return out


def _pct(split: dict[str, float]) -> str:
    total = sum(split.values()) or 1.0
    short = {"gemm": "G", "attention": "A", "memory_bound": "M", "moe_fixed": "X", "comm_exposed": "C",
             "bubble": "B", "optimizer": "O", "other": "H"}
    return " ".join(f"{short[c]}{100 * t / total:.0f}" for c, t in split.items() if t / total >= 0.005)


def print_table(records: list[dict], file=None) -> None:
    file = file or sys.stdout
    print("NeMo H100 rows on Blackwell as a NeMo user asks (training.framework: nemo). tok: tokens/s per GPU; "
          "split in % of the step: G GEMM, A fused attention, M memory-bound, X NeMo's fixed MoE-layer time, "
          "C exposed communication, B pipeline bubble, O optimizer, H host/input; ratio [bounds] by the parts' "
          "microbenchmarks; '!' = OOM", file=file)
    for r in records:
        runs = r["runs"]
        meas = f"{r['h100_measured_tokens']:.0f}" if r["h100_measured_tokens"] else "-"
        tags = ("held-out" if r["heldout"] else "fit") + (", set aside" if r["set_aside"] else "")
        print(f"\nrow {r['row']} {r['label']} [{r['precision']}; {tags}]  H100 measured {meas} tok", file=file)
        for part, x in runs.items():
            oom = "" if x["fits"] else f" ! {x['peak_memory_gib']:.0f}/{x['hbm_gib']:.0f} GiB"
            print(f"  {part:<6} {x['tokens_per_s_per_gpu']:9.0f} tok {x['tflops']:7.1f} TF  "
                  f"({x['framework_state']})  {_pct(x['split'])}{oom}", file=file)
        print("  " + "  ".join(f"{k} {v['ratio']:.2f} [{v['lo']:.2f}-{v['hi']:.2f}]{' FLAG ' + v['flag'] if v['flag'] else ''}"
                               for k, v in r["pairs"].items()), file=file)


def flagged(records: list[dict]) -> list[str]:
    out = []
    for r in records:
        for k, v in r["pairs"].items():
            if v["flag"]:
                out.append(f"FLAG {v['flag']}: row {r['row']} {r['precision']} {k} {v['ratio']:.2f} outside "
                           f"[{v['lo']:.2f}, {v['hi']:.2f}]")
        for part, x in r["runs"].items():
            if not x["fits"] and part != "H100" and x["hbm_gib"] >= 170:
                out.append(f"FLAG oom: row {r['row']} {r['precision']} on {part}: {x['peak_memory_gib']:.1f} of "
                           f"{x['hbm_gib']:.0f} GiB")
    return out


def report(rows: list[int] | None = None, as_json: bool = False, file=None) -> int:
    """Print the table (or its records as JSON) and the flags; 1 when any is raised, else 0."""
    file = file or sys.stdout
    records = table(rows)
    if as_json:
        print(json.dumps(records, indent=1, default=float), file=file)
    else:
        print_table(records, file=file)
    flags = flagged(records)
    out = sys.stderr if as_json else file
    for line in flags:
        print(line, file=out)
    print("FLAGGED" if flags else "CONSISTENT", file=out)
    return 1 if flags else 0
