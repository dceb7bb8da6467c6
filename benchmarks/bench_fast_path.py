"""Benchmark: the fast path (simulator/strategies/spmd/fast.py) against the engine over many
random valid layouts of several models and clusters -- the distribution of the error, split by
whether transfers contended, and the time of each path as a ratio (not a timed test).

    python benchmarks/bench_fast_path.py [--layouts 2000] [--seed 0]

Layouts are drawn uniformly from the feasible rows (valid and fitting in memory) of each case's
search space, the same number per case. Prints, per case and overall: layouts, how many had no
contention (the fast path then must equal the engine to round-off), the median / 99th percentile /
max |error| of each group, whether every error is within 0.5% (no contention) and 3% (contention),
whether the fast path's every-transfer-alone bound was never above the engine, and the median
engine time / fast time ratio. Exits 1 when a tolerance is missed.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

import numpy as np

from simulator.engine.engine import Engine
from simulator.explore.search import SearchSpace, search
from simulator.scenario import load_scenario
from simulator.strategies.registry import get_kind
from simulator.strategies.spmd.fast import fast_step

CASES = {
    "gpt3-175b / 1024 A100 (default)": ([], 1024, SearchSpace()),
    "llama-1b / 16 H100": (["model=llama-1b", "cluster.node=dgx-h100", "training.seq_length=2048",
                            "parallelism.global_batch_size=64"], 16, SearchSpace(zero_stage=[0, 1, 2, 3])),
    "gpt-7.5b / 128 A100": (["model=gpt-7.5b", "training.seq_length=2048", "parallelism.global_batch_size=256"], 128,
                            SearchSpace(zero_stage=[0, 1, 3], schedule=["1f1b", "gpipe", "interleaved"])),
    "mixtral-8x7b / 64 H100": (["model=mixtral-8x7b", "cluster.node=dgx-h100", "training.seq_length=4096",
                                "training.attention=flash", "parallelism.global_batch_size=256"], 64, SearchSpace()),
    "llama3-8b / 64 H100, oversubscribed fabric": (
        ["model=llama3-8b", "cluster.node=dgx-h100", "cluster.fabric=fat-tree-4to1", "training.seq_length=4096",
         "parallelism.global_batch_size=128"],
        64, SearchSpace(cp=[1, 2])),
}


def _scenario(overrides, gpus, layout):
    sets = [f"parallelism.{k}={json.dumps(v) if isinstance(v, bool) else v}" for k, v in layout.items()
            if v is not None and k != "dp"]
    return load_scenario(None, overrides + [f"cluster.num_gpus={gpus}"] + sets)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layouts", type=int, default=2000, help="layouts in all (split over the cases)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    started = time.perf_counter()
    per_case = -(-args.layouts // len(CASES))
    spmd = get_kind("spmd")
    everything = []
    for name, (overrides, gpus, space) in CASES.items():
        rows = search(None, overrides=overrides, num_gpus=gpus, space=space, simulate=False)
        feasible = [r["parallelism"] for r in rows if r.get("fits")]
        picks = [rng.choice(feasible) for _ in range(per_case)] if feasible else []
        results = []
        for layout in picks:
            scenario = _scenario(overrides, gpus, layout)
            t0 = time.perf_counter()
            estimate = fast_step(scenario)
            t1 = time.perf_counter()
            plan = spmd.compile(scenario)
            reference = Engine(plan.topology.port_capacity).run(plan.streams)
            t2 = time.perf_counter()
            results.append((estimate.step_time_s / reference - 1, estimate.exact,
                            estimate.lower_bound_s <= reference * (1 + 1e-9), (t2 - t1) / max(t1 - t0, 1e-9)))
        everything += results
        _report(name, results)
    print()
    status = _report("all cases", everything)
    print(f"{len(everything)} layouts (seed {args.seed}) in {time.perf_counter() - started:.0f} s wall")
    return status


def _report(name: str, results) -> int:
    if not results:
        print(f"{name}: no feasible layout")
        return 0
    errors = np.array([abs(r[0]) for r in results])
    exact = np.array([r[1] for r in results])
    ratio = np.median([r[3] for r in results])
    ok = True
    parts = []
    for label, mask, tol in (("no contention", exact, 0.005), ("contention", ~exact, 0.03)):
        if mask.any():
            e = errors[mask]
            within = bool((e <= tol).all())
            ok &= within
            parts.append(f"{label} {mask.sum()}: median {100 * np.median(e):.4f}% p99 {100 * np.percentile(e, 99):.4f}% "
                         f"max {100 * e.max():.4f}% ({'within' if within else 'OUTSIDE'} {100 * tol:g}%)")
    bound_ok = all(r[2] for r in results)
    ok &= bound_ok
    print(f"{name}: {len(results)} layouts; " + "; ".join(parts)
          + f"; lower bound never above the engine: {bound_ok}; engine/fast time, median {ratio:.1f}x", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
