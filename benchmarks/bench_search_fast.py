"""Benchmark: `search` with the fast path and the engine's top k, and the engine itself (not a test).

Reports, with the on-disk cache off:

- per search (the GPT-3 175B default space on 1,024 A100s, DeepSeek-V3, and with ``--all`` every
  scenario in ``examples/``): layouts, invalid / out of memory / skipped by the compute bound /
  timed by the fast path / re-simulated by the engine, wall and CPU seconds (this process and its
  workers), layouts per wall second; with ``--check-ranking``, the same search with the engine on
  every feasible layout, and whether the top 20 are identical (same layouts, order and times);
- the engine in-process on Megatron-1T (3,072 A100s, pp 64) and the fast path on it;
- cost flat in dp: Llama-3-405B at 1,024 and 16,384 GPUs (the same tp/pp, dp 8 vs 128), engine and fast.

    python benchmarks/bench_search_fast.py [--workers 2] [--all] [--check-ranking]
    python benchmarks/bench_search_fast.py --baseline /path/to/old/checkout [--repeats 3] [--searches-only]
    python benchmarks/bench_search_fast.py --checks-ab [--repeats 3] [--searches-only] [--only gpt3]

- the per-candidate checks of each search (simulator/explore/checks.py: scenario, memory, bound) in
  this process, as they were (``reference``) and as they are: CPU seconds and layouts per CPU-second;
- ``--baseline DIR``: each search run alternately by the code in DIR (an older checkout: a git
  worktree of the commit to compare with) and by this one, each in a fresh process (imports not
  counted), ``--repeats`` times: the median wall and CPU seconds of each, and layouts per wall second
  and per CPU-second, before and after, measured in one run; ``--checks-ab``: the same with this code
  and its per-candidate checks as they were (simulator/explore/checks.py ``reference``) as "before".

On a machine shared with other work, compare CPU seconds and ratios, not wall times.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from simulator.explore.search import search
from simulator.report.search_table import counts_line, summarize
from simulator.scenario import load_scenario
from simulator.simulate import simulate

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SEARCHES = {"gpt3-175b-1024-a100 (default space)": EXAMPLES / "gpt3-175b-1024-a100.yaml",
            "deepseek-v3-h800": EXAMPLES / "deepseek-v3-h800.yaml"}
MEGATRON_1T = ["model=gpt-1t", "cluster.num_gpus=3072", "parallelism.tp=8", "parallelism.pp=64",
               "parallelism.virtual_stages=1", "parallelism.schedule=1f1b", "parallelism.global_batch_size=3072",
               "parallelism.micro_batch_size=1", "parallelism.recompute=full", "training.seq_length=2048"]
LLAMA = EXAMPLES / "llama3-405b-16k-h100.yaml"


def cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def engine_everywhere(raw):
    from simulator.simulate import simulate_point

    return simulate_point(raw, engine="full")


def _key(row):
    return tuple(sorted(row["parallelism"].items()))


def _same_time(a: float | None, b: float | None) -> bool:
    """Two rows' step times agree to 1e-9; a row that does not run (out of memory, refused) has none, and agrees
    only with another that does not (a search with fewer than 20 feasible layouts lists them after the rest)."""
    if a is None or b is None:
        return a is None and b is None
    return abs(a / b - 1) < 1e-9


def run_search(name: str, path: Path, workers: int, check: bool) -> None:
    wall0, cpu0 = time.perf_counter(), cpu_seconds()
    rows = search(str(path), workers=workers)
    wall, cpu = time.perf_counter() - wall0, cpu_seconds() - cpu0
    s = summarize(rows)
    print(f"\n{name}: {counts_line(s)}")
    print(f"  wall {wall:.1f} s ({s['layouts'] / wall:,.0f} layouts evaluated/s, {s['priced_by_fast_path'] / wall:,.1f} "
          f"priced/s), CPU {cpu:.1f} s ({s['layouts'] / cpu:,.0f} layouts evaluated per CPU-second)")
    if check:
        wall0, cpu0 = time.perf_counter(), cpu_seconds()
        reference = search(str(path), workers=workers, simulate_fn=engine_everywhere)
        wall_ref, cpu_ref = time.perf_counter() - wall0, cpu_seconds() - cpu0
        same = [_key(r) for r in rows[:20]] == [_key(r) for r in reference[:20]]
        times = all(_same_time(a["step_time_s"], b["step_time_s"])
                    for a, b in zip(rows[:20], reference[:20], strict=True))
        print(f"  engine on every feasible layout: wall {wall_ref:.1f} s, CPU {cpu_ref:.1f} s "
              f"(fast search: {cpu_ref / cpu:.1f}x less CPU); top 20 identical: {same and times}")


# one search in a fresh process, with whatever simulator package is on its path (the baseline's or
# this one's): only APIs both have
_ONE_SEARCH = """
import json, os, resource, sys, time
os.environ["CLUSTERSIM_CACHE"] = "0"
import simulator.explore.search as searching
from simulator.explore.search import search
from simulator.report.search_table import summarize
if len(sys.argv) > 3 and sys.argv[3] == "reference":  # this code with the per-candidate checks as they were
    import functools
    import simulator.explore.checks as checks
    checks.check_layout = functools.partial(checks.check_layout, reference=True)
