"""Benchmark: the CLI overhead of ``clustersim simulate`` and ``clustersim --help``, in CPU seconds
(not a test). Issue 24's target: under 0.3 s of overhead for each.

*Overhead* is what the command costs beyond the simulation: the total CPU seconds (user + sys) of a
fresh ``python -m simulator.cli simulate [SCENARIO]`` process, read from the kernel by the parent
(``resource.getrusage(RUSAGE_CHILDREN)``), minus the CPU seconds of the ``simulator.simulate.simulate``
call itself, timed inside the same process (``time.process_time`` around it). It so counts the
interpreter's start, every import, parsing the command line, loading and validating the scenario,
the provenance, and printing the table. ``--help`` simulates nothing: its overhead is its total.

CPU seconds, not wall time: on a shared machine wall time follows the load, CPU time mostly does not
(a loaded host still inflates CPU seconds somewhat: caches and memory bandwidth are shared, so say the
load beside the figures). Each figure is the median over ``--repeats`` fresh processes, with the minimum
(the least disturbed run) beside it; the overhead is taken per run (total - simulate() of the same
process). Python source is compiled to ``__pycache__`` first (``compileall``), as an installed package
is: with ``PYTHONDONTWRITEBYTECODE`` set and no bytecode, every run would also pay for compiling ~300
modules.

    python benchmarks/bench_startup.py [--repeats 9] [--tree DIR] [--baseline DIR] [SCENARIO ...]

``--tree`` measures another checkout's code (run from its folder). ``--baseline DIR`` measures a second
checkout in the same run, each repeat alternating the two trees (before/after under the same load), and
prints both and the change of the medians.
"""

from __future__ import annotations

import argparse
import compileall
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 0.3

# Runs the CLI in a fresh interpreter, with simulate() wrapped to record its own CPU seconds. The wrap is
# put in place when the command itself imports simulator.simulate (an import hook), so the command's
# imports happen where and when they would without the benchmark.
_CHILD = """
import importlib.abc, sys, time
_spent = [0.0]

def _timed(inner):
    def simulate(*args, **kwargs):
        start = time.process_time()
        try:
            return inner(*args, **kwargs)
        finally:
            _spent[0] += time.process_time() - start
    return simulate

class _WrapSimulate(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "simulator.simulate":
            return None
        sys.meta_path.remove(self)
        from importlib.util import find_spec
        spec = find_spec(name)
        load = spec.loader.exec_module
        def exec_module(module):
            load(module)
            module.simulate = _timed(module.simulate)
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _WrapSimulate())
from simulator.cli import main
try:
    code = main(sys.argv[2:])
finally:
    with open(sys.argv[1], "w") as out:
        out.write(repr(_spent[0]))
sys.exit(code)
"""


def run_once(cli_args: list[str], tree: Path = ROOT) -> tuple[float, float]:
    """(total CPU seconds of the process, CPU seconds inside simulate()) of one fresh run."""
    with tempfile.NamedTemporaryFile("r", suffix=".txt") as spent_file:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-c", _CHILD, spent_file.name, *cli_args], check=True,
                       stdout=subprocess.DEVNULL, cwd=tree,
                       env={**os.environ, "PYTHONPATH": str(tree)})
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        total = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        text = Path(spent_file.name).read_text()
    return total, float(text or 0.0)


def _interpreter_cpu_s() -> float:
    """CPU seconds of ``python -c pass``: the interpreter's own start and its site (.pth files), part of
    every command's overhead but not clustersim's doing."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(cli_args: list[str], repeats: int, tree: Path = ROOT) -> list[tuple[float, float]]:
    """(total, simulate) CPU seconds of ``repeats`` fresh runs."""
    return [run_once(cli_args, tree) for _ in range(repeats)]


def summary(runs: list[tuple[float, float]]) -> dict[str, float]:
    """Medians of overhead (total - simulate, per run), total and simulate; and the least overhead."""
    return {"overhead": statistics.median(t - s for t, s in runs), "total": statistics.median(t for t, _ in runs),
            "simulate": statistics.median(s for _, s in runs), "overhead_min": min(t - s for t, s in runs)}


def _row(name: str, figures: dict[str, float]) -> str:
    flag = "ok" if figures["overhead"] < TARGET_S else "OVER"
    return (f"  {name:<46} {figures['overhead']:9.3f} {figures['overhead_min']:8.3f} {figures['total']:7.3f} "
            f"{figures['simulate']:11.3f}  {flag}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", help="scenario YAMLs to simulate (default: the built-in default)")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout to measure (default: this one)")
    parser.add_argument("--baseline", type=Path, help="a second checkout measured in the same run, alternating")
    args = parser.parse_args()
    trees = [args.tree.resolve()] + ([args.baseline.resolve()] if args.baseline else [])
    for tree in trees:
        for package in ("simulator", "hardware_specs", "workloads"):
            compileall.compile_dir(str(tree / package), quiet=1)
    cases = [("clustersim --help", ["--help"]), ("clustersim simulate (default)", ["simulate"]),
             ("clustersim simulate --json (default)", ["simulate", "--json"])]
    cases += [(f"clustersim simulate {s}", ["simulate", s]) for s in args.scenarios]
    load = os.getloadavg()[0]
    print(f"CPU seconds (user+sys) of fresh processes: median of {args.repeats} (min beside the overhead); "
          f"target overhead < {TARGET_S} s; load average {load:.1f} on {os.cpu_count()} CPUs")
    bare = summary([(_interpreter_cpu_s(), 0.0) for _ in range(args.repeats)])
    for name, cli_args in cases:
        runs: dict[Path, list[tuple[float, float]]] = {tree: [] for tree in trees}
        for _ in range(args.repeats):
            for tree in trees:  # alternating: before and after see the same load
                runs[tree].append(run_once(cli_args, tree))
        print(f"{name}:")
        print(f"  {'tree':<46} {'overhead':>9} {'(min)':>8} {'total':>7} {'simulate()':>11}")
        figures = {tree: summary(r) for tree, r in runs.items()}
        for tree in trees:
            print(_row(str(tree), figures[tree]))
        if args.baseline:
            new, old = figures[trees[0]]["overhead"], figures[trees[1]]["overhead"]
            print(f"  overhead median {old:.3f} -> {new:.3f} s ({new - old:+.3f} s, {100 * (new / old - 1):+.0f}%)")
    print(f"(python -c pass, the interpreter and its site, included in every overhead: median {bare['total']:.3f} s)")


if __name__ == "__main__":
    main()
