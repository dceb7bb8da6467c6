"""α-β collective costs (simulator/cost/collectives.py) on toy node/fabric specs with round numbers.

Toy node: 8 GPUs, intra-node link B_nvl = 100 GB/s per GPU per direction, collective
efficiency 1.0, latency α_nvl = 2 us; 4 NICs of 400 Gb/s (50 GB/s) each at efficiency 1.0,
so each GPU's NIC share is 4·50/8 = 25 GB/s; NIC latency 5 us. Fabric: 1 tier (2·1-1 = 1
switch hop) of 1 us, so one inter-node hop costs α_net = 5 + 1 = 6 us.
"""

from __future__ import annotations

import math

import pytest

from hardware_specs.schema import AlphaBeta, FatTree, Node
from simulator.cost.collectives import bus_bytes, collective_cost
from simulator.cost.topology import Placement, Topology

GB = 1e9
B_NVL = 100 * GB
B_NIC = 25 * GB          # 4 NICs x 400 Gb/s / 8 bit / 8 GPUs
A_NVL = 2e-6
A_NET = 6e-6             # nic 5 us + 1 switch hop x 1 us
S = 64e6                 # payload bytes


def _node(**changes) -> Node:
    intra = dict(kind="nvswitch", bandwidth_per_gpu_gb_per_s=100, latency_us=2, collective_efficiency=1.0,
                 source="toy")
    intra.update(changes.pop("intra", {}))
    data = dict(name="toy-node", accelerator="a100-sxm-80g", gpus_per_node=8, intra_node=intra,
                nics_per_node=4, nic_bandwidth_gbit_per_s=400, nic_efficiency=1.0, nic_latency_us=5,
                host_memory_gib=1, source="toy")
    data.update(changes)
    return Node.model_validate(data)


def _fabric(**changes) -> FatTree:
    data = dict(name="toy-fabric", levels=1, switch_latency_us=1, source="toy")
    data.update(changes)
    return FatTree.model_validate(data)


def _topo(num_gpus: int, node: Node | None = None, fabric: FatTree | None = None) -> Topology:
    return Topology(node or _node(), fabric or _fabric(), num_gpus)


def test_toy_links():
    links = _topo(16).links
    assert links.intra_bytes_per_s == pytest.approx(B_NVL, rel=1e-12)
    assert links.inter_bytes_per_s == pytest.approx(B_NIC, rel=1e-12)
    assert links.uplink_bytes_per_s == pytest.approx(B_NIC, rel=1e-12)  # oversubscription 1
    assert links.intra_latency_s == pytest.approx(A_NVL, rel=1e-12)
    assert links.inter_latency_s == pytest.approx(A_NET, rel=1e-12)


def test_bus_factors():
    assert bus_bytes("all_reduce", S, 4) == pytest.approx(2 * 3 / 4 * S)
    assert bus_bytes("all_gather", S, 4) == pytest.approx(3 / 4 * S)
    assert bus_bytes("reduce_scatter", S, 8) == pytest.approx(7 / 8 * S)
    assert bus_bytes("broadcast", S, 8) == S
    assert bus_bytes("all_reduce", S, 1) == 0.0


def test_ring_all_reduce_inside_one_node():
    # n = 4 GPUs of node 0: time = 2(n-1)/n · S/B + 2(n-1)·α = 1.5 · 64e6/100e9 + 6 · 2 us
    #                      = 0.96 ms + 12 us = 0.972 ms.
    topo = _topo(8)
    placement = topo.placement((0, 1, 2, 3))
    assert (placement.size, placement.members_per_node, placement.num_nodes, placement.num_pods) == (4, 4, 1, 1)
    cost = collective_cost("all_reduce", S, placement, topo.links)
    assert cost.algorithm == "ring"
    assert cost.bytes_by_link == pytest.approx({"nvl": 1.5 * S})
    assert cost.latency_s == pytest.approx(6 * A_NVL, rel=1e-12)
    assert cost.isolated_time_s(topo.links) == pytest.approx(1.5 * S / B_NVL + 6 * A_NVL, rel=1e-12)
    assert cost.isolated_time_s(topo.links) == pytest.approx(0.972e-3, rel=1e-12)


