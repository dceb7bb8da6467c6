"""Benchmark: the CLI overhead of ``clustersim simulate`` and ``clustersim --help``, in CPU seconds
(not a test). Issue 24's target: under 0.3 s of overhead for each.

*Overhead* is what the command costs beyond the simulation: the total CPU seconds (user + sys) of a
fresh ``python -m simulator.cli simulate [SCENARIO]`` process, read from the kernel by the parent
(``resource.getrusage(RUSAGE_CHILDREN)``), minus the CPU seconds of the ``simulator.simulate.simulate``
call itself, timed inside the same process (``time.process_time`` around it). It so counts the
interpreter's start, every import, parsing the command line, loading and validating the scenario,
the provenance, and printing the table. ``--help`` simulates nothing: its overhead is its total.

CPU seconds, not wall time: on a shared machine wall time follows the load, CPU time mostly does not.
Each figure is the minimum of ``--repeats`` fresh processes (the least disturbed run). Python source
is compiled to ``__pycache__`` first (``compileall``), as an installed package is: with
``PYTHONDONTWRITEBYTECODE`` set and no bytecode, every run would also pay for compiling ~300 modules.

    python benchmarks/bench_startup.py [--repeats 7] [--tree DIR] [SCENARIO ...]

Compare trees with ``--tree <other checkout>`` (it runs that tree's code, from its folder).
"""

from __future__ import annotations

import argparse
import compileall
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 0.3

# Runs the CLI in a fresh interpreter, with simulate() wrapped to record its own CPU seconds.
# simulator.simulate is imported (to wrap it) only for `simulate`, which imports it anyway.
_CHILD = """
import sys, time
_spent = [0.0]
if "simulate" in sys.argv[2:]:
    import simulator.simulate as _sim
    _inner = _sim.simulate
    def _timed(*args, **kwargs):
        start = time.process_time()
        try:
            return _inner(*args, **kwargs)
        finally:
            _spent[0] += time.process_time() - start
    _sim.simulate = _timed
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


def measure(cli_args: list[str], repeats: int, tree: Path = ROOT) -> tuple[float, float, float]:
    """Minimum over repeats of (overhead, total, simulate) CPU seconds; the overhead's minimum is taken
    per run (total - simulate of the same process), not as the difference of two minima."""
    runs = [run_once(cli_args, tree) for _ in range(repeats)]
    best = min(runs, key=lambda r: r[0] - r[1])
    return best[0] - best[1], best[0], best[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", help="scenario YAMLs to simulate (default: the built-in default)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout to measure (default: this one)")
    args = parser.parse_args()
    tree = args.tree.resolve()
    for package in ("simulator", "hardware_specs", "workloads"):
        compileall.compile_dir(str(tree / package), quiet=1)
    cases = [("clustersim --help", ["--help"]), ("clustersim simulate (default)", ["simulate"]),
             ("clustersim simulate --json (default)", ["simulate", "--json"])]
    cases += [(f"clustersim simulate {s}", ["simulate", s]) for s in args.scenarios]
    print(f"{tree}: CPU seconds (user+sys), minimum of {args.repeats} fresh processes; target overhead < {TARGET_S} s")
    print(f"  {'command':<48} {'overhead':>9} {'total':>7} {'simulate()':>11}")
    bare = min(_interpreter_cpu_s() for _ in range(args.repeats))
    print(f"  {'(python -c pass: the interpreter and its site)':<48} {bare:9.3f} {bare:7.3f} {0:11.3f}  included above")
    for name, cli_args in cases:
        overhead, total, inside = measure(cli_args, args.repeats, tree)
        flag = "ok" if overhead < TARGET_S else "OVER"
        print(f"  {name:<48} {overhead:9.3f} {total:7.3f} {inside:11.3f}  {flag}")


if __name__ == "__main__":
    main()
