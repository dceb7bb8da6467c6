"""Does the simulator rank parallel layouts, and predict out-of-memory, as real clusters did?

Two published sweeps (validation/data/README.md):

**Hagemann et al. 2023** ("Efficient Parallelization Layouts for Large-Scale Distributed Model
Training", arXiv:2311.05610; 984 runs of LLaMA 13B/30B/65B, raw data from the authors' repo).
Case mapping (CSV row -> scenario), with what we had to assume:

- model ``Llama 13B/30B/65B`` -> catalog ``llama-13b/30b/65b`` (LLaMA-1 shapes); ``seq_len`` 2048
  (file default, UNVERIFIED) or 8192;
- cluster: ``dgx-a100-80g`` nodes (A100 80GB is UNVERIFIED in the source), ``fat-tree``;
- layout: tp, pp, micro-batch as printed, dp inferred; ``sequence_parallel`` 1 -> true (blank -> false;
  ignored at tp 1); schedule 1F1B, no interleaving; **ZeRO-1** (the Aleph Alpha codebase shards the
  optimizer state; LLaMA 13B at tp 1, pp 1, micro-batch 1 on 64 GPUs ran without checkpointing,
  which only fits if the optimizer state is sharded);
- global batch: ~4M tokens per step (inferred in the CSV from step time x MFU, UNVERIFIED):
  4,194,304 / seq, i.e. 2048 sequences at 2048 and 512 at 8192;
- ``activation_checkpointing_type`` every_layer -> ``recompute: full``, disabled -> ``none``; the
  FlashAttention kernels -> ``training.attention: flash`` (no s x s scores stored, the core recomputed
  in the backward pass), ``torch``/``fused`` -> ``standard``;
- the kernel otherwise is not modelled (the simulator has one kernel library), so layouts are ranked
  within groups of the same **model x GPU count x sequence length x kernel** (a refinement of the
  issue's model x GPU-count groups: comparing a FlashAttention-2 run with a plain-torch run of the
  same layout measures the kernel, which the simulator cannot see);
- measured rows ``Kernel not available`` / ``Other Error`` are dropped; ``OOM Error`` is the OOM class.

**HF Ultra-Scale Playbook** (nanotron benchmark sweep, 3,287 configs on 1-64 nodes of 8xH100):

- model ``1B/3B/8B/80B`` -> ``llama-1b`` / ``llama-3b`` (Llama 3.2 shapes, assumed by the catalog) /
  ``llama3-8b`` / ``llama3-70b`` (the Playbook's "80B" is taken to be the Llama-3-70B shape, 80 layers,
  h 8192: UNVERIFIED); seq 4096;
- cluster: ``p5-h100-efa`` (AWS p5, EFA, the Playbook's hardware); dp, tp, pp, ZeRO stage,
  micro-batch and the 256-sequence global batch as printed;
- nanotron runs FlashAttention (-> ``attention: flash``), tensor parallel in reduce-scatter mode
  (-> ``sequence_parallel`` when tp > 1) and a 1F1B pipeline engine; no activation checkpointing;
- a blank status (crashed or OOM per the heatmap legend) is the OOM class (so crashes that were not
  OOM count against the simulator).

Metrics: Spearman rank correlation of predicted vs measured throughput per group (mean over
groups with at least ``MIN_GROUP`` measured runs); OOM classification accuracy and the confusion
matrix; median absolute relative error of tokens/s per GPU on the Playbook's ok rows.
Targets (the issue): Spearman >= 0.8, >= 90% OOM classified right, median abs error <= 15%.

Run ``python -m validation.layout_ranking [--sample N] [--workers N]`` for the report.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

DATA = Path(__file__).resolve().parent / "data"
HAGEMANN_CSV = DATA / "hagemann2023_parallel_layouts_all_runs.csv"
ULTRASCALE_CSV = DATA / "ultrascale_playbook_config_sweep.csv.gz"  # gzip of shared/published/ (2.2 MB)

TARGET_SPEARMAN = 0.8
TARGET_OOM_ACCURACY = 0.90
TARGET_MEDIAN_ABS_ERROR = 0.15
MIN_GROUP = 5
HAGEMANN_TOKENS_PER_STEP = 4 * 1024 * 1024

HAGEMANN_MODELS = {"Llama 13B": "llama-13b", "Llama 30B": "llama-30b", "Llama 65B": "llama-65b"}
ULTRASCALE_MODELS = {"1B": "llama-1b", "3B": "llama-3b", "8B": "llama3-8b", "80B": "llama3-70b"}
FLASH_KERNELS = ("flash_attention", "flash_attention2", "flash_attention2 + RMS kernel", "flash_attentionv1.0.8")


@dataclass
class Case:
    """One measured run: the scenario mapping that reproduces it and what was measured."""

    source: str                    # "hagemann" | "ultrascale"
    case_id: str
    group: tuple
    raw: dict[str, Any]
    measured_oom: bool
    measured: dict[str, float] = field(default_factory=dict)  # step_time_s, mfu, tokens_per_s_per_gpu


def _seq_from(text: Any) -> int:
    return int(str(text).split()[0])


def hagemann_case(row: dict[str, Any]) -> Case | None:
    """The scenario of one Hagemann CSV row (None for rows that are neither a run nor an OOM)."""
    status = str(row["avg_step_time_s"])
    oom = status == "OOM Error"
    if not oom:
        try:
            step = float(status)
        except ValueError:
            return None  # "Kernel not available", "Other Error"
    seq = _seq_from(row["seq_len_from_filename"])
    tp = int(row["tensor_parallel(model_parallel_size)"])
    pp = int(row["pipeline_parallel"])
    sp_cell = row.get("sequence_parallel")
    sp = bool(sp_cell == sp_cell and sp_cell not in (None, "") and float(sp_cell) == 1.0 and tp > 1)
    kernel = str(row["kernel"])
    recompute = "full" if row["activation_checkpointing_type"] == "every_layer" else "none"
    attention = "flash" if kernel in FLASH_KERNELS else "standard"
    n = int(row["world_size"])
    raw = {
        "name": f"hagemann-{row['trial_id']}",
        "model": HAGEMANN_MODELS[row["model"]],
        "cluster": {"node": "dgx-a100-80g", "fabric": "fat-tree", "num_gpus": n},
        "parallelism": {"tp": tp, "pp": pp, "dp": "auto", "virtual_stages": 1, "schedule": "1f1b",
                        "sequence_parallel": sp, "zero_stage": 1, "recompute": recompute,
                        "micro_batch_size": int(row["micro_batch_size"]),
                        "global_batch_size": HAGEMANN_TOKENS_PER_STEP // seq},
        "training": {"seq_length": seq, "precision": "bf16", "attention": attention, "optimizer": "adamw"},
    }
    measured = {} if oom else {"step_time_s": step, "mfu": float(row["avg_mfu"]),
                               "tokens_per_s_per_gpu": HAGEMANN_TOKENS_PER_STEP / step / n}
    return Case("hagemann", str(row["trial_id"]), (row["model"], n, seq, kernel), raw, oom, measured)


def ultrascale_case(index: int, row: dict[str, Any]) -> Case:
    """The scenario of one Ultra-Scale Playbook CSV row."""
    tp, pp = int(row["tp"]), int(row["pp"])
    gpus = int(row["gpus"])
    raw = {
        "name": f"ultrascale-{index}",
        "model": ULTRASCALE_MODELS[str(row["model"])],
        "cluster": {"node": "p5-h100-efa", "fabric": "fat-tree", "num_gpus": gpus},
        "parallelism": {"tp": tp, "pp": pp, "dp": int(row["dp"]), "virtual_stages": 1, "schedule": "1f1b",
                        "sequence_parallel": tp > 1, "zero_stage": int(row["zero_stage"]),
                        "recompute": "none", "micro_batch_size": int(row["micro_batch_size"]),
                        "global_batch_size": int(row["global_batch_size_seqs"])},
        "training": {"seq_length": int(row["seq_len"]), "precision": "bf16", "attention": "flash",
                     "optimizer": "adamw"},
    }
    ok = str(row["status"]) == "ok"
    measured = {"tokens_per_s_per_gpu": float(row["tokens_per_sec_per_gpu"]), "mfu": float(row["mfu_pct"]) / 100,
                "memory_gb": float(row["gpu_memory_GB"])} if ok else {}
    return Case("ultrascale", str(index), (str(row["model"]), int(row["nodes"])), raw, not ok, measured)


def hagemann_cases() -> list[Case]:
    frame = pd.read_csv(HAGEMANN_CSV)
    cases = [hagemann_case(r) for r in frame.to_dict("records")]
    return [c for c in cases if c is not None]


def ultrascale_cases() -> list[Case]:
    frame = pd.read_csv(ULTRASCALE_CSV)
    return [ultrascale_case(i, r) for i, r in enumerate(frame.to_dict("records"))]


# --------------------------------------------------------------------------- prediction


def predict_memory(case: Case) -> dict[str, Any]:
    """Cheap prediction (memory model only): fits, peak GiB, or the invalid-layout reason."""
    from simulator.errors import ConfigError
    from simulator.memory import fits, peak_rank_memory
    from simulator.scenario import build_scenario

    try:
        scenario = build_scenario(case.raw)
    except ConfigError as exc:
        return {"fits": False, "peak_memory_gib": None, "invalid": str(exc)}
    _, peak, _ = peak_rank_memory(scenario)
    ok, reason = fits(scenario, peak)
    return {"fits": ok, "peak_memory_gib": peak.total_gib, "invalid": None, "reason": reason}


def _simulate_case(raw: dict[str, Any]) -> dict[str, Any]:
    from simulator.simulate import simulate_point

    return simulate_point(raw, run_if_oom=False)


def predict_throughput(cases: list[Case], workers: int | None = None) -> list[dict[str, Any]]:
    """Simulate every case (in parallel); rows with the predicted tokens/s per GPU and MFU."""
    from simulator.sweep import parallel_map

    out: list[dict[str, Any]] = [{} for _ in cases]
    chunk = max(1, len(cases) // ((workers or 2) * 4))
    for idx, ok, result in parallel_map(_simulate_case, [c.raw for c in cases], workers=workers, chunk_size=chunk):
        if not ok:
            out[idx] = {"fits": False, "error": str(result)}
            continue
        n = cases[idx].raw["cluster"]["num_gpus"]
        rate = result.get("tokens_per_s")
        out[idx] = {"fits": bool(result.get("fits")), "step_time_s": result.get("step_time_s"), "mfu": result.get("mfu"),
                    "tokens_per_s_per_gpu": rate / n if rate else None,
                    "infeasible_reason": result.get("infeasible_reason")}
    return out


# --------------------------------------------------------------------------- metrics


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman rank correlation (average ranks for ties); NaN when either side is constant."""
    sx, sy = pd.Series(x, dtype=float).rank(), pd.Series(y, dtype=float).rank()
    if sx.nunique() < 2 or sy.nunique() < 2:
        return math.nan
    return float(sx.corr(sy))