@pytest.mark.parametrize("collective", ["all_gather", "reduce_scatter"])
def test_all_gather_and_reduce_scatter_inside_one_node(collective):
    # n = 4: (n-1)/n · S/B + (n-1)·α = 0.75 · 0.64 ms + 3 · 2 us = 0.486 ms.
    topo = _topo(8)
    cost = collective_cost(collective, S, topo.placement((0, 1, 2, 3)), topo.links)
    assert cost.bytes_by_link == pytest.approx({"nvl": 0.75 * S})
    assert cost.isolated_time_s(topo.links) == pytest.approx(0.75 * S / B_NVL + 3 * A_NVL, rel=1e-12)


def test_group_of_one_or_empty_payload_costs_nothing():
    topo = _topo(8)
    assert collective_cost("all_reduce", S, topo.placement((0,)), topo.links).isolated_time_s(topo.links) == 0.0
    assert collective_cost("all_reduce", 0.0, topo.placement((0, 1)), topo.links).isolated_time_s(topo.links) == 0.0


def test_inter_node_all_gather_splits_bus_over_the_nodes_nics():
    # n = 8 ranks, g = 4 per node on k = 2 nodes (ranks 0-3 and 8-11 of a 16-GPU cluster).
    # bus = (n-1)/n · S = 7/8 S; each rank's NIC port carries bus/g = 7/32 S and its NVLink
    # (g-1)/g · bus = 21/32 S. Ring latency as NCCL's tuner counts it: of the n-1 = 7 steps, k-1 = 1
    # crosses the network (α_net = 6 us), the other 6 stay on NVLink (α_nvl = 2 us): 18 us.
    # Time = 18 us + max(7/32 S / 25 GB/s, 21/32 S / 100 GB/s) = 18 us + 0.56 ms.
    topo = _topo(16)
    placement = topo.placement((0, 1, 2, 3, 8, 9, 10, 11))
    assert (placement.members_per_node, placement.num_nodes) == (4, 2)
    cost = collective_cost("all_gather", S, placement, topo.links)
    assert cost.algorithm == "ring"
    assert cost.bytes_by_link == pytest.approx({"nic": 7 / 32 * S, "nvl": 21 / 32 * S})
    assert cost.latency_s == pytest.approx(A_NET + 6 * A_NVL, rel=1e-12)
    assert cost.isolated_time_s(topo.links) == pytest.approx(A_NET + 6 * A_NVL + 7 / 32 * S / B_NIC, rel=1e-12)


def test_inter_node_one_rank_per_node_uses_only_nics():
    # g = 1, k = 2 (ranks 0 and 8): all-reduce bus = 2·1/2·S = S, all on the NIC.
    # Ring latency 2(n-1) = 2 steps of 6 us; tree 2·log2(2)·6 us = 12 us and S through the NIC too:
    # equal, not lower, so the ring is kept. Time = 12 us + S / 25 GB/s = 12 us + 2.56 ms.
    topo = _topo(16)
    cost = collective_cost("all_reduce", S, topo.placement((0, 8)), topo.links)
    assert cost.algorithm == "ring"
    assert cost.bytes_by_link == pytest.approx({"nic": S})
    assert cost.isolated_time_s(topo.links) == pytest.approx(2 * A_NET + S / B_NIC, rel=1e-12)


SMALL = 64e3  # a payload whose time is mostly latency