def cpu():
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime
checked = []  # (wall, CPU) when the per-candidate checks are done: the evaluation phase
timing = searching._branch_and_bound
def timed(*args, **kwargs):
    checked.append((time.perf_counter(), cpu(), time.process_time()))
    return timing(*args, **kwargs)
searching._branch_and_bound = timed
# every task's CPU seconds in its worker and every parallel_map call's span in this process: the replay
LOG = os.environ["BENCH_TASK_LOG"]
def logged(fn):
    def task(*args, **kwargs):
        c = time.process_time()
        result = fn(*args, **kwargs)
        with open(LOG, "a") as fh:
            fh.write(json.dumps([time.perf_counter(), time.process_time() - c]) + "\\n")
        return result
    task.__module__, task.__name__, task.__qualname__ = fn.__module__, fn.__name__, fn.__qualname__
    return task
for name in ("_check_task", "_engine_task", "_engine_fast_task", "_fast_task", "_search_task"):
    if hasattr(searching, name):
        setattr(searching, name, logged(getattr(searching, name)))
waves = []
mapping = searching.parallel_map
def spanned(*args, **kwargs):
    start = time.perf_counter()
    yield from mapping(*args, **kwargs)
    waves.append((start, time.perf_counter()))
searching.parallel_map = spanned
def replay(span, workers):
    # the wave's tasks (those that began in it) on `workers` workers, each to the first free one in the
    # order they began: the makespan a quiet machine would give them
    with open(LOG) as fh:
        tasks = sorted(json.loads(line) for line in fh)
    free = [0.0] * workers
    for end, seconds in tasks:
        if span[0] <= end - 0.0 and end <= span[1] + 1e-3:
            free[free.index(min(free))] += seconds
    return max(free), sum(seconds for end, seconds in tasks if span[0] <= end <= span[1] + 1e-3)
w0, c0, p0 = time.perf_counter(), cpu(), time.process_time()
rows = search(sys.argv[1], workers=int(sys.argv[2]))
wall, used, parent = time.perf_counter() - w0, cpu() - c0, time.process_time() - p0
waved = [replay(span, int(sys.argv[2])) for span in waves]
task_cpu = sum(c for _, c in waved)
# replayed 2-core wall: this process's CPU (serial, counted whole) + each wave's makespan + the workers'
# CPU outside tasks (pickling, start-up) shared evenly
replayed = parent + sum(m for m, _ in waved) + max(0.0, used - parent - task_cpu) / int(sys.argv[2])
checks_replayed = (checked[0][2] - p0 + waved[0][0]) if waved else float("nan")
s = summarize(rows)
print(json.dumps({"wall_s": wall, "cpu_s": used, "layouts": s["layouts"], "engine": s.get("engine_resimulated"),
                  "fast": s.get("priced_by_fast_path"), "best_step_s": rows[0].get("step_time_s"),
                  "checks_wall_s": checked[0][0] - w0, "checks_cpu_s": waved[0][1] + checked[0][2] - p0,
                  "replayed_wall_s": replayed, "checks_replayed_wall_s": checks_replayed,
                  "parent_cpu_s": parent, "waves": len(waves),
                  "top": [sorted(r["parallelism"].items()) for r in rows[:20]],
                  "top_s": [r.get("step_time_s") for r in rows[:20]]}))
