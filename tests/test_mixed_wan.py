"""Node groups on a wide-area fabric (issue 21): a mixed cluster whose groups sit in different regions.

Exact timelines on the toy of tests/test_mixed_clusters.py (one node of a fast GPU, one of a GPU
half as fast with half the NIC rate) with region a holding the fast node and region b the slow one,
joined by the pair link of tests/test_wan.py (25 ms one way, 8 Gb/s = 1 GB/s): the wide-area link,
not either NIC, is the bottleneck, so a transfer between the two takes the delay plus bytes over the
link's bandwidth, and the slower rank's compute sets when it starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_mixed_clusters import SLOW, TOY, _events, _node, _with

from simulator.scenario import gradient_bytes, load_scenario
from simulator.simulate import simulate
from simulator.strategies.spmd.plan import Planner

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "mixed-a100-t4-two-regions-wan.yaml"
DELAY_S = 0.025
WAN_BYTES_PER_S = 1e9  # 8 Gb/s
NIC_LATENCY_S = 10e-6  # the toy nodes' NIC latency (the intra-region fabric has no switch latency)
WAN = {"topology": "wan", "name": "toy", "regions": [{"name": "a", "nodes": 1}, {"name": "b", "nodes": 1}],
       "delay_ms": [[0, DELAY_S * 1e3], [DELAY_S * 1e3, 0]], "bandwidth_gbit_per_s": [[0, 8], [8, 0]],
       "intra_region": {"name": "toy", "levels": 1, "switch_latency_us": 0, "source": "toy"}, "source": "toy"}
MIXED_WAN = _with(TOY, cluster={**TOY["cluster"], "fabric": WAN})


def test_groups_fill_the_regions_in_rank_order():
    planner = Planner(load_scenario(MIXED_WAN))
    topo = planner.topo
    assert [topo.region_of(r) for r in (0, 1)] == [0, 1]
    assert topo.node_spec(0).name == "fast" and topo.node_spec(1).name == "slow"


def test_data_parallel_step_is_the_slower_rank_then_the_all_reduce_across_the_pair_link():
    result = simulate(load_scenario(MIXED_WAN))
    ev = _events(result)
    fast_b, slow_f, slow_b = ev[("rank0", "B.mb0.c0.compute")], ev[("rank1", "F.mb0.c0.compute")], \
        ev[("rank1", "B.mb0.c0.compute")]
    assert slow_b[1] > fast_b[1]
    reduce0, reduce1 = ev[("rank0", "grads.dp_grad_all_reduce")], ev[("rank1", "grads.dp_grad_all_reduce")]
    # the all-reduce starts when the slower rank's backward ends, for both ranks
    assert reduce0 == reduce1 and reduce0[0] == pytest.approx(slow_b[1], rel=1e-12)
    # 2 ranks in 2 regions: 2(n-1) = 2 ring steps, each a NIC hop and one wide-area delay, and the bus
    # volume 2(n-1)/n S = S of fp16 gradients over the 1 GB/s pair link (slower than either NIC)
    sc = load_scenario(MIXED_WAN)
    grad_bytes = Planner(sc).stage_params_local(0) * gradient_bytes(sc.training)
    reduce_s = 2 * NIC_LATENCY_S + 2 * DELAY_S + grad_bytes / WAN_BYTES_PER_S
    assert reduce0[1] - reduce0[0] == pytest.approx(reduce_s, rel=1e-9)
    slow_opt = ev[("rank1", "optimizer_step")]
    assert result.step_time_s == pytest.approx(slow_opt[1], rel=1e-12)
    assert result.step_time_s == pytest.approx(
        (slow_f[1] - slow_f[0]) + (slow_b[1] - slow_b[0]) + reduce_s + (slow_opt[1] - slow_opt[0]), rel=1e-9)
    # the same cluster in one data centre: the all-reduce at the slower NIC (tests/test_mixed_clusters.py)
    one_site = simulate(load_scenario(TOY)).step_time_s
    assert result.step_time_s - one_site == pytest.approx(
        2 * DELAY_S + grad_bytes / WAN_BYTES_PER_S - grad_bytes / 5e9, rel=1e-9)


def test_a_pipeline_send_from_the_fast_region_to_the_slow_one_takes_delay_plus_bytes_over_bandwidth():
    raw = _with(MIXED_WAN, parallelism={"pp": 2, "global_batch_size": 1, "micro_batch_size": 1})
    sc = load_scenario(raw)
    result = simulate(sc)
    ev = _events(result)
    f0, send, f1 = ev[("rank0", "F.mb0.c0.compute")], ev[("rank0", "send_act.mb0.c0")], ev[("rank1", "F.mb0.c1.compute")]
    act_bytes = 1 * sc.model.seq_length * sc.model.hidden_size * 2  # micro-batch x sequence x hidden, fp16
    assert send[0] == pytest.approx(f0[1], rel=1e-12)
    assert send[1] - send[0] == pytest.approx(DELAY_S + act_bytes / WAN_BYTES_PER_S, rel=1e-9)
    assert f1[0] == pytest.approx(send[1], rel=1e-12)
    planner = Planner(sc)
    ops1 = tuple(op for op in planner._chunk_ops("F", 1) if op.kind != "collective")
    assert f1[1] - f1[0] == pytest.approx(2 * planner.computes[0].ops_time_s(ops1), rel=1e-12)  # the slow GPU


@pytest.mark.parametrize("parallelism", [
    {},
    {"pp": 2},
    {"tp": 2},
])
def test_symmetric_mode_equals_full_mode_on_a_mixed_cluster_across_regions(parallelism):
    """Two nodes of 2 fast GPUs in region a, two of 2 slow GPUs in region b."""
    cluster = {"groups": [{"node": _node("fast2", 1.0, 80, gpus=2), "nodes": 2},
                          {"node": _node("slow2", 0.5, 40, gpus=2), "nodes": 2}],
               "fabric": {**WAN, "regions": [{"name": "a", "nodes": 2}, {"name": "b", "nodes": 2}]}}
    raw = _with(TOY, cluster=cluster, parallelism={"global_batch_size": 8, "overlap_grad_reduce": True, **parallelism})
    sc = load_scenario(raw)
    symmetric, full = simulate(sc, mode="symmetric"), simulate(sc, mode="full")
    assert symmetric.step_time_s == pytest.approx(full.step_time_s, rel=1e-9)
    assert symmetric.step_time_s > DELAY_S  # something crosses the pair link
    # the fast path is exact where no two transfers share a port at once; with pp 2 the replicas' sends share
    # the pair link and it approximates the contention (simulator/strategies/spmd/fast.py: within 3%)
    fast = simulate(sc, mode="symmetric", engine="fast").step_time_s
    assert fast == pytest.approx(full.step_time_s, rel=0.03 if parallelism.get("pp", 1) > 1 else 1e-9)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simulator.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_the_a100_t4_two_region_example_runs_in_simulate(tmp_path):
    """A100 nodes in Virginia, T4 nodes in Oregon, GPT-1.7B pp 2: the stages' sends cross the link."""
    done = _cli("simulate", str(EXAMPLE), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "pp_comm" in done.stdout and "ASSUMED" in done.stdout
    one_site = _cli("simulate", str(ROOT / "examples" / "mixed-a100-t4.yaml"), "--json", cwd=tmp_path)
    across = _cli("simulate", str(EXAMPLE), "--json", cwd=tmp_path)
    import json

    assert json.loads(across.stdout)["step_time_s"] > json.loads(one_site.stdout)["step_time_s"] + 4 * 0.067


@pytest.mark.parametrize(("override", "field", "reason"), [
    # the regions must hold the groups' nodes (2 A100 + 4 T4 = 6), not the GPUs or one group's nodes
    ("cluster.fabric.regions=[{name: virginia, nodes: 2}, {name: oregon, nodes: 2}]", "cluster.fabric.regions",
     "the cluster has 6"),
    # a per-node matrix (no regions) needs one row per node of every group
    ("cluster.fabric.regions=null", "cluster.fabric.delay_ms", "6 nodes"),
    # kinds that price every device on one kind of node refuse the groups before the fabric
    ("strategy={kind: parameter_server}", "cluster.groups", "one kind of node"),
])
def test_what_cannot_be_modelled_exits_2_naming_the_field(tmp_path, override, field, reason):
    done = _cli("simulate", str(EXAMPLE), "--set", override, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"clustersim: error: {field}: ") and reason in lines[0], lines
    assert "Traceback" not in done.stderr


def test_a_slow_group_alone_across_the_regions_has_the_mixed_step():
    """Two slow nodes across the regions: the same step as fast + slow (the fast rank only waits)."""
    slow_only = _with(MIXED_WAN, cluster={**MIXED_WAN["cluster"], "groups": [{"node": SLOW, "nodes": 2}]})
    assert simulate(load_scenario(slow_only)).step_time_s == pytest.approx(
        simulate(load_scenario(MIXED_WAN)).step_time_s, rel=1e-12)
