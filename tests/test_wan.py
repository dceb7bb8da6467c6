"""Wide-area fabrics (hardware_specs/schema.py WideArea, simulator/cost/wan.py): exact timelines on toy
two-region clusters, symmetric vs full mode, bad input through the CLI, the example through
simulate / sweep / search."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hardware_specs.schema import Node, WideArea
from simulator.cost.collectives import collective_cost
from simulator.cost.topology import build_topology
from simulator.cost.wan import WanTopology, cold_start_s
from simulator.engine.engine import Engine, Task
from simulator.scenario import load_scenario
from simulator.simulate import simulate

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "gpt-1.7b-two-regions-wan.yaml"
SWEEP = ROOT / "examples" / "sweeps" / "two-regions-wan-bandwidth.yaml"
MB64 = 64 * 2**20
DELAY_S = 0.025
WAN_BYTES_PER_S = 1e9  # 8 Gb/s


def toy_node(gpus: int = 1) -> dict:
    """A node whose NIC (400 Gb/s) is far faster than the wide-area link: the WAN is the bottleneck."""
    return {"name": "toy", "accelerator": "a100-sxm-80g", "gpus_per_node": gpus,
            "intra_node": {"kind": "nvswitch", "bandwidth_per_gpu_gb_per_s": 300, "latency_us": 0,
                           "collective_efficiency": 1.0, "source": "toy"},
            "nics_per_node": gpus, "nic_bandwidth_gbit_per_s": 400, "nic_efficiency": 1.0, "nic_latency_us": 0,
            "host_memory_gib": 512, "source": "toy"}


def toy_wan(**extra) -> dict:
    return {"topology": "wan", "name": "toy", "regions": [{"name": "a", "nodes": 1}, {"name": "b", "nodes": 1}],
            "delay_ms": [[0, DELAY_S * 1e3], [DELAY_S * 1e3, 0]], "bandwidth_gbit_per_s": [[0, 8], [8, 0]],
            "source": "toy", **extra}


def topology(gpus_per_node: int = 1, **extra) -> WanTopology:
    topo = build_topology(Node.model_validate(toy_node(gpus_per_node)), WideArea.model_validate(toy_wan(**extra)),
                          2 * gpus_per_node)
    assert isinstance(topo, WanTopology)
    return topo


def send(topo: WanTopology, src: int, dst: int, nbytes: float, name: str) -> Task:
    demands, propagation = topo.send(f"r{src}", src, f"r{dst}", dst, nbytes)
    return Task(name, f"r{src}", "pp", "pp_comm", demands=demands, propagation_s=propagation)


def test_a_64mb_send_takes_the_delay_plus_bytes_over_bandwidth():
    topo = topology()
    task = send(topo, 0, 1, MB64, "x")
    end = Engine(topo.port_capacity).run({("r0", "pp"): [task]})
    assert end == pytest.approx(DELAY_S + MB64 / WAN_BYTES_PER_S, rel=1e-12)
    assert task.start_s == 0 and task.end_s == pytest.approx(end, rel=1e-12)


def test_two_flows_on_one_pair_link_share_it_and_the_reverse_direction_is_its_own():
    topo = topology(gpus_per_node=2)  # ranks 0, 1 in region a; 2, 3 in region b
    first, second, back = send(topo, 0, 2, MB64, "x"), send(topo, 1, 3, MB64, "y"), send(topo, 2, 0, MB64, "z")
    Engine(topo.port_capacity).run({("r0", "pp"): [first], ("r1", "pp"): [second], ("r2", "pp"): [back]})
    shared = DELAY_S + 2 * MB64 / WAN_BYTES_PER_S
    assert first.end_s == pytest.approx(shared, rel=1e-12)
    assert second.end_s == pytest.approx(shared, rel=1e-12)
    assert back.end_s == pytest.approx(DELAY_S + MB64 / WAN_BYTES_PER_S, rel=1e-12)


def test_back_to_back_sends_overlap_their_delays_but_not_their_bytes():
    topo = topology()
    first, second = send(topo, 0, 1, MB64, "x"), send(topo, 0, 1, MB64, "y")
    after = Task("compute", "r1", "compute", "compute", duration_s=0.001, deps=[second])
    end = Engine(topo.port_capacity).run({("r0", "pp"): [first, second], ("r1", "compute"): [after]})
    assert first.end_s == pytest.approx(DELAY_S + MB64 / WAN_BYTES_PER_S, rel=1e-12)
    assert second.end_s == pytest.approx(DELAY_S + 2 * MB64 / WAN_BYTES_PER_S, rel=1e-12)
    assert after.start_s == pytest.approx(second.end_s, rel=1e-12)
    assert end == pytest.approx(second.end_s + 0.001, rel=1e-12)


def test_a_connection_window_caps_one_flow_at_window_over_round_trip():
    transport = {"name": "tcp", "window_bytes": 1e6, "source": "toy"}
    topo = topology(transport=transport)
    task = send(topo, 0, 1, MB64, "x")
    end = Engine(topo.port_capacity).run({("r0", "pp"): [task]})
    rate = 1e6 / (2 * DELAY_S)  # 20 MB/s: far below the link's 1 GB/s
    assert end == pytest.approx(DELAY_S + MB64 / rate, rel=1e-12)


def test_cold_start_is_slow_start_rounds_to_the_bandwidth_delay_product():
    from hardware_specs.schema import WanTransport

    transport = WanTransport(name="tcp", initial_window_bytes=1e5, source="toy")
    # BDP = 1 GB/s x 50 ms = 50 MB = 2^9 initial windows (approximately): log2(500) - 1 round trips
    assert cold_start_s(transport, 0.05, 1e9) == pytest.approx(0.05 * (__import__("math").log2(500) - 1))
    assert cold_start_s(None, 0.05, 1e9) == 0.0


def test_an_all_reduce_across_two_regions_pays_its_steps_at_the_delay_and_crosses_each_pair_once():
    topo = topology()
    placement = topo.placement((0, 1))
    base = collective_cost("all_reduce", MB64, placement, topo.links)
    cost = topo.over_wan(base, "all_reduce", MB64, (0, 1))
    assert cost.latency_s == pytest.approx(base.latency_s + 2 * DELAY_S)  # 2(n-1) = 2 steps of one delay
    assert cost.bytes_by_link["wan:0>1"] == cost.bytes_by_link["wan:1>0"] == MB64  # bus = 2(n-1)/n S = S
    assert cost.isolated_time_s(topo.links) == pytest.approx(base.latency_s + 2 * DELAY_S + MB64 / WAN_BYTES_PER_S)


def test_the_links_form_gives_the_same_matrices_as_the_matrix_form():
    links = WideArea.model_validate({
        "topology": "wan", "name": "x", "regions": [{"name": "a", "nodes": 1}, {"name": "b", "nodes": 1}],
        "links": [{"src": "a", "dst": "b", "delay_ms": 25, "bandwidth_gbit_per_s": 8}], "source": "toy"})
    assert links.pair_matrices() == ([[0.0, 25], [25, 0.0]], [[float("inf"), 8], [8, float("inf")]])


PIPELINE = {
    "name": "wan-pipeline",
    "model": {"name": "toy", "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 8, "vocab_size": 32000,
              "seq_length": 1024},
    "cluster": {"node": toy_node(2), "num_gpus": 4, "fabric": toy_wan()},
    "parallelism": {"tp": 2, "pp": 2, "micro_batch_size": 1, "global_batch_size": 4, "schedule": "1f1b"},
}


def test_symmetric_and_full_mode_agree_on_a_pipeline_across_two_regions():
    scenario = load_scenario(PIPELINE)
    symmetric, full = simulate(scenario, mode="symmetric"), simulate(scenario, mode="full")
    assert symmetric.step_time_s == pytest.approx(full.step_time_s, rel=1e-9)
    # the sends cross the WAN: the step is longer than the same cluster in one region
    one_region = load_scenario({**PIPELINE, "cluster": {**PIPELINE["cluster"], "fabric": "fat-tree"}})
    assert symmetric.step_time_s > simulate(one_region).step_time_s + 2 * DELAY_S  # one crossing each way at least


def test_fast_path_agrees_with_the_engine_on_the_wan_pipeline():
    scenario = load_scenario(PIPELINE)
    assert simulate(scenario, engine="fast").step_time_s == pytest.approx(simulate(scenario).step_time_s, rel=1e-9)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simulator.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.parametrize(("override", "field", "reason"), [
    ("cluster.fabric.delay_ms=[[0, 67], [67]]", "cluster.fabric.delay_ms", "square"),
    ("cluster.fabric.delay_ms=[[0, -1], [67, 0]]", "cluster.fabric.delay_ms", "negative"),
    ("cluster.fabric.bandwidth_gbit_per_s=[[0, 0], [1, 0]]", "cluster.fabric.bandwidth_gbit_per_s", "positive"),
    ("cluster.fabric.regions=[{name: a, nodes: 1}, {name: b, nodes: 2}]", "cluster.fabric.regions", "4"),
    ("cluster.fabric.regions=[{name: a, nodes: 2}, {name: a, nodes: 2}]", "cluster.fabric.regions", "unique"),
])
def test_bad_wan_input_exits_2_naming_the_field(tmp_path, override, field, reason):
    done = _cli("simulate", str(EXAMPLE), "--set", override, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("clustersim: error: ") and field in lines[0] and reason in lines[0]


def test_the_two_region_example_runs_in_simulate_sweep_and_search(tmp_path):
    done = _cli("simulate", str(EXAMPLE), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    swept = _cli("sweep", str(SWEEP), "--out", str(tmp_path / "wan.csv"), cwd=tmp_path)
    assert swept.returncode == 0, swept.stderr
    import pandas as pd

    rows = pd.read_csv(tmp_path / "wan.csv")
    assert len(rows) == 4 and (rows.status == "ok").all()
    by_bandwidth = rows.groupby(rows["cluster.fabric.bandwidth_gbit_per_s"].astype(str)).step_time_s.max()
    assert by_bandwidth["[[0, 10], [10, 0]]"] < by_bandwidth["[[0, 0.79], [0.79, 0]]"]
    searched = _cli("search", str(EXAMPLE), "--space", "tp=8", "--space", "pp=2,4", "--space", "micro_batch_size=4",
                    "--space", "recompute=none", "--space", "zero_stage=0", "--no-cache", "--workers", "1", cwd=tmp_path)
    assert searched.returncode == 0, searched.stderr
    assert "2 simulated" in searched.stdout or "simulated" in searched.stdout


def test_a_kind_that_builds_its_own_topology_refuses_the_wan_fabric_naming_it(tmp_path):
    """Kinds outside the spmd planner price traffic on a data-centre fabric: exit 2, not a traceback."""
    matrix = "[[0, 5], [5, 0]]"
    done = _cli("simulate", str(ROOT / "examples" / "gnmt16-dapple-v100.yaml"), "--set",
                f"cluster.fabric={{topology: wan, name: x, delay_ms: {matrix}, bandwidth_gbit_per_s: {matrix}, source: t}}",
                cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("clustersim: error: cluster.fabric: ") and "Traceback" not in done.stderr