"""


def one_search(code: Path, path: Path, workers: int, checks: str = "now") -> dict:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONPATH": str(code), "CLUSTERSIM_CACHE": "0", "BENCH_TASK_LOG": f"{tmp}/tasks.jsonl"}
        out = subprocess.run([sys.executable, "-c", _ONE_SEARCH, str(path), str(workers), checks], cwd=code, env=env,
                             capture_output=True, text=True)
        if out.returncode:
            raise RuntimeError(f"search by {code} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def compile_bytecode(code: Path) -> None:
    """Byte-compile ``code``'s packages into their ``__pycache__`` folders (git ignores them), as an
    installed package has them: a machine with PYTHONDONTWRITEBYTECODE set (this one) would otherwise
    compile every module of the project from source in every fresh process (~0.07 CPU-s of a search's
    start-up)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([sys.executable, "-m", "compileall", "-q", *(str(code / d) for d in PACKAGES if (code / d).is_dir())],
                   env=env, check=False, capture_output=True)


PACKAGES = ("simulator", "hardware_specs", "workloads")


def compare_with_baseline(name: str, path: Path, baseline: Path | None, workers: int, repeats: int) -> None:
    """The search by the baseline's code and by this one, alternately, ``repeats`` times each; without a
    baseline, this code with the per-candidate checks as they were (``reference``) and as they are."""
    here = Path(__file__).resolve().parents[1]
    for code in {here, baseline or here}:
        compile_bytecode(code)
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for _ in range(repeats):
        runs["before"].append(one_search(baseline or here, path, workers, "now" if baseline else "reference"))
        runs["after"].append(one_search(here, path, workers))
    before = baseline or "this code, reference checks"
    print(f"\n{name}: before = {before}, after = {here} ({repeats} runs each, alternating; medians)")
    print("  whole search = search() from its call to its rows in a fresh process (after `import "
          "simulator.explore.search`: the modules it imports on its first call, byte-compiled as installed, its spec "
          "schemas and its worker pool counted), the engine's top-k runs included; evaluation phase = until every candidate is checked, pruned "
          "or bounded (before the engine); replayed = each phase's tasks placed on idle workers by their CPU seconds, "
          "this process's CPU counted whole (a wall clock for a quiet machine from a loaded one)")
    for label, got in runs.items():
        wall = statistics.median(r["wall_s"] for r in got)
        cpu = statistics.median(r["cpu_s"] for r in got)
        r = got[0]
        line = (f"  {label:<6} {r['layouts']:,} layouts ({r['engine']} engine runs, {r['fast']} fast-path): whole search "
                f"wall {wall:.2f} s, {r['layouts'] / wall:,.0f} layouts/s; CPU {cpu:.2f} s, {r['layouts'] / cpu:,.0f} "
                f"layouts per CPU-second; best step {r['best_step_s']:.4f} s")
        if "checks_wall_s" in r:
            def med(key: str, got: list[dict] = got) -> float:
                return statistics.median(x[key] for x in got)
            line += (f"\n         replayed on {workers} idle cores: whole search {med('replayed_wall_s'):.2f} s, "
                     f"{r['layouts'] / med('replayed_wall_s'):,.0f} layouts/s ({r['waves'] - 1} engine waves; this "
                     f"process {med('parent_cpu_s'):.2f} CPU-s)"
                     f"\n         evaluation phase wall {med('checks_wall_s'):.2f} s, {r['layouts'] / med('checks_wall_s'):,.0f}"
                     f" layouts/s, replayed {med('checks_replayed_wall_s'):.2f} s, "
                     f"{r['layouts'] / med('checks_replayed_wall_s'):,.0f} layouts/s; CPU {med('checks_cpu_s'):.2f} s, "
                     f"{r['layouts'] / med('checks_cpu_s'):,.0f} layouts per CPU-second")
        print(line)
    if all("top" in r for r in runs["before"] + runs["after"]):
        same = all(r["top"] == runs["before"][0]["top"] and r["top_s"] == runs["before"][0]["top_s"]
                   for r in runs["before"] + runs["after"])
        print(f"  top 20 (layouts and step times) identical in every run: {same}")


