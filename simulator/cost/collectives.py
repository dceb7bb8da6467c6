"""Collective algorithms as α-β costs on the topology.

For a collective of ``S`` payload bytes over a group of n ranks (g per node, k nodes) the
NCCL-tests "bus" volume per rank is (Jeaugey, NCCL tests PERFORMANCE.md):

- all-reduce: 2(n-1)/n · S    - all-gather / reduce-scatter: (n-1)/n · S (S = full tensor)
- broadcast / send-recv: S    - all-to-all: (n-1)/n · S
- ring pass (context-parallel K/V ring): (n-1) · S, S being one hop's payload

and the time in isolation is ``latency + bus / bus_bandwidth``. Mapped on links:

- inside one node every byte of the bus volume crosses the rank's intra-node port;
- across nodes a ring (NCCL runs one channel per NIC) pushes the bus volume through the
  node's g NICs, so each rank's NIC port carries bus/g, and (g-1)/g of it stays on NVLink;
  an all-reduce may instead run a double binary tree across nodes: 2·log2(k) latency steps
  instead of 2(n-1), and 2·S through a node's NICs (S over two nodes; ``_tree_bytes``) instead of
  the ring's 2(n-1)/n·S; each algorithm also runs on the low-latency protocol where the node has
  fitted one (``nic_low_latency_*``); where the node has NVLS (an ``nvls_all_reduce`` law, NVSwitch
  multicast) and at least its ``min_gpus`` ranks per node, NVLSTree is a candidate too (NVLS inside the
  node, the tree's bytes between nodes; Simple protocol only); NCCL's tuner picks the fastest — so do we,
  and ``algorithm`` honours an ``NCCL_ALGO`` that a measurement forced;
- between pods of an oversubscribed fat tree the inter-node bytes also cross the uplinks.

Latency: ring all-reduce 2(n-1) steps, all-gather/reduce-scatter (n-1) steps; inside a node each costs
the NVLink hop, across nodes NCCL's tuner (src/graph/tuning.cc, ncclTopoTuneModel) charges the network's
latency only on the steps that cross nodes (2k for an all-reduce, k-1 for a gather) and NVLink's on the
rest; tree 2·log2(k) inter-node steps plus 2(g-1) intra ones; NVLSTree the NVLS law's latency plus the
tree's 2·log2(k) network steps.
A law with a low-latency protocol (NCCL's LL/LL128) gives the faster of its two α-β lines, as
NCCL's tuner picks a protocol per message size.
On a full mesh (xGMI, ``mesh_peers`` = links per GPU) a group of n inside the node uses n-1 of
them, so its bytes take mesh_peers/(n-1) times longer than the node-wide port rate says.
NVLS (NVLink SHARP, where the node has a fitted ``nvls_all_reduce`` law): an all-reduce inside
one NVSwitch domain of at least ``min_gpus`` ranks costs ``latency + S / bandwidth`` (each rank
sends S into the switch and gets the reduced S back) when that beats the ring, as NCCL chooses.
Measured per-collective α-β laws from ``clustersim calibrate`` (or fitted on published
microbenchmarks, e.g. ``validation/calibrate_efa.py``) override these for the link class they
were measured on; a law's latency is ``latency_us + steps · latency_per_step_us``. A law with
``measured_points`` (timed at one group size) gives that group size the measured time itself:
the latency is the table's time less what the bytes take at the law's bandwidth.

A calibrated law's ``arrival_wait_us`` (a CPU host's; 0 in every catalog law) is the mean wait for the group's
last rank at a collective that follows compute: the ranks drift apart over the segment before it and the
collective starts when the last arrives. It is part of ``CollectiveCost.latency_s`` (so a single collective
after compute, and every caller that reads the latency, prices it as before), and kept apart as
``CollectiveCost.arrival_wait_s`` so that a collective issued right after another of its group, with no compute
between (a loop of blocking all-reduces over the parameter tensors), does not pay it again: there is no fresh
drift to wait for (``PlanCosts.comm_task``'s ``back_to_back``). Where it comes from:
``simulator.cost.calibration.fit_collective_wait`` (``skew.csv``'s ``collective_cadence`` rows: GEMM segments of
4-32 ms, each then a 512 KiB all-reduce; the wait did not shrink with the segment there, so it is one value). The
saved 2026-12-06 loops' local_sgd traces (52 parameter all-reduces back to back after 4 inner steps) agree: the
first waited 0.6-3.7 ms for the other rank, each later one 0.04-0.09 ms on average, against the 0.38-0.50 ms
the cadence rows give.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hardware_specs.schema import AlphaBeta, NvlsLaw
from simulator.cost.topology import LinkCapacities, Placement

BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,  # pipelined ring reduce to one root (NCCL): the payload crosses each link once
    "send_recv": lambda n: 1.0,
    "ring_pass": lambda n: n - 1.0,  # context-parallel ring: payload moves n-1 hops (Liu et al. 2023)
}


@dataclass(frozen=True)
class CollectiveCost:
    """What one rank does for a collective: a latency, then bytes over its link classes."""

    algorithm: str
    latency_s: float
    bytes_by_link: dict[str, float]   # "nvl" | "nic" | "up" -> bytes per rank (each direction); "wan:a>b" -> bytes
    #                                   on a wide-area pair port (simulator/cost/wan.py)
    arrival_wait_s: float = 0.0       # of latency_s, the law's wait for the last rank (see the module docstring)

    def isolated_time_s(self, links: LinkCapacities) -> float:
        transfer = max((b / links.capacity_of(k) for k, b in self.bytes_by_link.items() if b > 0), default=0.0)
        return self.latency_s + transfer


def bus_bytes(collective: str, payload_bytes: float, n: int) -> float:
    if n <= 1:
        return 0.0
    return BUS_FACTOR[collective](n) * payload_bytes


def ring_steps(collective: str, n: int) -> int:
    """Latency steps of a ring collective over n ranks (2(n-1) all-reduce, n-1 gather/scatter)."""
    if collective == "all_reduce":
        return 2 * (n - 1)
    if collective in ("all_gather", "reduce_scatter", "broadcast", "reduce", "ring_pass"):
        return n - 1
    return 1


def _law_latency_s(law: AlphaBeta, collective: str, n: int) -> float:
    """A measured law's latency over n ranks: fixed part plus per-ring-step part, plus the wait for the last
    rank after compute (``arrival_wait_us``; 0 in every catalog law, which adds nothing)."""
    return (law.latency_us + ring_steps(collective, n) * law.latency_per_step_us) * 1e-6 + law.arrival_wait_us * 1e-6


def collective_cost(
    collective: str,
    payload_bytes: float,
    placement: Placement,
    links: LinkCapacities,
    intra_laws: dict[str, AlphaBeta] | None = None,
    inter_laws: dict[str, AlphaBeta] | None = None,
    nvls: NvlsLaw | None = None,
    mesh_peers: int | None = None,
    algorithm: str | None = None,
) -> CollectiveCost:
    """Cost of ``collective`` of ``payload_bytes`` over ``placement`` (see module docstring). ``algorithm``
    ("ring", "tree" or "nvls_tree") forces NCCL's cross-node algorithm (``NCCL_ALGO``) where a measurement
    did."""
    n = placement.size
    if n <= 1 or payload_bytes <= 0:
        return CollectiveCost("none", 0.0, {})
    bus = bus_bytes(collective, payload_bytes, n)
    g, k = placement.members_per_node, placement.num_nodes
    if mesh_peers and k == 1 and n - 1 < mesh_peers:
        # full mesh (xGMI): a group of n drives only n-1 of each GPU's mesh_peers links
        bus *= mesh_peers / (n - 1)
    if k == 1 and collective == "all_reduce" and nvls is not None and n >= nvls.min_gpus:
        ring = collective_cost(collective, payload_bytes, placement, links, intra_laws, inter_laws,
                               mesh_peers=mesh_peers)
        # NVLS (NVLink SHARP): the payload goes into the switch once and comes back reduced once.
        switch = CollectiveCost("nvls", nvls.latency_us * 1e-6,
                                {"nvl": payload_bytes * links.intra_bytes_per_s / (nvls.bandwidth_gb_per_s * 1e9)})
        return switch if switch.isolated_time_s(links) < ring.isolated_time_s(links) else ring
    if k == 1:
        law = (intra_laws or {}).get(collective)
        if law is not None:
            # Scale bytes so that alone on the port it takes bus / law bandwidth.
            scaled = bus * links.intra_bytes_per_s / (law.bus_bandwidth_gb_per_s * 1e9)
            wait = law.arrival_wait_us * 1e-6
            table_s = law.table_time_s(bus, n)
            if table_s is not None:  # the measured time: what the bytes do not take is latency
                latency = max(0.0, table_s - bus / (law.bus_bandwidth_gb_per_s * 1e9)) + wait
                return CollectiveCost("measured", latency, {"nvl": scaled}, wait)
            simple = CollectiveCost("measured", _law_latency_s(law, collective, n), {"nvl": scaled}, wait)
            ll = law.low_latency
            if ll is None:
                return simple
            fast = CollectiveCost("measured_ll", _law_latency_s(ll, collective, n),
                                  {"nvl": bus * links.intra_bytes_per_s / (ll.bus_bandwidth_gb_per_s * 1e9)}, wait)
            return fast if fast.isolated_time_s(links) < simple.isolated_time_s(links) else simple
        return CollectiveCost("ring", ring_steps(collective, n) * links.intra_latency_s, {"nvl": bus})

    law = (inter_laws or {}).get(collective)
    nic_bytes = bus / g
    by_link = {"nic": nic_bytes}
    if g > 1:
        by_link["nvl"] = bus * (g - 1) / g
    if placement.num_pods > 1:
        by_link["up"] = nic_bytes
    if law is not None:
        bandwidth = law.bandwidth_gb_per_s(k) * 1e9
        by_link = {key: b * links.inter_bytes_per_s / (bandwidth / g) if key == "nic" else b
                   for key, b in by_link.items()}
        return CollectiveCost("measured", _law_latency_s(law, collective, n), by_link, law.arrival_wait_us * 1e-6)
    hop = max(links.inter_latency_s, links.intra_latency_s)
    ring_latency = _ring_latency_s(collective, n, k, links.inter_latency_s, links.intra_latency_s)
    if collective == "send_recv":
        return CollectiveCost("p2p", links.inter_latency_s, {"nic": payload_bytes})
    if collective == "ring_pass":
        # Each step is a send to the ring neighbour; steps are in lock-step, so the rank whose
        # neighbour is on another node sets the pace: all of its bytes cross its NIC.
        ring = {"nic": bus}
        if placement.num_pods > 1:
            ring["up"] = bus
        return CollectiveCost("ring", ring_steps(collective, n) * hop, ring)
    if collective == "all_to_all":
        inter_share = (n - g) / n * payload_bytes
        intra_share = (g - 1) / n * payload_bytes
        a2a = {"nic": inter_share, "nvl": intra_share}
        if placement.num_pods > 1:
            a2a["up"] = inter_share
        return CollectiveCost("pairwise", links.inter_latency_s + (n - 1) * 1e-6, a2a)
    candidates = [CollectiveCost("ring", ring_latency, by_link)]
    if collective == "all_reduce":
        candidates.append(CollectiveCost("tree", _tree_latency_s(links.inter_latency_s, links, g, k),
                                         _tree_bytes(payload_bytes, g, k, placement.num_pods > 1)))
    if links.inter_low_latency_bytes_per_s and links.inter_low_latency_s is not None:
        # NCCL's LL/LL128 protocols: the same algorithms with shorter steps and less bandwidth on the NICs
        slow = links.inter_bytes_per_s / links.inter_low_latency_bytes_per_s
        for cost in list(candidates):
            latency = (_ring_latency_s(collective, n, k, links.inter_low_latency_s, links.intra_latency_s)
                       if cost.algorithm == "ring"
                       else _tree_latency_s(links.inter_low_latency_s, links, g, k))
            scaled = {key: b * slow if key in ("nic", "up") else b for key, b in cost.bytes_by_link.items()}
            candidates.append(CollectiveCost(cost.algorithm + "_ll", latency, scaled))
    if collective == "all_reduce" and nvls is not None and g >= nvls.min_gpus:
        # NVLSTree (NCCL >= 2.18 on NVSwitch nodes with multicast): NVLS reduce/broadcast inside each node,
        # a tree between nodes; Simple protocol only (no _ll variant)
        candidates.append(CollectiveCost("nvls_tree", _nvls_tree_latency_s(links.inter_latency_s, nvls, k),
                                         _nvls_tree_bytes(payload_bytes, g, k, placement.num_pods > 1, nvls, links)))
    if algorithm is not None:
        candidates = [c for c in candidates if c.algorithm.removesuffix("_ll") == algorithm] or candidates
    # NCCL's tuner picks the algorithm and protocol it expects to be fastest (src/graph/tuning.cc); so do we
    return min(candidates, key=lambda c: c.isolated_time_s(links))


def ring_inter_node_steps(collective: str, k: int) -> int:
    """Steps of a ring collective over k nodes that cross the network, as NCCL's tuner counts them
    (src/graph/tuning.cc, ncclTopoTuneModel: ``nInterSteps`` = 2·nNodes for an all-reduce, nNodes-1 for an
    all-gather / reduce-scatter, nNodes otherwise)."""
    if k <= 1:
        return 0
    if collective == "all_reduce":
        return 2 * k
    if collective in ("all_gather", "reduce_scatter"):
        return k - 1
    return k


def _ring_latency_s(collective: str, n: int, k: int, inter_hop_s: float, intra_hop_s: float) -> float:
    """A pipelined ring's latency as NCCL's tuner models it (src/graph/tuning.cc, ncclTopoTuneModel):
    the last chunk walks every step of the ring (2(n-1) for an all-reduce, n-1 for a gather), and only the
    steps that cross a node boundary (``ring_inter_node_steps``) cost the network's latency; the rest cost
    NVLink's. The chunks are pipelined, so the steps do not run in lock-step at the slowest hop's latency
    (that reading put 62 network latencies on a 4-node all-reduce: 8.6 ms against ~21 ms of bytes at
    4 GiB on p5en, where the forced ring measured 364.65 GB/s; collectives_bandwidth.csv row 107)."""
    steps = ring_steps(collective, n)
    inter = min(steps, ring_inter_node_steps(collective, k))
    return (steps - inter) * intra_hop_s + inter * max(inter_hop_s, intra_hop_s)


def _tree_latency_s(inter_hop_s: float, links: LinkCapacities, g: int, k: int) -> float:
    """Double binary tree over k nodes (2·ceil(log2 k) inter-node steps, up and down) and a chain of
    g ranks inside each node (2(g-1) intra-node steps)."""
    return 2 * math.ceil(math.log2(k)) * inter_hop_s + 2 * (g - 1) * links.intra_latency_s


def _tree_bytes(payload_bytes: float, g: int, k: int, across_pods: bool) -> dict[str, float]:
    """Bytes per rank of a tree all-reduce over k nodes of g ranks.

    Inside the node the payload is reduce-scattered and all-gathered (2(g-1)/g·S per rank on NVLink,
    NCCL's NVLS-tree or chain); across nodes NCCL runs two binary trees, each on half the payload, where
    every node is an inner node of one and a leaf of the other (Sanders, Speck & Träff 2009, "Two-tree
    algorithms for full bandwidth broadcast, reduction and scan", Sec. 3): a node's NICs carry 2·S each
    way for the reduce up and the broadcast down (NCCL's tuner: tree algorithm bandwidth = bus bandwidth / 2,
    src/graph/tuning.cc). Over two nodes each tree is one edge: a node sends its half up one tree and the
    other half down the other, S each way, where a ring over the 2g ranks moves 2(2g-1)/(2g)·S.
    """
    node_bytes = payload_bytes if k == 2 else 2 * payload_bytes
    out = {"nic": node_bytes / g}
    if g > 1:
        out["nvl"] = 2 * (g - 1) / g * payload_bytes
    if across_pods:
        out["up"] = node_bytes / g
    return out


def _nvls_tree_latency_s(inter_hop_s: float, nvls: NvlsLaw, k: int) -> float:
    """NVLSTree: the NVLS reduce and broadcast inside the node (the NVLS law's latency) and a double binary
    tree between nodes (2·ceil(log2 k) network steps, as ``_tree_latency_s``)."""
    return nvls.latency_us * 1e-6 + 2 * math.ceil(math.log2(k)) * inter_hop_s


def _nvls_tree_bytes(payload_bytes: float, g: int, k: int, across_pods: bool, nvls: NvlsLaw,
                     links: LinkCapacities) -> dict[str, float]:
    """Bytes per rank of an NVLSTree all-reduce over k nodes of g ranks (NCCL src/device/all_reduce.h,
    runTreeNVLS / src/graph/tuning.cc NCCL_ALGO_NVLS_TREE).

    Inside the node the payload goes into the NVSwitch once and comes back reduced once (NVLink SHARP), priced
    as the node's fitted NVLS all-reduce law (bytes scaled so that alone on the port they take S / the law's
    bandwidth). Between nodes each of the g NVLS heads (one per NIC) runs the double binary tree on 1/g of the
    payload: a node's NICs carry what ``_tree_bytes`` gives a plain tree (2·S each way, S over two nodes; NCCL's
    tuner: NVLS_TREE bandwidth min(bwIntra, nNodes <= 2 ? bwInter : bwInter/2))."""
    node_bytes = payload_bytes if k == 2 else 2 * payload_bytes
    out = {"nic": node_bytes / g,
           "nvl": payload_bytes * links.intra_bytes_per_s / (nvls.bandwidth_gb_per_s * 1e9)}
    if across_pods:
        out["up"] = node_bytes / g
    return out
