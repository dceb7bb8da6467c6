"""Published throughput measurements as simulator cases, with their tolerances.

Each case set maps rows of a CSV in ``validation/data/`` (copied from ``shared/published``)
to a scenario, says which quantity is compared and how, and states its tolerance. Rows used
to fit constants are listed in :data:`FITTED_ON` and are never reported as checks here:
the A100 GEMM efficiency level is fitted on Korthikanti 2022 *Table 4* (per-layer times,
``validation/calibrate_a100.py``), and these sets are Table 1 of Narayanan 2021 and
Tables 3/5 of Korthikanti 2022 — different runs.

Comparisons are like with like (DESIGN.md): Narayanan's TFLOP/s count the recompute
forward (their Eq. 3, 96·B·s·l·h²·(1 + s/6h + V/16lh)), so the simulated value is that
same formula over the *simulated* step time; Korthikanti's iteration times are compared
directly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from simulator.scenario import load_scenario
from simulator.simulate import simulate
from validation.closed_forms import narayanan_flops_with_recompute

DATA = Path(__file__).parent / "data"
FITTED_ON = {"korthikanti2022_table4_layer_times.csv": ["Baseline no recompute", "Sequence Parallelism"]}

NARAYANAN_MODELS = {1.7: "gpt-1.7b", 3.6: "gpt-3.6b", 7.5: "gpt-7.5b", 18.4: "gpt-18.4b", 39.1: "gpt-39.1b",
                    76.1: "gpt-76.1b", 145.6: "gpt-145.6b", 310.1: "gpt-310.1b", 529.6: "gpt-529.6b",
                    1008.0: "gpt-1t"}
KORTHIKANTI_MODELS = {"22B": "gpt-22b", "175B (GPT-3)": "gpt3-175b", "530B (MT-NLG)": "gpt-529.6b", "1T": "gpt-1t"}


@dataclass(frozen=True)
class Case:
    case_set: str
    name: str
    scenario: dict[str, Any]
    quantity: str
    published: float
    unit: str
    measure: str                     # "step_time_s" or "tflops_per_gpu" (flops_per_step over the step)
    flops_per_step: float = 0.0

    def simulated_value(self, result) -> float:
        if self.measure == "tflops_per_gpu":
            return self.flops_per_step / (result.step_time_s * result.num_gpus) / 1e12
        return result.step_time_s


@dataclass(frozen=True)
class CaseResult:
    case_set: str
    name: str
    quantity: str
    unit: str
    published: float
    simulated: float
    relative_error: float
    tolerance: float

    @property
    def passed(self) -> bool:
        return abs(self.relative_error) <= self.tolerance


@dataclass(frozen=True)
class CaseSet:
    name: str
    source: str
    tolerance_per_case: float
    tolerance_mean_abs: float
    cases: Callable[[], list[Case]]


def _a100_cluster(num_gpus: int) -> dict[str, Any]:
    return {"node": "dgx-a100-80g", "fabric": "fat-tree", "num_gpus": num_gpus}


def narayanan_table1_cases() -> list[Case]:
    df = pd.read_csv(DATA / "narayanan2021_megatron_table1.csv")
    cases = []
    for _, row in df.iterrows():
        model = NARAYANAN_MODELS[float(row["model_params_billion"])]
        v = int(row["virtual_chunks_per_stage_derived"])
        scenario = {
            "name": f"narayanan-{model}",
            "model": model,
            "cluster": _a100_cluster(int(row["num_gpus"])),
            "parallelism": {
                "tp": int(row["tensor_parallel"]), "pp": int(row["pipeline_parallel"]), "dp": "auto",
                "virtual_stages": v, "schedule": "interleaved" if v > 1 else "1f1b",
                "recompute": "full", "micro_batch_size": int(row["micro_batch_size_script"]),
                "global_batch_size": int(row["global_batch_size_seqs"]),
                # torch DDP overlaps bucketed all-reduce with backward; Megatron's 2021 "local" DDP
                # all-reduces its contiguous buffer after the backward pass.
                "overlap_grad_reduce": row["ddp_impl_script"] == "torch",
                # Megatron-LM of April 2021 had no asynchronous TP gradient all-reduce (added late 2021).
                "overlap_tp_grad_comm": False,
            },
            "training": {"seq_length": int(row["seq_len"]), "precision": "fp16",
                         # Megatron-LM of 2021 materialised the softmax (no fused attention)
                         "attention": "standard"},
        }
        h, layers = int(row["hidden_size"]), int(row["num_layers"])
        batch, seq, vocab, gpus = int(row["global_batch_size_seqs"]), int(row["seq_len"]), int(row["vocab_size"]), int(row["num_gpus"])
        flops = narayanan_flops_with_recompute(batch, layers, seq, h, vocab)
        cases.append(Case("narayanan2021_table1", f"{model} on {gpus} GPUs", scenario,
                          "TFLOP/s per GPU (incl. recompute)", float(row["achieved_tflops_per_gpu"]), "TFLOP/s",
                          "tflops_per_gpu", flops))
    return cases


def korthikanti_table3_5_cases() -> list[Case]:
    df = pd.read_csv(DATA / "korthikanti2022_table3_table5.csv")
    cases = []
    for _, row in df.iterrows():
        model = KORTHIKANTI_MODELS[row["model"]]
        v = int(row["interleave_stages_m"]) if pd.notna(row["interleave_stages_m"]) else 1
        base = {
            "model": model,
            "cluster": _a100_cluster(int(row["num_gpus"])),
            "parallelism": {
                "tp": int(row["tensor_parallel"]), "pp": int(row["pipeline_parallel"]), "dp": 1,
                "virtual_stages": v, "schedule": "interleaved" if v > 1 else "1f1b",
                "micro_batch_size": int(row["micro_batch_size"]),
                "global_batch_size": int(row["global_batch_size"]),
            },
            "training": {"seq_length": int(row["seq_len"]), "precision": "bf16",
                         # Megatron-LM of 2022 materialised the softmax (no fused attention)
                         "attention": "standard"},
        }
        for label, column, extra in (
            ("selective+SP", "iter_time_s_present_work", {"recompute": "selective", "sequence_parallel": True}),
            ("full recompute", "iter_time_s_full_recompute", {"recompute": "full", "sequence_parallel": False}),
        ):
            scenario = {**base, "name": f"korthikanti-{model}-{label}",
                        "parallelism": {**base["parallelism"], **extra}}
            cases.append(Case("korthikanti2022_table3_5", f"{model} {label}", scenario, "iteration time",
                              float(row[column]), "s", "step_time_s"))
    return cases


CASE_SETS: dict[str, CaseSet] = {
    "narayanan2021_table1": CaseSet(
        "narayanan2021_table1", "Narayanan et al. 2021 (SC21) Table 1, A100 80GB DGX nodes",
        tolerance_per_case=0.10, tolerance_mean_abs=0.06, cases=narayanan_table1_cases),
    "korthikanti2022_table3_5": CaseSet(
        "korthikanti2022_table3_5", "Korthikanti et al. 2022 Tables 3 and 5, A100 80GB DGX nodes",
        tolerance_per_case=0.10, tolerance_mean_abs=0.06, cases=korthikanti_table3_5_cases),
}


def run_case(case: Case, tolerance: float) -> CaseResult:
    result = simulate(load_scenario(case.scenario))
    simulated = case.simulated_value(result)
    error = (simulated - case.published) / case.published
    return CaseResult(case.case_set, case.name, case.quantity, case.unit, case.published, simulated, error, tolerance)


def run_case_set(name: str) -> list[CaseResult]:
    case_set = CASE_SETS[name]
    return [run_case(case, case_set.tolerance_per_case) for case in case_set.cases()]
