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

On a machine shared with other work, compare CPU seconds and ratios, not wall times.
"""

from __future__ import annotations

import argparse
import os
import resource
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
    args = parser.parse_args()
    os.environ["CLUSTERSIM_CACHE"] = "0"
    searches = dict(SEARCHES)
    if args.all:
        searches.update({p.stem: p for p in sorted(EXAMPLES.glob("*.yaml"))})
    for name, path in searches.items():
        run_search(name, path, args.workers, args.check_ranking)
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
