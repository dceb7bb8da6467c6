"""Benchmark: DAPPLE's planner (``clustersim plan --planner dapple``) against ``clustersim search``
on DAPPLE's five V100 profiles (AlibabaPAI/DAPPLE@fd75dcf profiling_results/, copied to
validation/data/profiles/dapple_*.txt): GNMT-16, BERT-24, VGG-19, AmoebaNet-18, XLNet-24.

    python benchmarks/bench_dapple_planner.py [--gpus 16] [--gpus-per-node 8] [--batch 256]

The cluster is DAPPLE's "Config A" (Fan et al. 2021 Sec. 6.1): 8 V100s per server on NVLink,
25 Gb/s Ethernet between servers (efficiencies and latencies ASSUMED). Prints per model: the
planner's plan, its simulated step, its CPU seconds and plans estimated / simulated; the step of
DAPPLE's own part (its partitioner, early backward with the warm-up K_i chosen by simulation), of
DAPPLE with the paper's K_i = S - i only (``max_extra_warmup=0``, one more planner run) and of the
extension (the simulator's schedule choice: interleaved 1F1B on DAPPLE's equal-replica plans;
simulator/explore/planners/dapple_schedules.py); the best step ``search`` finds among DAPPLE's
schedules (no virtual stages) and over its whole space, with their layouts and CPU seconds; and
the ratios. Exits 1 when DAPPLE's own part is slower than the best uniform layout of search's
whole space (the acceptance check of issue 22).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from simulator.explore.planners import get_planner
from simulator.explore.search import SearchSpace, search

PROFILES = Path(__file__).resolve().parents[1] / "validation" / "data" / "profiles"
MODELS = {  # name: (profile file, profiled batch, sample kind)
    "gnmt-16": ("dapple_gnmt-16-pbs-64.txt", 64, "sentence"),
    "bert-24": ("dapple_bert-24-pbs-6.txt", 6, "sequence"),
    "vgg-19": ("dapple_vgg-19-pbs-32.txt", 32, "image"),
    "amoebanet-18": ("dapple_amoeba-18-pbs-8.txt", 8, "image"),
    "xlnet-24": ("dapple_xlnet-24-pbs-1.txt", 1, "sequence"),
}


def scenario(model: str, gpus: int, per_node: int, batch: int) -> dict:
    path, profile_batch, sample = MODELS[model]
    node = {"name": f"v100x{per_node}-25gbe", "accelerator": "v100-sxm-32g", "gpus_per_node": per_node,
            "intra_node": {"kind": "nvswitch", "bandwidth_per_gpu_gb_per_s": 150, "latency_us": 3,
                           "collective_efficiency": 0.8, "supports_nvls": False, "source": "assumed"},
            "nics_per_node": 1, "nic_bandwidth_gbit_per_s": 25, "nic_efficiency": 0.9, "nic_latency_us": 10,
            "host_memory_gib": 488, "source": "DAPPLE Sec. 6.1 Config A; efficiencies assumed"}
    return {"name": model, "model": {"name": model, "family": "profile", "format": "pipedream",
                                     "path": str(PROFILES / path), "profile_batch": profile_batch, "sample_kind": sample},
            "cluster": {"node": node, "num_gpus": gpus}, "parallelism": {"global_batch_size": batch},
            "training": {"precision": "fp32"}}


def best_row(raw: dict, space: SearchSpace | None):
    started = time.process_time()
    rows = search(raw, workers=1, space=space)
    cpu = time.process_time() - started
    row = min((r for r in rows if r.get("fits") and r.get("step_time_s")), key=lambda r: r["step_time_s"])
    p = row["parallelism"]
    return row["step_time_s"], f"pp{p['pp']} dp{p['dp']} v{p['virtual_stages']} mbs{p['micro_batch_size']} " \
                               f"zero{p['zero_stage']}", cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=16)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()
    failed = False
    for model in MODELS:
        raw = scenario(model, args.gpus, args.gpus_per_node, args.batch)
        started = time.process_time()
        found = get_planner("dapple").run(raw, {})
        cpu = time.process_time() - started
        step_1f1b, layout_1f1b, cpu_1f1b = best_row(raw, SearchSpace(virtual_stages=[1]))
        step_all, layout_all, cpu_all = best_row(raw, None)
        paper = get_planner("dapple").run(raw, {"max_extra_warmup": 0, "max_virtual_stages": 1})
        extension = found.details.get("extension_step_s")
        print(f"{model}: planner {found.step_time_s:.5f} s in {cpu:.2f} CPU-s "
              f"({found.plans_estimated} estimated, {found.plans_simulated} simulated) -- {found.summary}")
        print(f"  DAPPLE's part {found.details['dapple_step_s']:.5f} s; with the paper's K_i = S - i only "
              f"{paper.step_time_s:.5f} s ({paper.summary}); extension (interleaved) "
              + (f"{extension:.5f} s" if extension is not None else "none"))
        print(f"  search 1F1B/GPipe best {step_1f1b:.5f} s ({layout_1f1b}, {cpu_1f1b:.1f} CPU-s): "
              f"planner / search = {found.step_time_s / step_1f1b:.3f}")
        print(f"  search whole space best {step_all:.5f} s ({layout_all}, {cpu_all:.1f} CPU-s): "
              f"planner / search = {found.step_time_s / step_all:.3f}, DAPPLE's part / search = "
              f"{found.details['dapple_step_s'] / step_all:.3f}, with K_i = S - i / search = "
              f"{paper.step_time_s / step_all:.3f}")
        failed |= found.details["dapple_step_s"] > step_all * (1 + 1e-9)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
