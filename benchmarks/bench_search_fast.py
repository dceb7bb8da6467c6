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

from simulator.explore.search import counts_line, search, summarize
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
        times = all(abs(a["step_time_s"] / b["step_time_s"] - 1) < 1e-9 for a, b in zip(rows[:20], reference[:20],
                                                                                         strict=True))
        print(f"  engine on every feasible layout: wall {wall_ref:.1f} s, CPU {cpu_ref:.1f} s "
              f"(fast search: {cpu_ref / cpu:.1f}x less CPU); top 20 identical: {same and times}")


# one search in a fresh process, with whatever simulator package is on its path (the baseline's or
# this one's): only APIs both have
_ONE_SEARCH = """
import json, os, resource, sys, time
os.environ["CLUSTERSIM_CACHE"] = "0"
from simulator.explore.search import search, summarize
if len(sys.argv) > 3 and sys.argv[3] == "reference":  # this code with the per-candidate checks as they were
    import functools
    import simulator.explore.checks as checks
    checks.check_layout = functools.partial(checks.check_layout, reference=True)
def cpu():
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime
w0, c0 = time.perf_counter(), cpu()
rows = search(sys.argv[1], workers=int(sys.argv[2]))
wall, used = time.perf_counter() - w0, cpu() - c0
s = summarize(rows)
print(json.dumps({"wall_s": wall, "cpu_s": used, "layouts": s["layouts"], "engine": s.get("engine_resimulated"),
                  "fast": s.get("priced_by_fast_path"), "best_step_s": rows[0].get("step_time_s")}))
"""


def one_search(code: Path, path: Path, workers: int, checks: str = "now") -> dict:
    env = {**os.environ, "PYTHONPATH": str(code), "CLUSTERSIM_CACHE": "0"}
    out = subprocess.run([sys.executable, "-c", _ONE_SEARCH, str(path), str(workers), checks], cwd=code, env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare_with_baseline(name: str, path: Path, baseline: Path | None, workers: int, repeats: int) -> None:
    """The search by the baseline's code and by this one, alternately, ``repeats`` times each; without a
    baseline, this code with the per-candidate checks as they were (``reference``) and as they are."""
    here = Path(__file__).resolve().parents[1]
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for _ in range(repeats):
        runs["before"].append(one_search(baseline or here, path, workers, "now" if baseline else "reference"))
        runs["after"].append(one_search(here, path, workers))
    before = baseline or "this code, reference checks"
    print(f"\n{name}: before = {before}, after = {here} ({repeats} runs each, alternating; medians)")
    for label, got in runs.items():
        wall = statistics.median(r["wall_s"] for r in got)
        cpu = statistics.median(r["cpu_s"] for r in got)
        r = got[0]
        print(f"  {label:<6} {r['layouts']:,} layouts ({r['engine']} engine runs, {r['fast']} fast-path): wall {wall:.2f} s, "
              f"{r['layouts'] / wall:,.0f} layouts/s; CPU {cpu:.2f} s, {r['layouts'] / cpu:,.0f} layouts per CPU-second;"
              f" best step {r['best_step_s']:.4f} s")


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