def test_tree_all_reduce_chosen_when_its_latency_is_lower():
    # n = 16 ranks, one per node on k = 16 nodes (ranks 0, 8, ..., 120 of 128 GPUs), 64 kB.
    # Ring: 2(n-1) = 30 hops x 6 us = 180 us + 2·15/16·s / 25 GB/s = 4.8 us -> 184.8 us.
    # Tree: 2·log2(16) = 8 steps x 6 us = 48 us + 2·s / 25 GB/s (two binary trees: each node
    # sends and receives 2·s) = 5.12 us -> 53.12 us.
    topo = _topo(128)
    ranks = tuple(range(0, 128, 8))
    cost = collective_cost("all_reduce", SMALL, topo.placement(ranks), topo.links)
    assert cost.algorithm == "tree"
    assert cost.latency_s == pytest.approx(8 * A_NET, rel=1e-12)
    assert cost.bytes_by_link == pytest.approx({"nic": 2 * SMALL})
    assert cost.isolated_time_s(topo.links) == pytest.approx(8 * A_NET + 2 * SMALL / B_NIC, rel=1e-12)


def test_ring_all_reduce_chosen_when_its_bandwidth_wins():
    # Same 16 nodes, 64 MB: ring 180 us + 30/16·S / 25 GB/s = 180 + 4800 us = 4.98 ms;
    # tree 48 us + 2·S / 25 GB/s = 48 + 5120 us = 5.168 ms -> ring.
    topo = _topo(128)
    cost = collective_cost("all_reduce", S, topo.placement(tuple(range(0, 128, 8))), topo.links)
    assert cost.algorithm == "ring"
    assert cost.isolated_time_s(topo.links) == pytest.approx(30 * A_NET + 30 / 16 * S / B_NIC, rel=1e-12)


def test_tree_latency_counts_intra_node_steps():
    # n = 32: g = 8 per node on k = 4 nodes, 64 MB.
    # Tree: 2·log2(4)·6 us + 2·(8-1)·2 us = 24 + 28 = 52 us; NIC 2·S/8 = S/4 (0.64 ms), NVLink
    # reduce-scatter + all-gather 2·7/8·S = 1.75 S (1.12 ms) -> 1.172 ms.
    # Ring: 2·31 steps, 2k = 8 of them across the network (NCCL's tuner), 8·6 + 54·2 = 156 us; NIC
    # 2·31/32·S/8 (0.62 ms), NVLink 2·31/32·7/8·S (1.085 ms) -> 1.241 ms. The tree wins.
    topo = _topo(32)
    cost = collective_cost("all_reduce", S, topo.placement(tuple(range(32))), topo.links)
    assert cost.algorithm == "tree"
    assert cost.latency_s == pytest.approx(2 * 2 * A_NET + 2 * 7 * A_NVL, rel=1e-12)
    assert cost.bytes_by_link == pytest.approx({"nic": S / 4, "nvl": 1.75 * S})
    ring = collective_cost("all_reduce", S, topo.placement(tuple(range(32))), topo.links, algorithm="ring")
    assert ring.algorithm == "ring"
    assert ring.latency_s == pytest.approx(8 * A_NET + 54 * A_NVL, rel=1e-12)
    assert ring.isolated_time_s(topo.links) == pytest.approx(156e-6 + 2 * 31 / 32 * 7 / 8 * S / B_NVL, rel=1e-12)


def test_two_node_tree_moves_half_the_ring_bytes_through_the_nics():
    # g = 8 on k = 2 nodes: each of the two binary trees is one edge, so a node's NICs carry S each
    # way (S/8 per rank) where the ring carries 2·15/16·S (15/64·S per rank).
    topo = _topo(16)
    tree = collective_cost("all_reduce", S, topo.placement(tuple(range(16))), topo.links, algorithm="tree")
    ring = collective_cost("all_reduce", S, topo.placement(tuple(range(16))), topo.links, algorithm="ring")
    assert tree.bytes_by_link["nic"] == pytest.approx(S / 8)
    assert ring.bytes_by_link["nic"] == pytest.approx(15 / 64 * S)


