"""simulate.time_breakdown charges an idle gap along what it waited for; the time a waited-for task sat queued behind
its own stream after its dependency ended is that task's own (simulate._charge_gap). Before, it went to the
dependency: on DGX B200 a GPT-3 20B step (NeMo's H100 row 1 layout, tp 2, dp 32 over 8 nodes) charged 0.119 s of
the last gradient reduce-scatter's queue (44 per-layer reduce-scatters over InfiniBand) to tp_comm, whose collectives
ran 0.6 ms in all (validation/blackwell_nemo.py found it)."""

from __future__ import annotations

from collections import defaultdict

from simulator.scenario import load_scenario
from simulator.simulate import simulate

SCENARIO = {
    "model": "gpt3-20b", "cluster": {"node": "dgx-b200", "fabric": "fat-tree", "num_gpus": 64},
    "parallelism": {"tp": 2, "pp": 1, "dp": "auto", "sequence_parallel": True, "tp_comm_overlap": True,
                    "zero_stage": 1, "micro_batch_size": 2, "global_batch_size": 256, "overlap_grad_reduce": True,
                    "overlap_param_gather": True},
    "training": {"seq_length": 2048, "precision": "fp8", "attention": "flash", "framework": "nemo"},
}


def test_a_queued_collective_is_charged_to_its_own_category():
    result = simulate(load_scenario(SCENARIO), run_if_oom=True, fold=False)
    busy: dict[str, float] = defaultdict(float)
    for e in result.timeline:
        busy[e.category] += e.end_s - e.start_s
    b = result.time_breakdown_s
    assert b["tp_comm"] <= busy["tp_comm"] + 1e-9          # exposed TP time within what the TP collectives ran
    assert b["dp_comm"] > 0.2                               # the reduce-scatters' tail and the first gather
    assert abs(sum(b.values()) - result.step_time_s) < 1e-9
