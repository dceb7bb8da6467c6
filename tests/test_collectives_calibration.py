"""Collectives inside a node fitted on nccl-tests rows (validation/calibrate_collectives.py), NVLS,
the xGMI mesh, the 72-GPU NVLink domain of GB200/GB300 NVL72 and the rail-optimised fabric."""

import subprocess
import sys

import pytest

from hardware_specs.catalog import FABRICS, NODES
from hardware_specs.schema import FatTree
from simulator.cost.collectives import bus_bytes, collective_cost
from simulator.cost.topology import Placement, Topology
from validation import calibrate_collectives as cc

# Held-out half (odd md5 of the row key): A100, H200, B200 and MI300X rows, 32 KiB - 16 GiB, 2-8 GPUs.
# The worst rows sit at NCCL's protocol switch (2-16 MiB) that two alpha-beta lines only approximate.
MEDIAN, WORST, LARGE = cc.MEDIAN, cc.WORST, cc.LARGE   # 8% / 30% / 15%; LARGE: every held-out row of 64 MiB or more


def test_heldout_rows_within_tolerance():
    table = cc.heldout_table()
    assert len(table) >= 30
    errors = table.error.abs()
    assert errors.median() <= MEDIAN, table.to_string()
    assert errors.max() <= WORST, table.to_string()
    assert table[table.message_bytes >= 2**26].error.abs().max() <= LARGE, table.to_string()
    assert {"dgx-a100-80g", "hgx-h200", "dgx-b200", "mi300x-8"} <= set(table.node)


def test_fit_uses_only_fit_rows_and_catalog_holds_it():
    heldout = {r.row for r in cc.rows() if r.heldout}
    for name in cc.calibrated_nodes():
        f = cc.fit(cc.law_source(name))
        assert not set(f.rows) & heldout
        node = NODES.get(name)
        block = cc.block(name)
        for collective, law in node.intra_node_measured.items():
            expected = block["intra_node_measured"][collective]
            assert law.bus_bandwidth_gb_per_s == expected["bus_bandwidth_gb_per_s"], (name, collective)
            assert law.latency_per_step_us == expected["latency_per_step_us"]
            assert "collectives_bandwidth.csv" in law.fitted_on
        if name != cc.law_source(name):
            assert "transferred from" in node.intra_node_measured["all_reduce"].fitted_on
    assert "dgx-a100-80g" not in cc.calibrated_nodes()  # fitted and checked, not written (see NOT_WRITTEN)


def _links(node_name: str, gpus: int):
    node = NODES.get(node_name)
    return node, Topology(node, FABRICS.get("fat-tree"), gpus).links


def test_nvls_beats_the_ring_on_large_all_reduces_and_grows_with_the_group():
    node, links = _links("hgx-h200", 8)
    nvls = node.nvls_all_reduce
    size = 8 * 2**30
    busbw = {}
    for n in (5, 6, 8):
        cost = collective_cost("all_reduce", size, Placement(tuple(range(n)), n, 1, 1), links, node.intra_laws,
                               None, nvls)
        assert cost.algorithm == "nvls"
        t = cost.isolated_time_s(links)
        # hand-derived: latency + S / bandwidth, bus bandwidth 2(n-1)/n * S / t
        assert t == pytest.approx(nvls.latency_us * 1e-6 + size / (nvls.bandwidth_gb_per_s * 1e9), rel=1e-9)
        busbw[n] = bus_bytes("all_reduce", size, n) / t
    assert busbw[5] < busbw[6] < busbw[8]
    ring = collective_cost("all_reduce", size, Placement(tuple(range(4)), 4, 1, 1), links, node.intra_laws, None, nvls)
    assert ring.algorithm.startswith("measured")   # below min_gpus NCCL keeps the ring
    assert nvls.min_gpus == 5


def test_low_latency_protocol_takes_small_messages():
    node, links = _links("hgx-h200", 8)
    place = Placement(tuple(range(8)), 8, 1, 1)
    small = collective_cost("all_reduce", 32 * 2**10, place, links, node.intra_laws)
    large = collective_cost("all_reduce", 2**30, place, links, node.intra_laws)
    assert small.algorithm == "measured_ll" and large.algorithm == "measured"


def test_xgmi_mesh_group_uses_only_its_links():
    # 2 MI300X GPUs drive 1 of 7 links: the bytes take 7x longer than the node-wide rate
    node, links = _links("mi300x-8", 8)
    law = node.intra_laws["all_reduce"]
    size = 2**30
    two = collective_cost("all_reduce", size, Placement((0, 1), 2, 1, 1), links, node.intra_laws, mesh_peers=7)
    bytes_s = two.bytes_by_link["nvl"] / links.intra_bytes_per_s
    assert bytes_s == pytest.approx(7 * bus_bytes("all_reduce", size, 2) / (law.bus_bandwidth_gb_per_s * 1e9))


def test_nvl72_rack_is_one_nvlink_domain():
    node = NODES.get("gb200-nvl72")
    assert node.gpus_per_node == 4 and node.domain_gpus == 72
    topo = Topology(node, FABRICS.get("fat-tree"), 144)
    inside = topo.placement(tuple(range(16)))          # 4 trays, one rack: NVLink
    assert (inside.num_nodes, inside.members_per_node) == (1, 16)
    across = topo.placement((70, 71, 72, 73))          # two racks: the NICs
    assert across.num_nodes == 2
    cost = collective_cost("all_reduce", 2**28, inside, topo.links, node.intra_laws, None, node.nvls_all_reduce)
    assert set(cost.bytes_by_link) == {"nvl"}
    # on 8-GPU HGX nodes the same 16 ranks span two nodes and cross the NICs
    hgx = Topology(NODES.get("hgx-b200"), FABRICS.get("fat-tree"), 144).placement(tuple(range(16)))
    assert hgx.num_nodes == 2
    # a tray's NICs are its own: 4 x 400 Gb/s for 4 GPUs
    assert topo.links.inter_bytes_per_s == pytest.approx(50e9 * 0.94)


def test_rail_optimized_fabric_hops():
    node = NODES.get("dgx-h100")
    rail = FABRICS.get("rail-optimized")
    inside = Topology(node, rail, 32 * 8).links
    beyond = Topology(node, rail, 33 * 8).links
    fat = Topology(node, FatTree(name="t", levels=3, switch_latency_us=0.6, source="test"), 32 * 8).links
    # hand-derived: NIC 5 us + 1 leaf (0.6 us) inside a unit; + leaf-spine-leaf (1.8 us) between; fat tree 5 hops
    assert inside.inter_latency_s == pytest.approx(5.6e-6)
    assert beyond.inter_latency_s == pytest.approx(6.8e-6)
    assert fat.inter_latency_s == pytest.approx(8.0e-6)


def test_cli_simulates_on_nvl72_and_rail_fabric_and_rejects_a_bad_fabric():
    base = [sys.executable, "-m", "simulator", "simulate", "examples/gpt3-175b-fp8-512-h100.yaml"]
    ok = subprocess.run(base + ["--set", "cluster.node=gb200-nvl72", "--set", "cluster.num_gpus=576",
                                "--set", "parallelism.global_batch_size=1152", "--set", "cluster.fabric=rail-optimized"],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "step time" in ok.stdout
    bad = subprocess.run(base + ["--set", "cluster.fabric={topology: rail-optimized, name: x, source: y}"],
                         capture_output=True, text=True)
    assert bad.returncode == 2
    assert "cluster.fabric" in bad.stderr and "Traceback" not in bad.stderr