def test_tree_uses_ceil_log2_of_node_count():
    # 64 kB, g = 1. k = 3: tree 2·ceil(log2 3) = 4 steps x 6 us = 24 us (+ 2·s/25 GB/s = 5.12 us);
    # ring 2(n-1) = 4 steps = 24 us (+ 4/3·s/25 GB/s = 3.41 us) -> ring.
    # k = 5: tree 2·3 = 6 steps (36 us + 5.12 us) < ring 2·4 = 8 steps (48 us + 4.1 us) -> tree.
    topo = _topo(64)
    three = collective_cost("all_reduce", SMALL, topo.placement((0, 8, 16)), topo.links)
    assert three.algorithm == "ring" and three.latency_s == pytest.approx(4 * A_NET, rel=1e-12)
    five = collective_cost("all_reduce", SMALL, topo.placement((0, 8, 16, 24, 32)), topo.links)
    assert five.algorithm == "tree" and five.latency_s == pytest.approx(6 * A_NET, rel=1e-12)


def test_low_latency_protocol_across_nodes_wins_small_messages_only():
    # The node's LL line: 10% of the NIC line rate (2.5 GB/s per rank), 1 us per network hop
    # (+ 1 us switch = 2 us). 16 nodes, g = 1 (as above):
    # 64 kB: ring_ll 30·2 us + 30/16·s / 2.5 GB/s = 60 + 48 = 108 us; tree_ll 8·2 + 2·s/2.5 GB/s
    #        = 16 + 51.2 = 67.2 us; tree (main) 53.12 us -> tree. 4 kB: tree_ll 16 + 3.28 = 19.28 us
    #        < tree 48 + 0.33 us -> tree_ll, its NIC bytes scaled by 25/2.5 = 10.
    topo = _topo(128, node=_node(nic_low_latency_efficiency=0.1, nic_low_latency_us=1))
    assert topo.links.inter_low_latency_bytes_per_s == pytest.approx(B_NIC / 10, rel=1e-12)
    ranks = tuple(range(0, 128, 8))
    assert collective_cost("all_reduce", SMALL, topo.placement(ranks), topo.links).algorithm == "tree"
    tiny = collective_cost("all_reduce", 4e3, topo.placement(ranks), topo.links)
    assert tiny.algorithm == "tree_ll"
    assert tiny.bytes_by_link == pytest.approx({"nic": 10 * 2 * 4e3})
    assert tiny.isolated_time_s(topo.links) == pytest.approx(8 * 2e-6 + 2 * 4e3 / (B_NIC / 10), rel=1e-12)


def test_oversubscribed_fat_tree_across_pods_adds_uplink_bytes():
    # Pods of 1 node, oversubscription 2: uplinks have B_NIC/2 = 12.5 GB/s per GPU.
    # All-gather over ranks 0 and 8 (g = 1, k = 2, 2 pods): bus = S/2 on the NIC and the same on
    # the uplink; the uplink is the bottleneck: time = 1·6 us + (S/2) / 12.5 GB/s = 6 us + 2.56 ms.
    fabric = _fabric(oversubscription=2.0, pod_size_nodes=1)
    topo = _topo(16, fabric=fabric)
    assert topo.links.uplink_bytes_per_s == pytest.approx(B_NIC / 2, rel=1e-12)
    placement = topo.placement((0, 8))
    assert placement.num_pods == 2
    cost = collective_cost("all_gather", S, placement, topo.links)
    assert cost.bytes_by_link == pytest.approx({"nic": S / 2, "up": S / 2})
    assert cost.isolated_time_s(topo.links) == pytest.approx(A_NET + (S / 2) / (B_NIC / 2), rel=1e-12)


def test_same_pod_group_does_not_touch_uplinks():
    # Pods of 2 nodes: ranks 0 and 8 share pod 0 -> no uplink bytes; time = 6 us + (S/2)/25 GB/s.
    topo = _topo(32, fabric=_fabric(oversubscription=2.0, pod_size_nodes=2))
    cost = collective_cost("all_gather", S, topo.placement((0, 8)), topo.links)
    assert "up" not in cost.bytes_by_link
    assert cost.isolated_time_s(topo.links) == pytest.approx(A_NET + (S / 2) / B_NIC, rel=1e-12)


