"""Benchmark: PaSE's planner (``clustersim plan --planner pase``) on PaSE's 32-GPU setting: four
servers of 8 GTX 1080 Ti or RTX 2080 Ti on PCIe, InfiniBand EDR between (Elango 2021 Sec. VI;
hardware_specs/nodes/{gtx1080ti,rtx2080ti}-server-8.yaml, their efficiencies ASSUMED).

    python benchmarks/bench_pase_planner.py [--batch 256]

Per model (VGG-16 for PaSE's AlexNet-like CNN, Inception-V3, ResNet-50, GNMT-16 for its RNN,
BERT-large for its Transformer; fp32) and cluster: the plan's splits, its simulated step, pure
data parallelism's, the speed-up, the speed-up of the plan of PaSE's own objective (gradient
weight 1) and the weight whose plan was returned (simulator/explore/planners/pase.py: the DP
proposes, the simulator disposes), the DP's table size, and the planner's CPU seconds. Exits 1 when a
speed-up is not in (1, paper's maximum] (1.85x on 1080 Ti, 4x on 2080 Ti) or a plan does not fit.
"""

from __future__ import annotations

import argparse
import sys
import time

from simulator.explore.planners import get_planner

PAPER_MAX = {"gtx1080ti-server-8": 1.85, "rtx2080ti-server-8": 4.0}
MODELS = {"vgg16": 256, "inception-v3": 256, "resnet50": 256, "gnmt-16": 256, "bert-large": 64}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()
    failed = False
    for node, top in PAPER_MAX.items():
        for model in args.models.split(","):
            batch = MODELS[model]
            raw = {"name": model, "model": model, "cluster": {"node": node, "num_gpus": 32},
                   "parallelism": {"global_batch_size": batch, "micro_batch_size": batch // 32},
                   "training": {"precision": "fp32"}}
            started = time.process_time()
            found = get_planner("pase").run(raw, {})
            cpu = time.process_time() - started
            d = found.details
            speedup = d["speedup_over_data_parallel"]
            ok = found.step_time_s is not None and 1.0 < speedup <= top
            failed |= not ok
            print(f"{node} {model} (batch {batch}): {found.summary}")
            print(f"  plan {found.step_time_s} s vs data parallel {d['data_parallel_step_s']} s: {speedup:.3f}x "
                  f"(paper: up to {top}x) {'ok' if ok else 'OUT OF RANGE'}; PaSE's objective's plan "
                  f"{d['pase_objective_speedup']:.3f}x, returned the plan of gradient weight "
                  f"{d['chosen_gradient_weight']}; DP table {d['dp_table_entries']} entries, "
                  f"dependent set <= {d['max_dependent_set']}; {cpu:.1f} CPU-s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
