"""How long one simulated step takes (a benchmark, not a test: absolute times are noisy).

Reports the median CPU seconds (this process's, ``time.process_time``: on a shared machine wall
time measures the load, not the simulator) over repeats for:
- the default scenario;
- Llama-3-405B on 16,384 H100s (tp 8, pp 16, dp 128);
- DeepSeek-V3 at pp 32 (480 micro-batches), the deep pipeline that the flow network's
  unshared-port shortcut is for;
- Megatron-1T on 3,072 A100s (tp 8, pp 64, 512 micro-batches), which the engine runs folded
  (simulator/strategies/spmd/fold.py: one run at 68 micro-batches; 69 before trim24, two at 66 and 67 before fold24), and unrolled;
- the same 405B layout at dp 8, 32, 128 and 512, as ratios to dp 8, to show that symmetric mode
  does not grow with the data-parallel degree;
- with ``--resim``, the engine's re-simulation of the default GPT-3 search's top 20 (the layouts
  ``search`` runs through the engine after the fast path; the search itself is not timed);
- with ``--parts``, where one folded Megatron-1T point goes: the plan build, the engine run and the
  time breakdowns (critical rank and every stage) at the first fold point, and its task and event counts;
- with ``--phases``, instead: where a whole folded Megatron-1T ``simulate`` goes (every fold run): the plan
  builds (``Planner.build``), the engine runs (``Engine.run``), the breakdowns (``time_breakdown``,
  ``stage_breakdowns`` and ``pipeline_bubble_s``: the critical rank's, every stage's bubble, the busiest's), the fold's insertion check and the rest (the
  scenario at each point, the points' figures, the result), CPU ms, median of ``--repeats`` in one process;
  with ``--baseline DIR`` too, the same in DIR's code and this one, alternately (``--rounds`` pairs);
- with ``--baseline DIR``, instead: the issue-24 cases (Megatron-1T folded, GPT-3 175B at pp 8 and 16,
  Llama-3-405B at dp 8 and 128) simulated by the code in DIR (an older checkout, e.g. a git worktree of
  the commit to compare with) and by this one, alternately, each in a fresh process (imports not
  counted) that reports the median of ``--repeats`` runs; ``--rounds`` such pairs; before and after are
  the medians over the rounds, measured in one run.

    python benchmarks/bench_simulate.py [--repeats 5] [--resim] [--parts]
    python benchmarks/bench_simulate.py --baseline /path/to/old/checkout [--repeats 5] [--rounds 3]
    python benchmarks/bench_simulate.py --phases [--baseline /path/to/old/checkout] [--repeats 5] [--rounds 3]
    python benchmarks/bench_simulate.py [--phases] --pure-baseline [--repeats 5] [--rounds 3]

``--pure-baseline``: before is this checkout with its pure-Python engine (``CLUSTERSIM_ENGINE=python``), after the
same checkout with whichever engine it selects (the compiled one where setup.py built it: simulator/engine/__init__.py);
each process's engine build is printed first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from simulator.scenario import load_scenario
from simulator.simulate import simulate

LLAMA = Path(__file__).resolve().parents[1] / "examples" / "llama3-405b-16k-h100.yaml"
LLAMA_1F1B = ["parallelism.virtual_stages=1", "parallelism.schedule=1f1b"]
DEEPSEEK = Path(__file__).resolve().parents[1] / "examples" / "deepseek-v3-h800.yaml"
DEEPSEEK_PP32 = ["parallelism.pp=32", "parallelism.ep=16", "parallelism.tp=2", "parallelism.schedule=1f1b"]


MEGATRON_1T = ["model=gpt-1t", "cluster.num_gpus=3072", "parallelism.tp=8", "parallelism.pp=64",
               "parallelism.virtual_stages=1", "parallelism.schedule=1f1b", "parallelism.global_batch_size=3072",
               "parallelism.micro_batch_size=1", "parallelism.recompute=full", "training.seq_length=2048"]


GPT3_1F1B = ["parallelism.virtual_stages=1", "parallelism.schedule=1f1b"]
# name -> (scenario file relative to the checkout or None for the default, overrides): what --baseline times
BASELINE_CASES = {
    "megatron-1t 3072 A100 tp8 pp64 1f1b (folded)": (None, MEGATRON_1T),
    "gpt3-175b 1024 A100 pp8 v2 (the default)": (None, []),
    "gpt3-175b 1024 A100 pp8 1f1b": (None, GPT3_1F1B),
    "gpt3-175b 1024 A100 pp16 1f1b": (None, ["parallelism.pp=16", *GPT3_1F1B]),
    "gpt3-175b 1024 A100 pp16 v2": (None, ["parallelism.pp=16"]),
    "llama3-405b tp8 pp16 1f1b dp8 (1,024 GPUs)": ("examples/llama3-405b-16k-h100.yaml",
                                                  [*LLAMA_1F1B, "cluster.num_gpus=1024", "parallelism.global_batch_size=128"]),
    "llama3-405b tp8 pp16 1f1b dp128 (16,384 GPUs)": ("examples/llama3-405b-16k-h100.yaml",
                                                     [*LLAMA_1F1B, "cluster.num_gpus=16384",
                                                      "parallelism.global_batch_size=2048"]),
}
# the cases in a fresh process, with whatever simulator package is on its path: only APIs both have
_ONE_PROCESS = """
import json, statistics, sys, time
from simulator.scenario import load_scenario
from simulator.simulate import simulate
root, repeats, cases = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
out = {}
for name, (source, overrides) in cases.items():
    scenario = load_scenario(None if source is None else f"{root}/{source}", overrides)
    simulate(scenario)  # warm: pricing caches, lazy imports
    times = []
    for _ in range(repeats):
        start = time.process_time()
        simulate(scenario)
        times.append(time.process_time() - start)
    out[name] = statistics.median(times)