def test_inter_node_send_recv_is_one_nic_transfer():
    # p2p across nodes: S over the NIC after one inter-node latency: 6 us + S / 25 GB/s.
    topo = _topo(16)
    cost = collective_cost("send_recv", S, topo.placement((0, 8)), topo.links)
    assert cost.algorithm == "p2p"
    assert cost.isolated_time_s(topo.links) == pytest.approx(A_NET + S / B_NIC, rel=1e-12)


def test_measured_intra_node_law_overrides():
    # Measured all-reduce law on NVLink: 10 us + bus / 80 GB/s. n = 4: bus = 1.5 S.
    # Time = 10 us + 1.5 · 64e6 / 80e9 = 10 us + 1.2 ms, exactly, whatever the link's own numbers.
    law = AlphaBeta(latency_us=10, bus_bandwidth_gb_per_s=80)
    topo = _topo(8)
    cost = collective_cost("all_reduce", S, topo.placement((0, 1, 2, 3)), topo.links,
                           intra_laws={"all_reduce": law})
    assert cost.algorithm == "measured"
    assert cost.isolated_time_s(topo.links) == pytest.approx(10e-6 + 1.5 * S / 80e9, rel=1e-12)
    # A law for another collective does not apply.
    other = collective_cost("all_gather", S, topo.placement((0, 1, 2, 3)), topo.links,
                            intra_laws={"all_reduce": law})
    assert other.algorithm == "ring"


def test_measured_points_give_their_group_size_the_measured_time():
    # all_reduce over 2 ranks timed at bus 1 MB -> 2 ms and 4 MB -> 5 ms; the line: 0.5 ms + bus / 2 GB/s.
    law = AlphaBeta(latency_us=500, bus_bandwidth_gb_per_s=2, measured_points=[(1e6, 2000.0), (4e6, 5000.0)],
                    measured_world_size=2)
    topo = _topo(8)
    pair = topo.placement((0, 1))

    def time_s(payload, placement=pair):
        cost = collective_cost("all_reduce", payload, placement, topo.links, intra_laws={"all_reduce": law})
        return cost.isolated_time_s(topo.links)

    # n = 2: bus = payload. Between the points: linear in bytes; below: the first; beyond: + bytes at 2 GB/s
    assert time_s(2.5e6) == pytest.approx(3.5e-3, rel=1e-9)
    assert time_s(1e5) == pytest.approx(2e-3, rel=1e-9)
    assert time_s(8e6) == pytest.approx(5e-3 + 4e6 / 2e9, rel=1e-9)
    # another group size: the line (latency + bus / bandwidth, bus = 1.5 payload for 4 ranks)
    assert time_s(2e6, topo.placement((0, 1, 2, 3))) == pytest.approx(500e-6 + 1.5 * 2e6 / 2e9, rel=1e-9)


def test_measured_points_must_be_monotone_and_name_their_group_size():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="not shrink"):
        AlphaBeta(latency_us=1, bus_bandwidth_gb_per_s=1, measured_points=[(1, 5.0), (2, 4.0)], measured_world_size=2)
    with pytest.raises(ValidationError, match="measured_world_size"):
        AlphaBeta(latency_us=1, bus_bandwidth_gb_per_s=1, measured_points=[(1, 5.0)])


def test_measured_inter_node_law_overrides():
    # Measured inter-node all-reduce law: 30 us + bus / 10 GB/s. n = 2 (ranks 0, 8), g = 1: bus = S.
    # Time = 30 us + 64e6 / 10e9 = 30 us + 6.4 ms.
    law = AlphaBeta(latency_us=30, bus_bandwidth_gb_per_s=10)
    topo = _topo(16)
    cost = collective_cost("all_reduce", S, topo.placement((0, 8)), topo.links, inter_laws={"all_reduce": law})
    assert cost.algorithm == "measured"
    assert cost.isolated_time_s(topo.links) == pytest.approx(30e-6 + S / 10e9, rel=1e-12)


