"""Benchmark: a search the size of Calculon's own for GPT-3 175B on 1,024 A100s (not a test).

Calculon (Isaev et al., SC'23, Sec. 5) searches every tensor-, pipeline- and data-parallel split,
micro-batch, interleave, recompute, optimizer sharding and overlap option: on the order of a million
executions for one system and model. The same space here (simulator/explore/wide.py):

- tp: every power of two dividing 1,024 (tp_within_node off: across nodes too, as Calculon tries);
- pp: every divisor of 1,024 / tp up to the 96 layers; dp: what is left;
- virtual stages (interleave) 1, 2, 3, 4, 6, 8, 12; schedule GPipe or 1F1B without interleave;
- micro-batch 1, 2, 4, 8; recompute none, selective, full; sequence parallel off/on (tp > 1);
  ZeRO stage 0, 1, 2, 3;
- the five overlap switches on/off: gradient reduction, parameter all-gather, TP input-gradient
  collective beside the weight-gradient GEMM, pipeline sends, userbuffers TP overlap.

That is 33,264 layouts × 32 switch settings = 1,064,448 candidates. Prints every count (invalid,
pruned by memory, pruned by the bound, priced by the fast path, re-simulated by the engine), wall
and CPU seconds (this process and its workers), and the top 5.

    python benchmarks/bench_search_calculon.py [--workers 2] [--small]

``--small`` keeps tp within the node and 2 interleave values (a quick run). On a machine shared
with other work, read CPU seconds, not wall time.

Runs of 2026-12-05 (``--workers 2``, nice 10, load 12-20 on 2 cores; the same top 5, #1 tp 8 pp 4 vp 12
at 17.420 s, MFU 60.8%, in each):

- fca715e (the fast path first, the engine where its bound could reach the top 20): 181,491 pruned
  by the bound; 1,401 candidates by the fast path (670 runs), 1,193 by the engine (575 runs);
  373.7 CPU-s (1,156 s wall);
- fca715e + the engine first, best bound first (3274ee8's search): 181,638 pruned; 1,258 by the
  engine (588 runs), the fast path beside it or after it on 60 (27 runs); 196.9 CPU-s (790 s wall);
- main of 12:48 (the engine's chains, vectorised checks) + the last gradient bucket in the bound:
  181,654 pruned; 1,242 by the engine (580 runs), 60 by the fast path (27 runs); 177.3 CPU-s
  (1,393 s wall at load 20).
"""

from __future__ import annotations

import argparse
import os
import resource
import time

from simulator.explore.search import SWITCHES, SearchConstraints, SearchSpace
from simulator.explore.wide import wide_search

BOTH = {name: [False, True] for name in SWITCHES}
SPACE = SearchSpace(virtual_stages=[1, 2, 3, 4, 6, 8, 12], micro_batch_size=[1, 2, 4, 8], zero_stage=[0, 1, 2, 3],
                    recompute=["none", "selective", "full"], sequence_parallel=[False, True],
                    schedule=["gpipe", "1f1b", "interleaved"], **BOTH)
SMALL = SearchSpace(virtual_stages=[1, 2], micro_batch_size=[1, 2], zero_stage=[0, 1],
                    recompute=["selective", "full"], sequence_parallel=[False, True], schedule=["1f1b", "interleaved"],
                    **BOTH)


def cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _num(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--small", action="store_true", help="a quick subset (tp within the node)")
    args = parser.parse_args()
    os.environ["CLUSTERSIM_CACHE"] = "0"
    space = SMALL if args.small else SPACE
    constraints = SearchConstraints(tp_within_node=args.small)
    wall0, cpu0 = time.perf_counter(), cpu_seconds()
    result = wide_search(None, num_gpus=1024, space=space, constraints=constraints, workers=args.workers,
                         log=lambda line: print(f"  [{time.perf_counter() - wall0:6.1f} s] {line}", flush=True))
    wall, cpu = time.perf_counter() - wall0, cpu_seconds() - cpu0
    c = result.counts
    feasible = c["evaluated"] - c["invalid"] - c["pruned_by_memory"]
    assert c["pruned_by_bound"] + c["timed"] == feasible
    print(f"GPT-3 175B on 1,024 A100s, Calculon-size space, {args.workers} workers, cache off")
    candidates = c["evaluated"] + c["folded_as_same_plan"]
    print(f"  {candidates:,} candidates ({c['bases']:,} layouts x overlap switches): {c['folded_as_same_plan']:,} "
          f"folded as the same plan as one kept (not priced), {c['invalid']:,} invalid, "
          f"{c['pruned_by_memory']:,} pruned by memory, {c['pruned_by_bound']:,} pruned by the step-time lower bound, "
          f"{c['timed']:,} timed: {c['engine_resimulated']:,} by the engine ({c['engine_runs']:,} runs: candidates "
          f"differing only in inert switches share one), {c['priced_by_fast_path']:,} by the fast path too "
          f"({c['fast_path_runs']:,} runs, beside the engine or after it for the top k)")
    print(f"  bounds priced by a planner: {c['bounds_priced']:,} (the rest combined from their parts)")
    print(f"  wall {wall:.1f} s, CPU {cpu:.1f} s (this process and its workers), load average "
          f"{os.getloadavg()[0]:.1f} at the end; "
          f"{candidates / wall:,.0f} candidates evaluated per wall second, "
          f"{c['priced_by_fast_path'] / wall:,.1f} priced per wall second")
    print("  phases (wall): " + ", ".join(f"{k} {v:.1f} s" for k, v in result.seconds.items()))
    for i, row in enumerate(result.top[:5], 1):
        p = row["parallelism"]
        print(f"  #{i}: tp {p['tp']} pp {p['pp']} vp {p['virtual_stages']} {p['schedule']} mbs {p['micro_batch_size']} "
              f"zero {p['zero_stage']} recompute {p['recompute']} sp {p['sequence_parallel']} "
              + " ".join(f"{k.replace('overlap_', 'ov_')}={int(p[k])}" for k in SWITCHES)
              + f": {row['step_time_s']:.3f} s (fast {_num(row['fast_step_time_s'])}, bound "
              f"{row['step_time_lower_bound_s']:.3f}), MFU {100 * row['mfu']:.1f}%")


if __name__ == "__main__":
    main()