def confusion(measured_oom: list[bool], predicted_oom: list[bool]) -> dict[str, int]:
    """Counts of (measured, predicted) OOM classes."""
    out = {"oom_predicted_oom": 0, "oom_predicted_fits": 0, "ok_predicted_oom": 0, "ok_predicted_fits": 0}
    for m, p in zip(measured_oom, predicted_oom, strict=True):
        out[f"{'oom' if m else 'ok'}_predicted_{'oom' if p else 'fits'}"] += 1
    return out


def accuracy(matrix: dict[str, int]) -> float:
    total = sum(matrix.values())
    return (matrix["oom_predicted_oom"] + matrix["ok_predicted_fits"]) / total if total else math.nan


def oom_report(cases: list[Case]) -> dict[str, Any]:
    """OOM classification of every case by the memory model."""
    preds = [predict_memory(c) for c in cases]
    matrix = confusion([c.measured_oom for c in cases], [not p["fits"] for p in preds])
    wrong = [(c, p) for c, p in zip(cases, preds, strict=True) if c.measured_oom == p["fits"]]
    return {"n": len(cases), "accuracy": accuracy(matrix), "confusion": matrix, "wrong": wrong,
            "invalid": sum(1 for p in preds if p["invalid"])}


def ranking_report(cases: list[Case], workers: int | None = None, metric: str = "tokens_per_s_per_gpu"
                   ) -> dict[str, Any]:
    """Spearman per group over the measured runs (OOM rows excluded), and throughput errors."""
    runs = [c for c in cases if not c.measured_oom]
    preds = predict_throughput(runs, workers)
    table = [{"source": c.source, "case_id": c.case_id, "group": str(c.group), "model": c.raw["model"],
              "num_gpus": c.raw["cluster"]["num_gpus"], **{k: v for k, v in c.raw["parallelism"].items()},
              "seq": c.raw["training"]["seq_length"],
              **{f"measured_{k}": v for k, v in c.measured.items()},
              **{f"predicted_{k}": v for k, v in p.items()}} for c, p in zip(runs, preds, strict=True)]
    groups: dict[tuple, list[tuple[float, float]]] = {}
    errors = []
    unpredicted = 0
    for case, pred in zip(runs, preds, strict=True):
        value = pred.get(metric)
        if value is None:
            unpredicted += 1  # measured ran, predicted OOM/invalid: ranked last
            value = 0.0
        else:
            errors.append(abs(value - case.measured[metric]) / case.measured[metric])
        groups.setdefault(case.group, []).append((value, case.measured[metric]))
    rho = {g: spearman([p for p, _ in v], [m for _, m in v]) for g, v in groups.items() if len(v) >= MIN_GROUP}
    finite = [r for r in rho.values() if not math.isnan(r)]
    return {"runs": len(runs), "groups": rho, "mean_spearman": sum(finite) / len(finite) if finite else math.nan,
            "min_spearman": min(finite) if finite else math.nan, "unpredicted": unpredicted,
            "median_abs_error": float(pd.Series(errors).median()) if errors else math.nan,
            "errors": errors, "table": pd.DataFrame(table)}


