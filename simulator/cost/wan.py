"""A wide-area cluster: regions (or single nodes) joined by links with a delay and a bandwidth.

Nodes fill the regions in order (region 0 holds nodes ``0 .. n0-1``, and so on; ranks fill nodes
as everywhere, ``node = rank // gpus_per_node``, or group by group on a mixed cluster of node groups,
so that groups of different GPUs can sit in different regions); without regions every node is its own region.
Inside a region the intra-region fabric (a fat tree or rail-optimised fabric) applies unchanged,
through :class:`~simulator.cost.topology.Topology`. Between regions a and b:

- each ordered region pair ``a > b`` is one directional port ``wan:a>b`` of
  ``bandwidth · transport efficiency`` bytes/s that every flow crossing it shares, max-min fairly,
  in the flow network (simulator/engine/network.py knows only ports and bytes);
- a transfer's bytes also cross the sender's NIC (``nic_tx``) and the receiver's (``nic_rx``);
- where the transport bounds one connection (a per-flow cap, or a window over the round trip), the
  sender owns a port ``{actor}:conn_a>b`` of that rate: each connection is capped on its own;
- the one-way delay is propagation: a send's bytes arrive ``delay`` after they leave (the engine's
  ``Task.propagation_s``: the sender's stream is free once its bytes are out, so the delays of
  back-to-back sends overlap, as on a real pipe);
- a collective over ranks in several regions runs as NCCL's ring over the group's nodes in rank order:
  every ring edge between two regions carries the bus volume (the ring's per-node bytes) over its
  pair port, and each of the ring's steps waits for the slowest edge's delay (2(n-1) steps for an
  all-reduce, n-1 for a gather/scatter; a double binary tree's 2·log2(nodes) steps where that is
  fewer, as NCCL's tuner picks; Jeaugey 2019, "Massively scale your deep learning training with NCCL
  2.4").

Symmetric mode simulates one rank per pipeline stage: the other, symmetric copies of its transfer
move at the same time, so the representative's flow carries, on each pair port, the bytes of every
copy that crosses that port ("multiply, don't enumerate", DESIGN.md): the planner counts, per port,
the copies of a send (or the ring edges of the copies of a collective) that cross it, so copies over
other ports (a per-node matrix: each replica's own node pair) add nothing to the representative's.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property

from hardware_specs.schema import Node, WanTransport, WideArea
from simulator.cost.collectives import CollectiveCost, bus_bytes, ring_steps
from simulator.cost.topology import LinkCapacities, Topology
from simulator.errors import ConfigError


@dataclass(frozen=True)
class WanLinkCapacities(LinkCapacities):
    """The intra-region link classes plus the pair ports (``wan:a>b`` -> bytes/s)."""

    pair_bytes_per_s: dict[str, float] = field(default_factory=dict)

    def capacity_of(self, link: str) -> float:
        if link in self.pair_bytes_per_s:
            return self.pair_bytes_per_s[link]
        return super().capacity_of(link)


def cold_start_s(transport: WanTransport | None, rtt_s: float, rate_bytes_per_s: float) -> float:
    """Seconds a cold connection loses to slow start before it moves at ``rate_bytes_per_s``
    (Cardwell, Savage & Anderson 2000, Sec. 2.1: the window doubles once per round trip from the
    initial window to the target -- the bandwidth-delay product, or the window where smaller --
    sending about twice the target meanwhile, which the steady rate would move in two round trips):
    ``RTT · max(0, log2(target / initial_window) - 1)``. 0 without a transport or initial window."""
    if transport is None or transport.initial_window_bytes is None or rtt_s <= 0:
        return 0.0
    target = rate_bytes_per_s * rtt_s
    if transport.window_bytes is not None:
        target = min(target, transport.window_bytes)
    return rtt_s * max(0.0, math.log2(target / transport.initial_window_bytes) - 1.0)


class WanTopology(Topology):
    """Regions over a wide-area matrix (see the module docstring)."""

    def __init__(self, node: Node, fabric: WideArea, num_gpus: int, intra_fabric, groups=None):
        super().__init__(node, intra_fabric, num_gpus, groups=groups)
        self.wan = fabric
        self.delay_ms, self.bandwidth_gbit_per_s = fabric.pair_matrices()
        nodes = self.num_nodes
        if fabric.regions is None:
            if len(self.delay_ms) != nodes:
                raise ConfigError("cluster.fabric.delay_ms", f"a per-node matrix needs one row per node: "
                                                             f"{len(self.delay_ms)} rows for {nodes} nodes")
            self.region_of_node = list(range(nodes))
            self.region_names = [f"node{i}" for i in range(nodes)]
        else:
            counts = [r.nodes for r in fabric.regions]
            if sum(counts) != nodes:
                raise ConfigError("cluster.fabric.regions", f"the regions hold {sum(counts)} nodes "
                                  f"({' + '.join(map(str, counts))}) but the cluster has {nodes}")
            self.region_of_node = [i for i, c in enumerate(counts) for _ in range(c)]
            self.region_names = [r.name for r in fabric.regions]
        self._first_node = {}
        for n, r in enumerate(self.region_of_node):
            self._first_node.setdefault(r, n)

    # -- where ranks are -------------------------------------------------------------------------

    def region_of(self, rank: int) -> int:
        return self.region_of_node[self.physical_node_of(rank)]

    def pod_of(self, rank: int):
        """Pods of the intra-region fabric, counted inside each region (regions never share one)."""
        region = self.region_of(rank)
        pod = self.fabric.pod_size_nodes
        local = self.physical_node_of(rank) - self._first_node[region]
        return (region, local // pod if pod else 0)

    def delay_s(self, a: int, b: int) -> float:
        return self.delay_ms[a][b] * 1e-3

    def rtt_s(self, a: int, b: int) -> float:
        """Round trip of a connection from region a to b: the delay there and back."""
        return (self.delay_ms[a][b] + self.delay_ms[b][a]) * 1e-3

    # -- ports -----------------------------------------------------------------------------------

    @staticmethod
    def pair_port(a: int, b: int) -> str:
        return f"wan:{a}>{b}"

    def pair_bytes_per_s(self, a: int, b: int) -> float:
        efficiency = self.wan.transport.bandwidth_efficiency if self.wan.transport else 1.0
        return self.bandwidth_gbit_per_s[a][b] * 1e9 / 8 * efficiency

    def connection_bytes_per_s(self, a: int, b: int) -> float | None:
        """One connection's bound from a to b (per-flow cap, window / RTT), or None where unbounded."""
        transport = self.wan.transport
        if transport is None:
            return None
        bounds = []
        if transport.max_flow_gbit_per_s is not None:
            bounds.append(transport.max_flow_gbit_per_s * 1e9 / 8)
        if transport.window_bytes is not None and self.rtt_s(a, b) > 0:
            bounds.append(transport.window_bytes / self.rtt_s(a, b))
        return min(bounds) if bounds else None

    @cached_property
    def pair_capacities(self) -> dict[str, float]:
        n = len(self.region_names)
        return {self.pair_port(a, b): self.pair_bytes_per_s(a, b) for a in range(n) for b in range(n) if a != b}

    def _with_pairs(self, base: LinkCapacities) -> WanLinkCapacities:
        return WanLinkCapacities(base.intra_bytes_per_s, base.inter_bytes_per_s, base.uplink_bytes_per_s,
                                 base.intra_latency_s, base.inter_latency_s, pair_bytes_per_s=self.pair_capacities)

    def group_links(self, g: int) -> WanLinkCapacities:
        """A node group's link classes (simulator/cost/topology.py) plus the pair ports."""
        return self._with_pairs(super().group_links(g))

    def links_for(self, ranks: tuple[int, ...]) -> WanLinkCapacities:
        return self._with_pairs(super().links_for(ranks))

    def port_capacity(self, port: str) -> float:
        if port.startswith("wan:"):
            return self.pair_capacities[port]
        kind = port.rsplit(":", 1)[1]
        if kind.startswith("conn_"):
            a, b = (int(x) for x in kind[len("conn_"):].split(">"))
            return self.connection_bytes_per_s(a, b)
        return super().port_capacity(port)

    # -- transfers -------------------------------------------------------------------------------

    def send(self, src_actor: str, src_rank: int, dst_actor: str, dst_rank: int, payload: float,
             copies: float = 1.0) -> tuple[dict[str, float], float] | None:
        """(port demands, propagation seconds) of a point-to-point send between two regions, or None
        where both ranks are in one region (the intra-region fabric prices it). ``copies``: the
        symmetric copies whose bytes cross the same pair port with this one."""
        a, b = self.region_of(src_rank), self.region_of(dst_rank)
        if a == b:
            return None
        demands = {f"{src_actor}:nic_tx": payload, f"{dst_actor}:nic_rx": payload,
                   self.pair_port(a, b): payload * copies}
        if self.connection_bytes_per_s(a, b) is not None:
            demands[f"{src_actor}:conn_{a}>{b}"] = payload
        return demands, self.delay_s(a, b)

    def ring_crossings(self, ranks: tuple[int, ...]) -> Counter:
        """Ring edges between regions of a group (NCCL's ring over its nodes in rank order):
        {(region a, region b): edges}."""
        nodes = []
        for r in ranks:
            n = self.physical_node_of(r)
            if not nodes or nodes[-1] != n:
                nodes.append(n)
        if len(nodes) > 1 and nodes[0] == nodes[-1]:
            nodes.pop()
        if len(nodes) < 2:
            return Counter()
        regions = [self.region_of_node[n] for n in nodes]
        edges = Counter()
        for i, a in enumerate(regions):
            b = regions[(i + 1) % len(regions)]
            if a != b:
                edges[(a, b)] += 1
        return edges

    def over_wan(self, cost: CollectiveCost, collective: str, payload: float, ranks: tuple[int, ...],
                 edges: Counter | None = None, scale: float = 1.0) -> CollectiveCost:
        """``cost`` (priced on the intra-region fabric) plus what crossing regions adds: the bus volume on
        every crossing ring edge's pair port and the ring's (or tree's) steps at the slowest crossing
        delay. ``edges``: the crossing edges of every group this one stands for (symmetric copies;
        default: its own), each carrying ``scale`` times the bus volume (1 / simulated members: a
        rendezvous adds its members' demands)."""
        edges = self.ring_crossings(ranks) if edges is None else edges
        if not edges or cost.algorithm == "none":
            return cost
        n = len(ranks)
        bus = bus_bytes(collective, payload, n)
        by_link = dict(cost.bytes_by_link)
        for (a, b), count in edges.items():
            port = self.pair_port(a, b)
            by_link[port] = by_link.get(port, 0.0) + bus * count * scale
        slowest = max(self.delay_s(a, b) for a, b in edges)
        steps = ring_steps(collective, n)
        nodes = len({self.physical_node_of(r) for r in ranks})
        if collective == "all_reduce":
            steps = min(steps, 2 * math.ceil(math.log2(nodes)))
        return CollectiveCost(f"{cost.algorithm}+wan", cost.latency_s + steps * slowest, by_link, cost.arrival_wait_s)


def wan_topology(node: Node, fabric: WideArea, num_gpus: int, groups=None) -> WanTopology:
    """Resolve the intra-region fabric (catalog name or inline) and build the topology (``groups``: a mixed
    cluster's node groups, which fill the regions in rank order like any nodes)."""
    from hardware_specs.catalog import FABRICS

    intra = FABRICS.get(fabric.intra_region, "cluster.fabric.intra_region")
    if isinstance(intra, WideArea):
        raise ConfigError("cluster.fabric.intra_region", "must be a fat tree or rail-optimised fabric, not a WAN")
    return WanTopology(node, fabric, num_gpus, intra, groups)