def test_measured_inter_node_law_with_several_ranks_per_node():
    # n = 8 (g = 4 on 2 nodes), law 20 us + bus / 5 GB/s: bus = 2·7/8 S = 1.75 S -> 20 us + 22.4 ms.
    # (The NVLink share 3/4 · bus at 100 GB/s, 0.84 ms, is not the bottleneck.)
    law = AlphaBeta(latency_us=20, bus_bandwidth_gb_per_s=5)
    topo = _topo(16)
    cost = collective_cost("all_reduce", S, topo.placement((0, 1, 2, 3, 8, 9, 10, 11)), topo.links,
                           inter_laws={"all_reduce": law})
    assert cost.isolated_time_s(topo.links) == pytest.approx(20e-6 + 1.75 * S / 5e9, rel=1e-12)


def test_measured_law_latency_grows_with_the_ring_steps():
    # A law fitted across group sizes (validation/calibrate_efa.py): 7 us fixed + 37 us per ring step.
    # Inter-node all-gather over 4 nodes, one rank each (ranks 0, 8, 16, 24 on 32 GPUs): n - 1 = 3
    # steps -> 7 + 3·37 = 118 us; bus = 3/4 S at 20 GB/s per node.
    law = AlphaBeta(latency_us=7, latency_per_step_us=37, bus_bandwidth_gb_per_s=20)
    topo = _topo(32)
    cost = collective_cost("all_gather", S, topo.placement((0, 8, 16, 24)), topo.links,
                           inter_laws={"all_gather": law})
    assert cost.latency_s == pytest.approx(118e-6, rel=1e-12)
    assert cost.isolated_time_s(topo.links) == pytest.approx(118e-6 + 0.75 * S / 20e9, rel=1e-12)
    # An all-reduce has 2(n-1) steps: inside a node over 4 ranks, 6 steps -> 7 + 6·37 = 229 us.
    ar = collective_cost("all_reduce", S, topo.placement((0, 1, 2, 3)), topo.links, intra_laws={"all_reduce": law})
    assert ar.latency_s == pytest.approx(229e-6, rel=1e-12)
    # The default per-step latency is 0: a plain law keeps its constant latency.
    assert AlphaBeta(latency_us=7, bus_bandwidth_gb_per_s=20).latency_per_step_us == 0


def test_a_law_with_bandwidth_by_node_count_uses_the_group_s_node_count():
    # bus_bandwidth_by_nodes {2: 40, 8: 10} GB/s: 4 nodes sit halfway in log-log, sqrt(40·10) = 20.
    law = AlphaBeta(latency_us=0, latency_per_step_us=0, bus_bandwidth_gb_per_s=40,
                    bus_bandwidth_by_nodes={8: 10.0, 2: 40.0})
    assert list(law.bus_bandwidth_by_nodes) == [2, 8]
    assert law.bandwidth_gb_per_s(4) == pytest.approx(20.0, rel=1e-12)
    assert law.bandwidth_gb_per_s(1) == 40.0 and law.bandwidth_gb_per_s(64) == 10.0  # nearest outside
    topo = _topo(64)
    # all-gather over 4 nodes, one rank each: bus 3/4 S at 20 GB/s
    four = collective_cost("all_gather", S, topo.placement((0, 8, 16, 24)), topo.links, inter_laws={"all_gather": law})
    assert four.isolated_time_s(topo.links) == pytest.approx(0.75 * S / 20e9, rel=1e-12)
    # over 8 nodes: 7/8 S at 10 GB/s
    eight = collective_cost("all_gather", S, topo.placement(tuple(range(0, 64, 8))), topo.links,
                            inter_laws={"all_gather": law})
    assert eight.isolated_time_s(topo.links) == pytest.approx(0.875 * S / 10e9, rel=1e-12)
    with pytest.raises(ValueError, match="bandwidths > 0"):
        AlphaBeta(latency_us=0, bus_bandwidth_gb_per_s=1, bus_bandwidth_by_nodes={2: 0.0})


