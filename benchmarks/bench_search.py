"""Benchmark: layouts per second of `clustersim search` (not a timed test).

Reports, for a few scenarios, how many layouts the search enumerates, how many the cheap
pruning (divisibility + memory model) removes, how long pruning and simulation take, and
the resulting layouts per second (pruned + simulated, and simulated only).

    python benchmarks/bench_search.py [--workers N] [--quick]
"""

from __future__ import annotations

import argparse
import os
import time

from simulator.explore.search import SearchSpace, search
from simulator.report.search_table import summarize

CASES = {
    # name: (overrides, GPUs, space)
    "llama-1b on 16 H100 (full default space)": (
        ["model=llama-1b", "cluster.node=dgx-h100", "training.seq_length=2048", "parallelism.global_batch_size=64"],
        16, SearchSpace()),
    "llama3-8b on 64 H100 (default space)": (
        ["model=llama3-8b", "cluster.node=dgx-h100", "training.seq_length=4096", "parallelism.global_batch_size=256"],
        64, SearchSpace()),
    "gpt3-175b on 1024 A100 (tp 4-8, full recompute)": (
        [], 1024, SearchSpace(tp=[4, 8], recompute=["full"], zero_stage=[0, 1], micro_batch_size=[1, 2])),
    "mixtral-8x7b on 64 H100 (default space, ep derived: 1-8)": (
        ["model=mixtral-8x7b", "cluster.node=dgx-h100", "training.seq_length=4096", "training.attention=flash",
         "parallelism.global_batch_size=512", "parallelism.moe_load_imbalance=1.2"], 64, SearchSpace()),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--quick", action="store_true", help="only the first case")
    args = parser.parse_args()
    print(f"workers: {args.workers}")
    for name, (overrides, gpus, space) in list(CASES.items())[: 1 if args.quick else None]:
        t0 = time.perf_counter()
        pruned = search(None, overrides=overrides, num_gpus=gpus, space=space, simulate=False)
        t1 = time.perf_counter()
        rows = search(None, overrides=overrides, num_gpus=gpus, space=space, workers=args.workers)
        t2 = time.perf_counter()
        s = summarize(rows)
        prune_s, total_s = t1 - t0, t2 - t1
        sim_s = max(total_s - prune_s, 1e-9)
        best = rows[0]
        p = best["parallelism"]
        print(f"\n{name}")
        print(f"  layouts {s['layouts']}: {s['invalid']} invalid, {s['out_of_memory']} out of memory, "
              f"{s['simulated']} simulated")
        print(f"  pruning {prune_s:.2f} s ({len(pruned) / prune_s:,.0f} layouts/s); "
              f"search {total_s:.1f} s -> {s['layouts'] / total_s:,.1f} layouts/s overall, "
              f"{s['simulated'] / sim_s:,.1f} simulated layouts/s")
        if best.get("tokens_per_s"):
            print(f"  best: tp {p['tp']} pp {p['pp']} dp {p['dp']} ep {p['ep']} vp {p['virtual_stages']} mbs {p['micro_batch_size']} "
                  f"zero {p['zero_stage']} recompute {p['recompute']} sp {p['sequence_parallel']}: "
                  f"{best['tokens_per_s']:,.0f} tokens/s, MFU {100 * best['mfu']:.1f}%")


if __name__ == "__main__":
    main()