print(json.dumps(out))
"""

# The phases of one folded Megatron-1T simulate, in a fresh process (either checkout: only APIs both have).
# Each phase's function is wrapped to add its CPU time (an inner call of a wrapped one is not counted twice).
_PHASES = """
import collections, json, statistics, sys, time
import simulator.simulate as S
import simulator.strategies.spmd.fold as F
from simulator.engine.engine import Engine
from simulator.scenario import load_scenario
from simulator.strategies.spmd.plan import Planner
repeats, overrides = int(sys.argv[1]), json.loads(sys.argv[2])
spent, depth = collections.defaultdict(float), [0]
def wrap(owner, name, phase):
    inner = getattr(owner, name)
    def timed(*args, **kwargs):
        if depth[0]:
            return inner(*args, **kwargs)
        depth[0] += 1
        start = time.process_time()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[phase] += time.process_time() - start
            depth[0] -= 1
    setattr(owner, name, timed)
wrap(Planner, "build", "build")
# The engine with its run timed: a stand-in built where simulate and the fold build one (a compiled Engine's
# methods cannot be replaced, and a subclass would slow its typed calls).
class TimedEngine:
    def __init__(self, *args, **kwargs):
        self._engine = Engine(*args, **kwargs)
    def run(self, *args, **kwargs):
        return self._engine.run(*args, **kwargs)
    def __getattr__(self, name):
        return getattr(self._engine, name)
wrap(TimedEngine, "run", "engine")
S.Engine = TimedEngine
if hasattr(F, "Engine"):
    F.Engine = TimedEngine
wrap(S, "time_breakdown", "breakdowns")
wrap(S, "stage_breakdowns", "breakdowns")
wrap(S, "pipeline_bubble_s", "breakdowns")
for name in ("_one_period_later", "_periodic_window"):  # the fold's check: two runs compared, or one run's window
    if hasattr(F, name):
        wrap(F, name, "fold check")