def test_measured_laws_come_from_the_node_spec_through_topology():
    # The node spec's intra_node.collectives reaches collective_cost the way the planner passes it.
    node = _node(intra={"collectives": {"all_gather": {"latency_us": 4, "bus_bandwidth_gb_per_s": 50}}})
    topo = _topo(8, node=node)
    cost = collective_cost("all_gather", S, topo.placement((0, 1)), topo.links,
                           node.intra_node.collectives, node.inter_node_collectives)
    # n = 2: bus = S/2 -> 4 us + 32e6 / 50e9 = 4 us + 0.64 ms.
    assert cost.isolated_time_s(topo.links) == pytest.approx(4e-6 + (S / 2) / 50e9, rel=1e-12)


def test_collective_efficiency_scales_intra_bandwidth():
    # Efficiency 0.5 halves the usable 100 GB/s: n = 2 all-reduce, bus = S: 2 us + S / 50 GB/s.
    topo = _topo(8, node=_node(intra={"collective_efficiency": 0.5}))
    cost = collective_cost("all_reduce", S, topo.placement((0, 1)), topo.links)
    assert cost.isolated_time_s(topo.links) == pytest.approx(2 * A_NVL + S / 50e9, rel=1e-12)


def test_placement_counts_nodes_and_pods():
    topo = _topo(32, fabric=_fabric(oversubscription=4.0, pod_size_nodes=2))
    p = topo.placement((0, 8, 16, 24))
    assert isinstance(p, Placement)
    assert (p.size, p.members_per_node, p.num_nodes, p.num_pods) == (4, 1, 4, 2)
    assert topo.links.uplink_bytes_per_s == pytest.approx(B_NIC / 4)
    assert math.isclose(topo.port_capacity("stage0:up_tx"), B_NIC / 4)
    assert math.isclose(topo.port_capacity("rank3:nvl_rx"), B_NVL)
    assert math.isclose(topo.port_capacity("rank3:nic_tx"), B_NIC)


def _nvls_node(min_gpus: int) -> Node:
    from hardware_specs.schema import NvlsLaw
    node = _node(intra={"supports_nvls": True})
    law = NvlsLaw(latency_us=10, bandwidth_gb_per_s=200, min_gpus=min_gpus, source="toy")
    return node.model_copy(update={"nvls_all_reduce": law})


def test_nvls_tree_across_nodes_when_the_node_has_nvls():
    # g = 8 on k = 4 nodes, 64 MB, NVLS law 10 us + S / 200 GB/s.
    # NVLSTree: 10 us + 2·log2(4)·6 us = 34 us; NICs as the tree (2·S/8 = S/4: 0.64 ms); NVLink carries what
    # S at the NVLS law's 200 GB/s takes on the 100 GB/s port (S/2: 0.32 ms) -> 0.674 ms.
    # Tree 1.172 ms, ring 1.241 ms (test_tree_latency_counts_intra_node_steps): NVLSTree wins.
    node = _nvls_node(min_gpus=4)
    topo = _topo(32, node)
    placement = topo.placement(tuple(range(32)))
    cost = collective_cost("all_reduce", S, placement, topo.links, nvls=node.nvls_all_reduce)
    assert cost.algorithm == "nvls_tree"
    assert cost.latency_s == pytest.approx(10e-6 + 4 * A_NET, rel=1e-12)
    assert cost.bytes_by_link == pytest.approx({"nic": S / 4, "nvl": S / 2})
    assert cost.isolated_time_s(topo.links) == pytest.approx(34e-6 + S / 4 / B_NIC, rel=1e-12)
    # NCCL_ALGO forcing keeps the forced algorithm
    forced = collective_cost("all_reduce", S, placement, topo.links, nvls=node.nvls_all_reduce, algorithm="tree")
    assert forced.algorithm == "tree"
    # other collectives and groups of fewer ranks per node than NVLS needs do not run it
    gather = collective_cost("all_gather", S, placement, topo.links, nvls=node.nvls_all_reduce)
    assert gather.algorithm == "ring"
    four = topo.placement(tuple(r for r in range(32) if r % 8 < 4))
    assert (four.members_per_node, four.num_nodes) == (4, 4)
    small = collective_cost("all_reduce", S, four, topo.links, nvls=_nvls_node(min_gpus=6).nvls_all_reduce)
    assert small.algorithm != "nvls_tree"
