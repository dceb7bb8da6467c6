"""Benchmark: CPU seconds of the search's parts on one core, for comparing two trees on a loaded
machine (not a test). Wall times on a shared machine follow the load; CPU seconds of this process
(``time.process_time``) mostly do not.

On the GPT-3 175B default search space (examples/gpt3-175b-1024-a100.yaml), in-process:

- *prune*: building every candidate's scenario and its memory check (what ``search`` does in its
  own process before timing anything), per layout;
- *fast path*: ``fast_step`` on a fixed sample of the feasible layouts (seed 0), per layout;
- *engine*: the discrete-event engine on Megatron-1T (3,072 A100s, pp 64, 512 micro-batches), one
  simulation, folded (simulator/strategies/spmd/fold.py) and unrolled (``fold=False``; a tree without
  the fold runs it unrolled both times); Llama-3-405B on 16,384 H100s (the example: interleaved, 16
  micro-batches, not folded); cost flat in dp: Llama-3-405B tp 8 pp 16 1F1B, 16 micro-batches, at dp 8
  (1,024 GPUs) and dp 128 (16,384 GPUs), and their ratio.

Each figure is the median of ``--repeats`` runs. Compare trees with
``PYTHONPATH=<tree> python benchmarks/bench_fast_cpu.py``.

    python benchmarks/bench_fast_cpu.py [--layouts 12] [--repeats 3] [--skip-engine]
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import time
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "gpt3-175b-1024-a100.yaml"
LLAMA = Path(__file__).resolve().parents[1] / "examples" / "llama3-405b-16k-h100.yaml"
MEGATRON_1T = ["model=gpt-1t", "cluster.num_gpus=3072", "parallelism.tp=8", "parallelism.pp=64",
               "parallelism.virtual_stages=1", "parallelism.schedule=1f1b", "parallelism.global_batch_size=3072",
               "parallelism.micro_batch_size=1", "parallelism.recompute=full", "training.seq_length=2048"]


def cpu_median(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layouts", type=int, default=12, help="feasible layouts timed by the fast path")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-engine", action="store_true")
    args = parser.parse_args()
    os.environ["CLUSTERSIM_CACHE"] = "0"
    from simulator.errors import ConfigError
    from simulator.explore.search import search
    from simulator.memory.analytic import peak_rank_memory
    from simulator.scenario import build_scenario, load_raw, load_scenario
    from simulator.simulate import simulate
    from simulator.strategies.spmd.fast import fast_step

    rows = search(str(EXAMPLE), simulate=False)
    raw, _ = load_raw(str(EXAMPLE))
    layouts = [r["parallelism"] for r in rows]

    def prune() -> None:
        for layout in layouts:
            point = copy.deepcopy(raw)
            point["parallelism"] = {k: v for k, v in layout.items() if k != "dp"}
            try:
                peak_rank_memory(build_scenario(point))
            except ConfigError:
                pass

    prune_s = cpu_median(prune, args.repeats)
    feasible = [r["parallelism"] for r in rows if r.get("fits")]
    picks = random.Random(0).sample(feasible, min(args.layouts, len(feasible)))
    scenarios = []
    for layout in picks:
        point = copy.deepcopy(raw)
        point["parallelism"] = {k: v for k, v in layout.items() if k != "dp"}
        scenarios.append(build_scenario(point))
    checksum = []

    def fast() -> None:
        checksum[:] = [fast_step(sc).step_time_s for sc in scenarios]

    fast_s = cpu_median(fast, args.repeats)
    print(f"prune: {len(layouts)} layouts, {prune_s:.2f} CPU s ({1000 * prune_s / len(layouts):.2f} ms per layout)")
    print(f"fast path: {len(scenarios)} feasible layouts, {fast_s:.2f} CPU s ({1000 * fast_s / len(scenarios):.0f} ms "
          f"per layout, {len(scenarios) / fast_s:.1f} layouts per CPU-second); step times sum {sum(checksum)!r}")
    if not args.skip_engine:
        def unrolled(scenario):
            try:
                return simulate(scenario, fold=False)
            except TypeError:  # a tree without the engine fold
                return simulate(scenario)

        megatron = load_scenario(None, MEGATRON_1T)
        engine_s = cpu_median(lambda: simulate(megatron), args.repeats)
        unrolled_s = cpu_median(lambda: unrolled(megatron), args.repeats)
        folded = simulate(megatron).extra.get("engine_fold")
        print(f"engine: Megatron-1T (3,072 A100, pp 64, 512 micro-batches), {1000 * engine_s:.0f} CPU ms per "
              f"simulation ({'folded at ' + str(folded['micro_batches_evaluated']) if folded else 'not folded'}), "
              f"unrolled {1000 * unrolled_s:.0f} CPU ms")
        llama = load_scenario(LLAMA, [])
        print(f"engine: Llama-3-405B (16,384 H100, the example), {1000 * cpu_median(lambda: simulate(llama), args.repeats):.0f}"
              " CPU ms per simulation")
        per_dp = {}
        for dp in (8, 128):
            scenario = load_scenario(LLAMA, [f"cluster.num_gpus={8 * 16 * dp}", "parallelism.virtual_stages=1",
                                             "parallelism.schedule=1f1b", f"parallelism.global_batch_size={16 * dp}"])
            per_dp[dp] = cpu_median(lambda scenario=scenario: simulate(scenario), args.repeats)
        print(f"engine, cost flat in dp: Llama-3-405B tp 8 pp 16 1F1B: dp 8 (1,024 GPUs) {1000 * per_dp[8]:.0f} CPU ms, "
              f"dp 128 (16,384 GPUs) {1000 * per_dp[128]:.0f} CPU ms, ratio {per_dp[128] / per_dp[8]:.2f}")


if __name__ == "__main__":
    main()
