"""The attention kernel each published run used, from its source (``attention_kernel_by_run.csv``).

A row's ``training.attention_kernel`` is set from what the run's source says it ran, not left to
``auto``: one line per (set, run, GPU) with the kernel the run used (``kernel_run``), the simulator's
name for it (``attention_kernel``) and the source. ``auto`` is kept where naming the kernel would
reprice the row against its accelerator's calibrated default (A100: the GEMM-curve estimate;
MI300X: no kernel measured), as the line's source says. ``cudnn`` (Transformer Engine's choice on
Hopper) is measured nowhere and prices as the accelerator's default kernel (simulator/cost/
attention_kernel.py): naming it changes the provenance, not the time.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from validation.modern.mapping import read

CSV = "attention_kernel_by_run.csv"


@dataclass(frozen=True)
class RunKernel:
    attention_kernel: str   # training.attention_kernel
    kernel_run: str         # the kernel the run used, in the source's words
    source: str


@cache
def _table() -> dict[tuple[str, str, str], RunKernel]:
    df = read(CSV)
    return {(str(r["set"]), str(r["run"]), str(r["gpu"])): RunKernel(str(r["attention_kernel"]), str(r["kernel_run"]),
                                                                      str(r["source"])) for _, r in df.iterrows()}


def run_kernel(case_set: str, run: str, gpu: str) -> RunKernel:
    """The kernel line of a run on a GPU (``gpu``: H100, H200, A100 or MI300X); a KeyError names a run the
    table lacks, so a new mapper or GPU must say which kernel its rows ran."""
    return _table()[(case_set, run, gpu)]


def with_run_kernel(training: dict, kernel: RunKernel) -> dict:
    """``training`` with the run's ``attention_kernel`` (unchanged for ``auto``)."""
    if kernel.attention_kernel == "auto":
        return training
    return {**training, "attention_kernel": kernel.attention_kernel}