def sample(cases: list[Case], n: int | None, seed: int = 0) -> list[Case]:
    """A deterministic sample of ``n`` cases stratified by group (all when n is None)."""
    if n is None or n >= len(cases):
        return cases
    frame = pd.DataFrame({"i": range(len(cases)), "g": [str(c.group) for c in cases]})
    frac = n / len(cases)
    picked = frame.groupby("g", group_keys=False).apply(
        lambda d: d.sample(max(1, round(len(d) * frac)), random_state=seed), include_groups=False)
    return [cases[i] for i in sorted(picked["i"])]


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, default=None, help="simulate a stratified sample of N runs per set")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--set", choices=("hagemann", "ultrascale", "both"), default="both")
    parser.add_argument("--csv", metavar="PREFIX", help="write PREFIX_<set>.csv: predicted vs measured per run")
    args = parser.parse_args(argv)
    sets = {"hagemann": hagemann_cases, "ultrascale": ultrascale_cases}
    for name, loader in sets.items():
        if args.set not in (name, "both"):
            continue
        cases = loader()
        oom = oom_report(cases)
        print(f"== {name}: {len(cases)} cases")
        print(f"OOM classification: {100 * oom['accuracy']:.1f}% right (target {100 * TARGET_OOM_ACCURACY:.0f}%), "
              f"confusion {oom['confusion']}, {oom['invalid']} invalid layouts")
        metric = "tokens_per_s_per_gpu"
        rank = ranking_report(sample([c for c in cases if not c.measured_oom], args.sample), args.workers, metric)
        print(f"ranking over {rank['runs']} runs: mean Spearman {rank['mean_spearman']:.3f} "
              f"(min {rank['min_spearman']:.3f}, target {TARGET_SPEARMAN}), "
              f"median |error| of tokens/s/GPU {100 * rank['median_abs_error']:.1f}%, "
              f"{rank['unpredicted']} measured runs predicted infeasible")
        for group, rho in sorted(rank["groups"].items(), key=lambda kv: str(kv[0])):
            print(f"   {group}: {rho:.3f}")
        if args.csv:
            rank["table"].to_csv(f"{args.csv}_{name}.csv", index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