def checks_cpu(name: str, path: Path) -> None:
    """The per-candidate checks of the search in this process, reference and vectorised/shared."""
    from simulator.explore import bounds, checks
    from simulator.explore.search import SearchConstraints, SearchSpace, prepare

    raw, _, candidates = prepare(str(path), None, None, SearchSpace(), SearchConstraints())
    points = []
    for cand in candidates:
        point = copy.deepcopy(raw)
        point["parallelism"] = cand
        points.append(point)
    seconds = {}
    for label, reference in (("reference", True), ("now", False)):
        bounds._PASSES.clear()
        bounds._CHUNK_PASSES.clear()
        bounds._TAILS.clear()
        start = time.process_time()
        for point in points:
            checks.check_layout(point, None, True, True, reference=reference)
        seconds[label] = time.process_time() - start
    print(f"  checks of {len(points):,} candidates in-process (scenario, memory, bound): reference "
          f"{seconds['reference']:.2f} CPU-s ({len(points) / seconds['reference']:,.0f}/CPU-s), now "
          f"{seconds['now']:.2f} CPU-s ({len(points) / seconds['now']:,.0f}/CPU-s): "
          f"{seconds['reference'] / seconds['now']:.1f}x")


def median_s(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--all", action="store_true", help="every scenario in examples/, not only two")
    parser.add_argument("--check-ranking", action="store_true", help="also run each search with the engine everywhere")
    parser.add_argument("--baseline", type=Path, help="an older checkout to compare each search with")
    parser.add_argument("--checks-ab", action="store_true",
                        help="like --baseline, with this code's reference checks as the baseline")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each search per code with --baseline")
    parser.add_argument("--searches-only", action="store_true", help="no engine timings (Megatron-1T, Llama-3)")
    parser.add_argument("--only", help="only the searches whose name contains this")
    args = parser.parse_args()
    os.environ["CLUSTERSIM_CACHE"] = "0"
    searches = dict(SEARCHES)
    if args.all:
        searches.update({p.stem: p for p in sorted(EXAMPLES.glob("*.yaml"))})
    for name, path in searches.items():
        if args.only and args.only not in name:
            continue
        if args.baseline or args.checks_ab:
            compare_with_baseline(name, path, args.baseline.resolve() if args.baseline else None, args.workers,
                                  args.repeats)
        else:
            run_search(name, path, args.workers, args.check_ranking)
        checks_cpu(name, path)
    if args.searches_only:
        return
    print()
    megatron = load_scenario(None, MEGATRON_1T)
    engine_s = median_s(lambda: simulate(megatron))
    fast_s = median_s(lambda: simulate(megatron, engine="fast"))
    par = megatron.parallelism
    micro_batches = par.global_batch_size // (par.dp * par.micro_batch_size)
    print(f"Megatron-1T, 3072 A100, pp {par.pp}, {micro_batches} micro-batches: engine {1000 * engine_s:.0f} ms, "
          f"fast path {1000 * fast_s:.0f} ms in-process")
    small = load_scenario(LLAMA, ["cluster.num_gpus=1024", "parallelism.virtual_stages=1", "parallelism.schedule=1f1b",
                                  "parallelism.global_batch_size=128"])
    large = load_scenario(LLAMA, ["parallelism.virtual_stages=1", "parallelism.schedule=1f1b",
                                  "parallelism.global_batch_size=2048"])
    for label, engine in (("engine", "full"), ("fast path", "fast")):
        a = median_s(lambda engine=engine: simulate(small, engine=engine))
        b = median_s(lambda engine=engine: simulate(large, engine=engine))
        print(f"Llama-3-405B tp8 pp16, 16 micro-batches: dp 8 (1,024 GPUs) {1000 * a:.0f} ms, dp 128 (16,384 GPUs) "
              f"{1000 * b:.0f} ms by the {label}: ratio {b / a:.2f}")


if __name__ == "__main__":
    main()