scenario = load_scenario(None, overrides)
first = S.simulate(scenario)  # warm: pricing caches, lazy imports
phases = collections.defaultdict(list)
for _ in range(repeats):
    spent.clear()
    start = time.process_time()
    result = S.simulate(scenario)
    total = time.process_time() - start
    assert result.step_time_s == first.step_time_s
    for phase in ("build", "engine", "breakdowns", "fold check"):
        phases[phase].append(spent[phase])
    phases["rest"].append(total - sum(spent.values()))
    phases["total"].append(total)
print(json.dumps({phase: statistics.median(v) for phase, v in phases.items()}))
"""


def _env(code: Path, pure: bool = False) -> dict[str, str]:
    """The environment of a fresh process running the checkout at ``code`` (``pure``: its pure-Python engine,
    ``CLUSTERSIM_ENGINE=python``, even where the compiled one is built; simulator/engine/__init__.py)."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    env.pop("CLUSTERSIM_ENGINE", None)
    if pure:
        env["CLUSTERSIM_ENGINE"] = "python"
    return env


def engine_build(code: Path, pure: bool = False) -> str:
    """Which engine build the checkout at ``code`` runs: compiled (Cython) or pure Python (an older checkout, from
    before the compiled build, says nothing: pure Python)."""
    done = subprocess.run([sys.executable, "-c", "import simulator.engine as e; print(getattr(e, 'ENGINE_BUILD', 'pure Python'))"],
                          env=_env(code, pure), cwd=code, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def phases_process(code: Path, repeats: int, pure: bool = False) -> dict[str, float]:
    """Median CPU seconds per phase of a folded Megatron-1T simulate by the checkout at ``code``, in a fresh process."""
    env = _env(code, pure)
    done = subprocess.run([sys.executable, "-c", _PHASES, str(repeats), json.dumps(MEGATRON_1T)],
                          env=env, cwd=code, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def compare_phases(baseline: Path | None, repeats: int, rounds: int, pure_baseline: bool = False) -> None:
    """``pure_baseline``: before is this checkout with its pure-Python engine (``baseline`` is this checkout)."""
    here = Path(__file__).resolve().parents[1]
    codes = {"before": baseline, "after": here} if baseline else {"this code": here}
    pure = {"before": pure_baseline}
    for label, code in codes.items():
        print(f"{label}: engine {engine_build(code, pure.get(label, False))}")
    runs: dict[str, list[dict[str, float]]] = {label: [] for label in codes}
    for _ in range(rounds if baseline else 1):
        for label, code in codes.items():
            runs[label].append(phases_process(code, repeats, pure.get(label, False)))
    print(f"megatron-1t 3072 A100 tp8 pp64 1f1b, engine folded: CPU ms per simulate (every fold run), median of "
          f"{repeats} per process" + (f", median over {rounds} alternating pairs ({baseline} / {here})" if baseline else ""))
    print(f"{'phase':<12}" + "".join(f"{label:>12}" for label in codes) + (f"{'after/before':>14}" if baseline else ""))
    for phase in ("build", "engine", "breakdowns", "fold check", "rest", "total"):
        values = [statistics.median(r[phase] for r in runs[label]) for label in codes]
        line = f"{phase:<12}" + "".join(f"{v * 1e3:>12.1f}" for v in values)
        if baseline:
            line += f"{values[1] / values[0]:>14.2f}"
        print(line)


def one_process(code: Path, repeats: int, pure: bool = False) -> dict[str, float]:
    """Median CPU seconds per case, simulated by the checkout at ``code`` in a fresh process."""
    env = _env(code, pure)
    done = subprocess.run([sys.executable, "-c", _ONE_PROCESS, str(code), str(repeats), json.dumps(BASELINE_CASES)],
                          env=env, cwd=code, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def compare_with_baseline(baseline: Path, repeats: int, rounds: int, pure_baseline: bool = False) -> None:
    """``pure_baseline``: before is this checkout with its pure-Python engine (``baseline`` is this checkout)."""
    here = Path(__file__).resolve().parents[1]
    print(f"before: engine {engine_build(baseline, pure_baseline)}; after: engine {engine_build(here)}")
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for _ in range(rounds):
        runs["before"].append(one_process(baseline, repeats, pure_baseline))
        runs["after"].append(one_process(here, repeats))
    print(f"before = {baseline}, after = {here}: CPU s, median of {repeats} runs per process, "
          f"median over {rounds} alternating pairs of processes")
    print(f"{'scenario':<48} {'before':>8} {'after':>8} {'after/before':>13}")
    medians = {}
    for name in BASELINE_CASES:
        before = statistics.median(r[name] for r in runs["before"])
        after = statistics.median(r[name] for r in runs["after"])
        medians[name] = (before, after)
        print(f"{name:<48} {before:>8.3f} {after:>8.3f} {after / before:>13.2f}")
    small, large = list(BASELINE_CASES)[-2:]
    print(f"cost in dp (dp 128 / dp 8): before {medians[large][0] / medians[small][0]:.2f}, "
          f"after {medians[large][1] / medians[small][1]:.2f}")


def median_seconds(source, overrides, repeats: int, **kw) -> float:
    scenario = load_scenario(source, overrides)
    times = []
    for _ in range(repeats):
        start = time.process_time()
        simulate(scenario, **kw)
        times.append(time.process_time() - start)
    return statistics.median(times)


def resim_seconds(repeats: int) -> tuple[int, float]:
    """CPU seconds to simulate the default search's engine-evaluated layouts (its top 20) again."""
    import os

    from simulator.explore.search import search

    os.environ["CLUSTERSIM_CACHE"] = "0"
    path = Path(__file__).resolve().parents[1] / "examples" / "gpt3-175b-1024-a100.yaml"
    rows = [r for r in search(str(path), workers=1) if r.get("evaluated_by") == "engine"]
    scenarios = [load_scenario(path, [f"parallelism.{k}={v}" for k, v in r["parallelism"].items() if v is not None])
                 for r in rows]
    times = []
    for _ in range(repeats):
        start = time.process_time()
        for scenario in scenarios:
            simulate(scenario)
        times.append(time.process_time() - start)
    return len(scenarios), statistics.median(times)


def fold_point_parts(repeats: int) -> str:
    """Median CPU ms of the plan build, the engine run and the breakdowns at Megatron-1T's first fold point."""
    from simulator.engine.engine import Engine, cyclic_gc_paused
    from simulator.simulate import critical_actor, stage_breakdowns, time_breakdown
    from simulator.strategies.plan import MEMORY_COUNTER
    from simulator.strategies.registry import get_kind
    from simulator.strategies.spmd.fast import _with_micro_batches
    from simulator.strategies.spmd.fold import engine_fold_points

    scenario = load_scenario(None, MEGATRON_1T)
    micro_batches = engine_fold_points(scenario)[0][0]
    point = _with_micro_batches(scenario, micro_batches)
    parts: dict[str, list[float]] = {"build": [], "engine": [], "breakdowns": []}
    for _ in range(repeats):
        with cyclic_gc_paused():
            start = time.process_time()
            plan = get_kind("spmd").compile(point, chains=True)
            built = time.process_time()
            engine = Engine(plan.topology.port_capacity)
            makespan = engine.run(plan.streams, {(a, MEMORY_COUNTER): b for a, b in plan.memory_base_bytes.items()})
            ran = time.process_time()
            critical = critical_actor(plan)
            time_breakdown(plan, critical, makespan)
            stage_breakdowns(plan, critical, makespan)
            done = time.process_time()
        parts["build"].append(built - start)
        parts["engine"].append(ran - built)
        parts["breakdowns"].append(done - ran)
    tasks = sum(len(tasks) for tasks in plan.streams.values())
    events = next(engine._sequence)
    return (f"megatron-1t fold point ({micro_batches} micro-batches, {tasks} tasks, {events} events): "
            + ", ".join(f"{k} {statistics.median(v) * 1e3:.1f} ms" for k, v in parts.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--resim", action="store_true", help="also time the re-simulation of the default search's top 20")
    parser.add_argument("--parts", action="store_true", help="also split one Megatron-1T fold point into build, "
                                                             "engine and breakdowns")
    parser.add_argument("--baseline", type=Path, help="an older checkout: time the issue-24 cases by it and by "
                                                          "this code, alternately (module docstring)")
    parser.add_argument("--rounds", type=int, default=3, help="with --baseline: alternating pairs of processes")
    parser.add_argument("--phases", action="store_true", help="where a folded Megatron-1T simulate goes, by phase "
                                                              "(with --baseline: before and after)")
    parser.add_argument("--pure-baseline", action="store_true",
                        help="the baseline is this checkout with its pure-Python engine (CLUSTERSIM_ENGINE=python): "
                             "the compiled engine against the same source uncompiled")
    args = parser.parse_args()
    if args.pure_baseline:
        if args.baseline:
            parser.error("--pure-baseline compares this checkout with itself: no --baseline")
        args.baseline = Path(__file__).resolve().parents[1]
    print(f"engine: {engine_build(Path(__file__).resolve().parents[1])}")
    if args.phases:
        compare_phases(args.baseline.resolve() if args.baseline else None, args.repeats, args.rounds,
                       args.pure_baseline)
        return
    if args.baseline:
        compare_with_baseline(args.baseline.resolve(), args.repeats, args.rounds, args.pure_baseline)
        return
    print(f"{'scenario':<52} {'CPU s':>9}")
    print(f"{'default (GPT-3 175B, 1024 A100, interleaved)':<52} {median_seconds(None, [], args.repeats):>9.3f}")
    print(f"{'llama3-405b 16384 H100 tp8 pp16 dp128 1f1b':<52} "
          f"{median_seconds(LLAMA, LLAMA_1F1B, args.repeats):>9.3f}")
    print(f"{'llama3-405b 16384 H100 interleaved v=4':<52} {median_seconds(LLAMA, [], args.repeats):>9.3f}")
    print(f"{'deepseek-v3 2048 H800 tp2 pp32 ep16 1f1b':<52} "
          f"{median_seconds(DEEPSEEK, DEEPSEEK_PP32, args.repeats):>9.3f}")
    print(f"{'megatron-1t 3072 A100 tp8 pp64 1f1b, engine folded':<52} "
          f"{median_seconds(None, MEGATRON_1T, args.repeats):>9.3f}")
    print(f"{'megatron-1t 3072 A100 tp8 pp64 1f1b, unrolled':<52} "
          f"{median_seconds(None, MEGATRON_1T, args.repeats, fold=False):>9.3f}")
    print("\nsymmetric mode vs dp degree (llama3-405b, tp 8 pp 16, gbs = 16 x dp, 1f1b):")
    base = None
    for dp in (8, 32, 128, 512):
        overrides = LLAMA_1F1B + [f"cluster.num_gpus={8 * 16 * dp}", f"parallelism.global_batch_size={16 * dp}"]
        seconds = median_seconds(LLAMA, overrides, args.repeats)
        base = base or seconds
        print(f"  dp {dp:>4} ({8 * 16 * dp:>6} GPUs): {seconds:.3f} s  ratio to dp 8: {seconds / base:.2f}")
    if args.parts:
        print(f"\n{fold_point_parts(args.repeats)}")
    if args.resim:
        count, seconds = resim_seconds(args.repeats)
        print(f"\nre-simulation of the default GPT-3 search's {count} engine layouts: {seconds:.3f} CPU s")


if __name__ == "__main__":
    main()
