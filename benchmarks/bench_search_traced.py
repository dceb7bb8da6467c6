"""Benchmark: ``clustersim search`` on a model imported from PyTorch against its catalog twin, in CPU
seconds (not a test). Issue 19/24's target: the traced search costs at most 1.3x the catalog's.

The two scenarios differ only in ``model``: ``examples/resnet50-torchvision-8xa100.yaml``
(``model: torchvision:resnet50``, traced on the meta device by torch.fx) and
``examples/resnet50-8xa100.yaml`` (the catalog's ``resnet50``); both print the same layouts and
images/s (checked here on the top rows). Each run is a fresh ``python -m simulator.cli search
SCENARIO --no-cache --workers W --json`` process; its CPU seconds (user + sys, its pool's workers
included: they are its children, joined before it exits) are read by this process from the kernel
(``resource.getrusage(RUSAGE_CHILDREN)``), so the traced run pays for importing torch and torchvision
and for every trace, wherever it happens. The runs alternate traced, catalog (and the baseline's, with
``--baseline``) so that each pair sees the same load; the figure is the median over ``--repeats``, and
the ratio is taken of the medians. Source is compiled first (``compileall``), as an installed package is.

    python benchmarks/bench_search_traced.py [--repeats 3] [--workers 2] [--baseline DIR]

``--baseline DIR``: the traced search by another checkout too, in the same alternation (before/after
under the same load).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACED = "examples/resnet50-torchvision-8xa100.yaml"
CATALOG = "examples/resnet50-8xa100.yaml"
TARGET_RATIO = 1.3


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_search(tree: Path, scenario: str, workers: int) -> tuple[float, list[tuple[str, float]]]:
    """CPU seconds of one search process of ``tree`` on ``scenario``, and its top five rows
    (layout, samples/s rounded) to compare the twins by."""
    env = {**os.environ, "PYTHONPATH": str(tree), "CLUSTERSIM_CACHE": "0"}
    before = children_cpu_s()
    proc = subprocess.run([sys.executable, "-m", "simulator.cli", "search", str(tree / scenario), "--no-cache",
                           "--workers", str(workers), "--json", "--top", "5"],
                          cwd=tree, env=env, capture_output=True, text=True, check=False)
    spent = children_cpu_s() - before
    if proc.returncode != 0:
        raise SystemExit(f"search of {scenario} in {tree} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    rows = json.loads(proc.stdout)
    top = [(json.dumps(r["parallelism"], sort_keys=True), round(r.get("samples_per_s") or 0.0, 1)) for r in rows]
    return spent, top


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="alternating rounds (median of each)")
    parser.add_argument("--workers", type=int, default=2, help="the searches' worker processes")
    parser.add_argument("--baseline", type=Path, help="an older checkout: its traced search in the same rounds")
    args = parser.parse_args()
    trees = [ROOT] + ([args.baseline.resolve()] if args.baseline else [])
    for tree in trees:
        for folder in ("simulator", "workloads", "hardware_specs", "validation"):
            compileall.compile_dir(tree / folder, quiet=1)
    runs: dict[str, list[float]] = {"traced": [], "catalog": [], "baseline traced": []}
    tops: dict[str, list] = {}
    for _ in range(args.repeats):
        for name, tree, scenario in (("traced", ROOT, TRACED), ("catalog", ROOT, CATALOG),
                                     *((("baseline traced", trees[1], TRACED),) if args.baseline else ())):
            spent, top = one_search(tree, scenario, args.workers)
            runs[name].append(spent)
            tops[name] = top
    load = os.getloadavg()[0]
    print(f"clustersim search, --workers {args.workers}, CPU s per process (median of {args.repeats}; "
          f"load {load:.1f} at the end)")
    medians = {name: statistics.median(values) for name, values in runs.items() if values}
    for name, values in runs.items():
        if values:
            print(f"  {name:16s} {medians[name]:7.2f}  (runs: {', '.join(f'{v:.2f}' for v in values)})")
    ratio = medians["traced"] / medians["catalog"]
    verdict = "met" if ratio <= TARGET_RATIO else "NOT met"
    print(f"traced / catalog: {ratio:.2f}x (target <= {TARGET_RATIO}x: {verdict})")
    if args.baseline:
        print(f"baseline traced / catalog: {medians['baseline traced'] / medians['catalog']:.2f}x; "
              f"traced now / before: {medians['traced'] / medians['baseline traced']:.3f}")
    same = tops["traced"] == tops["catalog"]
    print(f"top 5 layouts and samples/s, traced = catalog: {same}")
    if not same:
        raise SystemExit("the traced search ranks differently from its catalog twin")


if __name__ == "__main__":
    main()
