"""Benchmark: the engine's folded pipeline (simulator/strategies/spmd/fold.py) against the unrolled plan
over random layouts (not a test: tests/test_engine_fold.py checks a fixed sample).

Draws layouts (seeded) of small models on small clusters with enough micro-batches to fold: tp, pp,
virtual stages (1F1B or interleaved), ZeRO stage, overlapped reduction, sequence parallelism,
recompute, symmetric or full mode (sync jitter and interference: tests/test_engine_fold.py). Each is simulated folded and unrolled;
reports how many folded, how many the fold's checks refused, the largest relative difference of any
reported figure where it folded (step time, breakdown, busiest stage's breakdown, memory peaks), and
the CPU seconds of both.

    python benchmarks/bench_engine_fold.py [--layouts 100] [--seed 0]
"""

from __future__ import annotations

import argparse
import math
import random
import time

from simulator.errors import ConfigError
from simulator.scenario import load_scenario
from simulator.simulate import simulate

CLUSTERS = {
    "llama-1b/16xH100": (["model=llama-1b", "cluster.node=dgx-h100", "training.seq_length=512"], 16),
    "gpt-1.7b/32xA100": (["model=gpt-1.7b", "training.seq_length=512"], 32),
}


def largest_difference(a, b, scale: float) -> float:
    """The largest |a - b| / max(|a|, |b|, scale) over every float of two result dicts: relative, and for
    figures far below ``scale`` (the step time: a breakdown part near 0 s) relative to it (inf where
    they differ otherwise)."""
    if isinstance(a, dict):
        if not isinstance(b, dict) or a.keys() != b.keys():
            return math.inf
        return max((largest_difference(a[k], b[k], scale) for k in a), default=0.0)
    if isinstance(a, list):
        if not isinstance(b, list) or len(a) != len(b):
            return math.inf
        return max((largest_difference(x, y, scale) for x, y in zip(a, b, strict=True)), default=0.0)
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) / max(abs(a), abs(b), scale)
    return 0.0 if a == b else math.inf


def draw(rng: random.Random):
    name = rng.choice(sorted(CLUSTERS))
    overrides, gpus = CLUSTERS[name]
    tp, pp = rng.choice([1, 2, 4]), rng.choice([2, 4, 8])
    dp = gpus // (tp * pp)
    v = rng.choice([1, 1, 2])
    m = rng.randint(40, 160)
    if v > 1:
        m -= m % pp
    sets = [f"cluster.num_gpus={gpus}", f"parallelism.tp={tp}", f"parallelism.pp={pp}",
            f"parallelism.virtual_stages={v}", f"parallelism.schedule={'interleaved' if v > 1 else '1f1b'}",
            f"parallelism.zero_stage={rng.choice([0, 1, 2, 3])}",
            f"parallelism.overlap_grad_reduce={rng.choice(['true', 'false'])}",
            f"parallelism.sequence_parallel={rng.choice(['true', 'false'])}",
            f"parallelism.recompute={rng.choice(['none', 'selective', 'full'])}",
            f"parallelism.global_batch_size={m * dp}"]
    if gpus <= 16 and rng.random() < 0.3:
        sets.append("simulation.mode=full")
    return name, overrides + sets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layouts", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    folded = refused = invalid = 0
    worst, worst_case = 0.0, None
    cpu_folded = cpu_unrolled = 0.0
    while folded + refused < args.layouts:
        name, overrides = draw(rng)
        try:
            scenario = load_scenario(None, overrides)
        except ConfigError:
            invalid += 1
            continue
        start = time.process_time()
        a = simulate(scenario)
        middle = time.process_time()
        b = simulate(scenario, fold=False)
        end = time.process_time()
        if a.extra.get("engine_fold") is None:
            refused += 1
            continue
        folded += 1
        cpu_folded += middle - start
        cpu_unrolled += end - middle
        da, db = a.to_dict(), b.to_dict()
        da.pop("engine_fold")
        difference = largest_difference(da, db, db["step_time_s"])
        if difference > worst:
            worst, worst_case = difference, (name, overrides[len(CLUSTERS[name][0]):])
    print(f"{folded + refused} layouts ({invalid} invalid draws skipped): {folded} folded, {refused} refused by the "
          f"fold's checks (run unrolled)")
    print(f"largest difference of any figure, folded vs unrolled, relative (to the step for parts far below it): "
          f"{worst:.2e}"
          + (f" ({worst_case})" if worst_case else ""))
    if folded:
        print(f"CPU on the folded layouts: folded {cpu_folded:.1f} s, unrolled {cpu_unrolled:.1f} s "
              f"({cpu_unrolled / cpu_folded:.2f}x)")


if __name__ == "__main__":
    main()
