"""Benchmark: the per-layer planners (``clustersim plan --planner adaptive|pase|deeppool``) in CPU
seconds, on the shipped adaptive examples and at 16,384 GPUs (not a test). Issue 22/24: the adaptive
planner's cost should grow with the distinct per-component choices, not with the GPU count.

Each case is a fresh ``python -m simulator.cli plan SCENARIO --planner P --json`` process; its CPU
seconds (user + sys) are read by this process from the kernel (``resource.getrusage(RUSAGE_CHILDREN)``).
With ``--baseline DIR`` every case also runs on another checkout, alternating with this one (the same
load for both), and the two plans are compared: the returned scenario (the plan YAML), its simulated
step, the summary, the notes and the details must be byte-identical as JSON; only what it cost to find
(``wall_s``, ``plans_estimated``: memoized prices are counted once) may differ.

    python benchmarks/bench_planners_16k.py [--cases NAME ...] [--baseline DIR] [--timeout 1200]

A case that runs past ``--timeout`` seconds of wall time is reported as such (the CPU seconds it had
spent by then are a lower bound).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: name -> (scenario relative to the checkout, planner, options, GPUs or None for the scenario's, --set overrides)
LLAMA = "examples/llama3-405b-16k-h100.yaml"
BATCH_16K = ("parallelism.global_batch_size=16384",)  # one sequence per GPU: every planner has a plan to find
#: the 405B example's layout, which the planners check before replacing it, made one a smaller model accepts
SMALLER = ("parallelism.tp=1", "parallelism.pp=1", "parallelism.virtual_stages=1", "parallelism.schedule=1f1b",
           "parallelism.sequence_parallel=false")
CASES: dict[str, tuple[str, str, dict[str, str], int | None, tuple[str, ...]]] = {
    "adaptive vgg16 8": ("examples/vgg16-adaptive-8xa100.yaml", "adaptive", {"batches": "256"}, None, ()),
    "adaptive bert-large 8": ("examples/bert-large-adaptive-8xt4.yaml", "adaptive", {}, None, ()),
    "adaptive resnet50-torchvision 8": ("examples/resnet50-torchvision-8xa100.yaml", "adaptive", {}, None, ()),
    "pase vgg16 8": ("examples/vgg16-per-layer-8xa100.yaml", "pase", {}, None, ()),
    "deeppool vgg16 8": ("examples/vgg16-per-layer-8xa100.yaml", "deeppool", {}, None, ()),
    "adaptive llama3-405b 256": (LLAMA, "adaptive", {}, 256, ()),
    "adaptive llama3-405b 16384": (LLAMA, "adaptive", {}, None, ()),
    "pase llama3-405b 16384": (LLAMA, "pase", {}, None, ()),
    "deeppool llama3-405b 16384": (LLAMA, "deeppool", {}, None, ()),
    **{f"adaptive llama3-405b {n} gbs16384": (LLAMA, "adaptive", {}, n, BATCH_16K) for n in (256, 1024, 4096, 16384)},
    "pase llama3-405b 16384 gbs16384": (LLAMA, "pase", {}, None, BATCH_16K),
    "deeppool llama3-405b 16384 gbs16384": (LLAMA, "deeppool", {}, None, BATCH_16K),
    # models whose state a plan of each planner can hold at 16,384 GPUs (the planners refuse
    # Llama-3-405B's 6.8 TiB replica up front): the 405B example's cluster with another model
    **{f"{planner} {model} {n} gbs16384": (LLAMA, planner, {}, n, (*BATCH_16K, *SMALLER, f"model={model}"))
       for planner in ("adaptive", "pase", "deeppool") for model in ("llama3-8b", "gpt-1.7b")
       for n in (1024, 4096, 16384)},
}
#: What it cost to find a plan: allowed to differ between checkouts.
COST_KEYS = ("wall_s", "plans_estimated")


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_case(tree: Path, case: str, timeout: float) -> tuple[float, dict | None, str]:
    """CPU seconds, the plan's JSON without its cost keys (None: failed or timed out), and a status."""
    scenario, planner, options, gpus, sets = CASES[case]
    cmd = [sys.executable, "-m", "simulator.cli", "plan", str(tree / scenario), "--planner", planner, "--json"]
    for key, value in options.items():
        cmd += ["--option", f"{key}={value}"]
    if gpus is not None:
        cmd += ["--gpus", str(gpus)]
    for item in sets:
        cmd += ["--set", item]
    env = {**os.environ, "PYTHONPATH": str(tree), "CLUSTERSIM_CACHE": "0"}
    before = children_cpu_s()
    try:
        proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return children_cpu_s() - before, None, f"timed out after {timeout:.0f} s wall"
    spent = children_cpu_s() - before
    if proc.returncode != 0:
        return spent, None, f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1] if proc.stderr else ''}"
    doc = json.loads(proc.stdout)
    cost = {k: doc.pop(k, None) for k in COST_KEYS}
    return spent, doc, f"ok (priced {cost['plans_estimated']}, simulated {doc.get('plans_simulated')})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES), metavar="NAME",
                        help=f"cases to run (default all: {', '.join(CASES)})")
    parser.add_argument("--baseline", type=Path, help="an older checkout: the same cases, plans compared")
    parser.add_argument("--timeout", type=float, default=1200.0, help="wall seconds per case")
    args = parser.parse_args()
    baseline = args.baseline.resolve() if args.baseline else None
    differ = 0
    for case in args.cases:
        spent, doc, status = run_case(ROOT, case, args.timeout)
        line = f"{case:34s} {spent:8.2f} CPU-s  {status}"
        if baseline is not None:
            old_spent, old_doc, old_status = run_case(baseline, case, args.timeout)
            same = doc is not None and old_doc is not None and (
                json.dumps(doc, sort_keys=True, default=str) == json.dumps(old_doc, sort_keys=True, default=str))
            differ += doc is not None and old_doc is not None and not same
            verdict = "identical plans" if same else ("PLANS DIFFER" if doc and old_doc else "not compared")
            line += f" | baseline {old_spent:8.2f} CPU-s  {old_status} | {verdict}"
        print(line, flush=True)
    print(f"load {os.getloadavg()[0]:.1f} at the end")
    if differ:
        raise SystemExit(f"{differ} case(s) returned a different plan than the baseline")


if __name__ == "__main__":
    main()
