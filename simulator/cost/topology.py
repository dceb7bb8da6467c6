"""Where ranks sit and which links their groups use.

Ranks are numbered Megatron-style, tp innermost then cp, dp, pp (``tp-cp-dp-pp``), and
fill nodes in order (``node = rank // gpus_per_node``). A communicator group is described
by its placement: members, members per node, nodes, pods. Each rank owns directional
*ports* that the flow network shares:

- ``{actor}:nvl_tx`` / ``nvl_rx``  — its intra-node links (NVLink/NVSwitch/xGMI/PCIe);
- ``{actor}:nic_tx`` / ``nic_rx``  — its share of the node's NICs (nics·rate / gpus per node);
- ``{actor}:up_tx``  / ``up_rx``   — its share of the fat tree's uplinks above a pod
  (nic share / oversubscription); only traffic between pods crosses them.

An NVLink domain may span several nodes (GB200/GB300 NVL72: 18 trays of 4 GPUs behind NVLink
switch trays, ``Node.nvlink_domain_gpus``): placement then counts *domains* where it counts
nodes, so a group inside one rack uses NVLink (``nvl`` ports) and only traffic between racks uses
the NICs. Pods of the fabric are counted in physical nodes.

Fabrics: a fat tree (``levels`` tiers: 2·levels-1 switches on the worst path) or a rail-optimised
fabric (one leaf per rail inside a scalable unit of ``rail_group_nodes`` nodes: one switch on a
path inside the unit, three between units; hardware_specs/schema.py ``RailOptimized``). Other
topologies (dragonfly, torus) implement :class:`Topology` with their own placement, hop counts and
port capacities.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, cached_property

from hardware_specs.schema import FatTree, Node, RailOptimized
from simulator.cost.intra_node import group_slowdown
from simulator.errors import ConfigError
from simulator.strategies.spmd.layout import Parallelism

GroupKind = str  # "tp" | "cp" | "dp" | "pp" | "ep" | "edp" | "etp" | "embedding"


@dataclass(frozen=True)
class Coordinates:
    tp: int
    cp: int
    dp: int
    pp: int


@dataclass(frozen=True)
class Placement:
    """Where a communicator group's members are."""

    ranks: tuple[int, ...]
    members_per_node: int
    num_nodes: int
    num_pods: int

    @property
    def size(self) -> int:
        return len(self.ranks)


class RankLayout:
    """Rank numbering of a layout (tp-cp-dp-pp, tp innermost)."""

    def __init__(self, par: Parallelism):
        self.par = par
        self.tp, self.cp, self.dp, self.pp = par.tp, par.cp, par.dp_degree, par.pp
        self.world = self.tp * self.cp * self.dp * self.pp

    def rank(self, c: Coordinates) -> int:
        return c.tp + self.tp * (c.cp + self.cp * (c.dp + self.dp * c.pp))

    def coords(self, rank: int) -> Coordinates:
        tp, rest = rank % self.tp, rank // self.tp
        cp, rest = rest % self.cp, rest // self.cp
        dp, pp = rest % self.dp, rest // self.dp
        return Coordinates(tp, cp, dp, pp)

    def group(self, rank: int, kind: GroupKind) -> tuple[int, ...]:
        """The ranks of ``rank``'s communicator of ``kind``."""
        c = self.coords(rank)
        if kind == "tp":
            return tuple(self.rank(Coordinates(i, c.cp, c.dp, c.pp)) for i in range(self.tp))
        if kind == "cp":
            return tuple(self.rank(Coordinates(c.tp, i, c.dp, c.pp)) for i in range(self.cp))
        if kind == "dp":
            return tuple(self.rank(Coordinates(c.tp, c.cp, i, c.pp)) for i in range(self.dp))
        if kind == "dp_cp":  # gradients and ZeRO shards span data- and context-parallel ranks
            return tuple(self.rank(Coordinates(c.tp, j, i, c.pp)) for i in range(self.dp) for j in range(self.cp))
        if kind in ("ep", "edp", "etp") and self.par.experts_folded:
            return self._folded_expert_group(c, kind)
        if kind == "etp":  # etp 1: each rank holds its experts whole
            return (rank,)
        if kind in ("ep", "edp", "zshard", "zrep"):
            # Sub-groups of dp. Expert parallelism is carved out of dp (Megatron/DeepSeek): ep
            # consecutive dp ranks exchange tokens; the expert-data-parallel group holds the same
            # experts. Hybrid sharding: zshard consecutive dp ranks share one ZeRO shard set, zrep
            # are the replicas of one shard.
            size = self.par.ep if kind in ("ep", "edp") else (self.par.zero_shard_size or self.dp)
            block, pos = divmod(c.dp, size)
            inner = kind in ("ep", "zshard")
            dps = [block * size + j for j in range(size)] if inner else [b * size + pos for b in range(self.dp // size)]
            return tuple(self.rank(Coordinates(c.tp, c.cp, d, c.pp)) for d in dps)
        if kind == "pp":
            return tuple(self.rank(Coordinates(c.tp, c.cp, c.dp, i)) for i in range(self.pp))
        if kind == "embedding":  # first and last stage share the tied embedding
            return tuple(sorted({self.rank(Coordinates(c.tp, c.cp, c.dp, 0)),
                                 self.rank(Coordinates(c.tp, c.cp, c.dp, self.pp - 1))}))
        raise ValueError(f"unknown group kind {kind}")

    def _folded_expert_group(self, c: Coordinates, kind: GroupKind) -> tuple[int, ...]:
        """Expert groups folded over a stage's tp*cp*dp ranks (Megatron-Core MoE parallel folding,
        ``RankGenerator`` order "tp-ep-dp-pp" for experts with etp in the tp slot): a rank's index within its
        stage, x = tp + TP*(cp + CP*dp), splits as etp innermost, then ep, then the expert-data-parallel
        replicas (edp)."""
        etp, ep = self.par.etp_degree, self.par.ep
        stage = self.tp * self.cp * self.dp
        x = c.tp + self.tp * (c.cp + self.cp * c.dp)
        i_tp, i_ep, i_dp = x % etp, (x // etp) % ep, x // (etp * ep)
        if kind == "etp":
            xs = [j + etp * (i_ep + ep * i_dp) for j in range(etp)]
        elif kind == "ep":
            xs = [i_tp + etp * (j + ep * i_dp) for j in range(ep)]
        else:
            xs = [i_tp + etp * (i_ep + ep * j) for j in range(stage // (etp * ep))]
        return tuple(x_ + stage * c.pp for x_ in xs)

    def representative(self, stage: int) -> int:
        """The rank that stands for pipeline stage ``stage`` in symmetric mode."""
        return self.rank(Coordinates(0, 0, 0, stage))


@dataclass(frozen=True)
class LinkCapacities:
    """Per-rank port capacities in bytes/s and per-hop latencies in seconds."""

    intra_bytes_per_s: float
    inter_bytes_per_s: float
    uplink_bytes_per_s: float
    intra_latency_s: float
    inter_latency_s: float
    # NCCL's low-latency protocol across nodes (LL/LL128: less bandwidth, shorter steps), where the node has
    # fitted one (Node.nic_low_latency_efficiency / nic_low_latency_us): bytes/s per rank and seconds per hop
    inter_low_latency_bytes_per_s: float | None = None
    inter_low_latency_s: float | None = None

    def capacity_of(self, link: str) -> float:
        """Bytes/s of a link class ("nvl", "nic", "up")."""
        if link == "nvl":
            return self.intra_bytes_per_s
        if link == "nic":
            return self.inter_bytes_per_s
        if link == "up":
            return self.uplink_bytes_per_s
        raise ValueError(f"unknown link class {link}")


class Topology:
    """Nodes on a fat tree or a rail-optimised fabric (the seam for other topologies).

    A mixed cluster is several node groups (``groups``: (node spec, GPUs) in rank order, whole
    nodes each): ranks fill them in order, each rank's ports take its own group's NIC share and
    intra-node rate, and a collective over members of several groups is priced on the slowest of
    their link classes (:meth:`links_for`). ``node`` / ``num_gpus`` alone: one group."""

    def __init__(self, node: Node, fabric: FatTree | RailOptimized, num_gpus: int,
                 groups: Sequence[tuple[Node, int]] | None = None):
        if getattr(fabric, "topology", None) == "wan":  # a kind that builds Topology itself, not build_topology
            raise ConfigError("cluster.fabric", "this strategy kind prices its traffic on a data-centre fabric "
                                                "(fat-tree, rail-optimized); the wan kind is wired into the kinds "
                                                "built on the spmd planner")
        self.node = node
        self.fabric = fabric
        self.num_gpus = num_gpus
        self.gpus_per_node = node.gpus_per_node
        self.domain_gpus = node.domain_gpus
        self.groups = list(groups) if groups else [(node, num_gpus)]
        self.mixed = len(self.groups) > 1
        self._group_first_rank, self._group_first_node, self._group_first_domain = [], [], []
        rank = nodes = domains = 0
        for group_node, gpus in self.groups:
            self._group_first_rank.append(rank)
            self._group_first_node.append(nodes)
            self._group_first_domain.append(domains)
            rank += gpus
            nodes += -(-gpus // group_node.gpus_per_node)
            domains += -(-gpus // group_node.domain_gpus)
        self.num_nodes = nodes
        self.actor_ranks: dict[str, int] = {}  # actor -> rank, for per-group port capacities (bind_actors)

    def bind_actors(self, actor_ranks: dict[str, int]) -> None:
        """Name the rank behind each actor, so its ports get its own group's capacity."""
        self.actor_ranks = dict(actor_ranks)

    def group_index(self, rank: int) -> int:
        """The node group ``rank`` is in (0 for a homogeneous cluster)."""
        return bisect_right(self._group_first_rank, rank) - 1 if self.mixed else 0

    def node_spec(self, rank: int) -> Node:
        return self.groups[self.group_index(rank)][0]

    def _local(self, rank: int) -> tuple[int, Node, int]:
        g = self.group_index(rank)
        return g, self.groups[g][0], rank - self._group_first_rank[g]

    def node_of(self, rank: int) -> int:
        """The NVLink domain of ``rank``: its node, or its rack where NVLink spans nodes (NVL72)."""
        if not self.mixed:
            return rank // self.domain_gpus
        g, node, local = self._local(rank)
        return self._group_first_domain[g] + local // node.domain_gpus

    def physical_node_of(self, rank: int) -> int:
        if not self.mixed:
            return rank // self.gpus_per_node
        g, node, local = self._local(rank)
        return self._group_first_node[g] + local // node.gpus_per_node

    def pod_of(self, rank: int) -> int:
        pod = self.fabric.pod_size_nodes
        return self.physical_node_of(rank) // pod if pod else 0

    def placement(self, ranks: tuple[int, ...]) -> Placement:
        nodes = {self.node_of(r) for r in ranks}
        pods = {self.pod_of(r) for r in ranks}
        per_node = max(1, len(ranks) // len(nodes))
        return Placement(tuple(ranks), per_node, len(nodes), len(pods))

    def send_links(self, src: int, dst: int) -> tuple[str, ...]:
        """The link classes a point-to-point send from rank ``src`` to rank ``dst`` crosses: NVLink inside
        one NVLink domain; across domains the NICs, and the spine (``up``) between pods."""
        if self.node_of(src) == self.node_of(dst):
            return ("nvl",)
        return ("nic", "up") if self.pod_of(src) != self.pod_of(dst) else ("nic",)

    def intra_slowdown(self, ranks: tuple[int, ...]) -> float:
        """Factor on the intra-node bytes of a group whose node joins its GPUs by per-pair links
        (hybrid cube mesh, NVLink bridges): the ring over the members on the first member's node
        (simulator/cost/intra_node.py); 1 on a switch or bus."""
        _, node, _ = self._local(ranks[0])
        if node.intra_node.link_counts is None or node.domain_gpus != node.gpus_per_node:
            return 1.0
        first = self.node_of(ranks[0])
        local = tuple(sorted({self._local(r)[2] % node.gpus_per_node for r in ranks if self.node_of(r) == first}))
        return group_slowdown(node.intra_node, local)

    @cached_property
    def links(self) -> LinkCapacities:
        """The first (or only) group's link capacities."""
        return self.group_links(0)

    @cache  # noqa: B019 -- a few groups per topology, which lives as long as its plan
    def group_links(self, g: int) -> LinkCapacities:
        """Per-rank port capacities and hop latencies of node group ``g``."""
        node, fabric = self.groups[g][0], self.fabric
        intra = node.intra_node.bandwidth_per_gpu_gb_per_s * 1e9 * node.intra_node.collective_efficiency
        if node.nics_per_node:
            inter = (node.nics_per_node * node.nic_bandwidth_gbit_per_s / 8 * 1e9 * node.nic_efficiency
                     / node.gpus_per_node)
        else:
            inter = 0.0
        if inter == 0.0 and (self.num_gpus > self.domain_gpus or self.mixed):
            field = f"cluster.groups.{g}.node.nics_per_node" if self.mixed else "cluster.node.nics_per_node"
            raise ConfigError(field, "a multi-node cluster needs NICs")
        if isinstance(fabric, RailOptimized):
            hops = 1 if self.num_nodes <= fabric.rail_group_nodes else 3  # leaf of the rail; leaf-spine-leaf between units
        else:
            hops = 2 * fabric.levels - 1  # worst-case switches on a path in a folded Clos
        switches_s = hops * fabric.switch_latency_us * 1e-6
        low_latency = node.nic_low_latency_efficiency is not None and node.nic_low_latency_us is not None and inter
        return LinkCapacities(
            intra_bytes_per_s=intra,
            inter_bytes_per_s=inter or 1.0,
            uplink_bytes_per_s=(inter or 1.0) / fabric.oversubscription,
            intra_latency_s=node.intra_node.latency_us * 1e-6,
            inter_latency_s=node.nic_latency_us * 1e-6 + switches_s,
            inter_low_latency_bytes_per_s=(inter / node.nic_efficiency * node.nic_low_latency_efficiency
                                           if low_latency else None),
            inter_low_latency_s=node.nic_low_latency_us * 1e-6 + switches_s if low_latency else None,
        )

    def links_of(self, rank: int) -> LinkCapacities:
        return self.group_links(self.group_index(rank)) if self.mixed else self.links

    def groups_of(self, ranks: tuple[int, ...]) -> tuple[int, ...]:
        """The node groups that ``ranks`` touch (sorted)."""
        if not self.mixed:
            return (0,)
        return tuple(sorted({self.group_index(r) for r in ranks}))

    def links_for(self, ranks: tuple[int, ...]) -> LinkCapacities:
        """The link classes a collective over ``ranks`` runs at: its members' group's, or over several
        groups the slowest port of each class and the longest hop (a ring or tree moves at the pace
        of its slowest member)."""
        return self._joined_links(self.groups_of(ranks)) if self.mixed else self.links

    @cache  # noqa: B019
    def _joined_links(self, groups: tuple[int, ...]) -> LinkCapacities:
        if len(groups) == 1:
            return self.group_links(groups[0])
        each = [self.group_links(g) for g in groups]
        return LinkCapacities(*(min(getattr(lk, f) for lk in each) for f in
                                ("intra_bytes_per_s", "inter_bytes_per_s", "uplink_bytes_per_s")),
                              *(max(getattr(lk, f) for lk in each) for f in ("intra_latency_s", "inter_latency_s")))

    def port_capacity(self, port: str) -> float:
        """Bytes/s of a port named ``{actor}:{class}_{dir}`` (the actor's group's, see :meth:`bind_actors`)."""
        actor, name = port.rsplit(":", 1)
        kind = name.split("_", 1)[0]
        links = self.links_of(self.actor_ranks[actor]) if self.mixed and actor in self.actor_ranks else self.links
        if kind == "nvl":
            return links.intra_bytes_per_s
        if kind == "nic":
            return links.inter_bytes_per_s
        if kind == "up":
            return links.uplink_bytes_per_s
        raise ValueError(f"unknown port {port}")


def build_topology(node: Node, fabric, num_gpus: int, groups: Sequence[tuple[Node, int]] | None = None) -> Topology:
    """The topology of a fabric spec: a wide-area one (regions, simulator/cost/wan.py) or a data-centre
    fabric (fat tree, rail-optimised); ``groups``: a mixed cluster's node groups."""
    if getattr(fabric, "topology", None) == "wan":
        from simulator.cost.wan import wan_topology

        return wan_topology(node, fabric, num_gpus, groups)
    return Topology(node, fabric, num_gpus, groups=groups)


def send_demands(sender: str, receiver: str, links: tuple[str, ...], nbytes: float) -> dict[str, float]:
    """The flow network's demands of one point-to-point send over ``links`` (:meth:`Topology.send_links`):
    ``nbytes`` on the sender's transmit and the receiver's receive side of each, link by link."""
    demands = {}
    for link in links:
        demands[f"{sender}:{link}_tx"] = nbytes
        demands[f"{receiver}:{link}_rx"] = nbytes
    return demands


# ---- NVLink domains larger than a node (GB200/GB300 NVL72): which groups straddle two racks ----------------------

#: The communicator groups whose traffic rides NVLink when they sit inside one domain and the NICs when they
#: straddle two (every micro-batch's TP collectives, CP ring sends, EP all-to-alls): the groups the placement
#: note counts. Data-parallel and pipeline groups cross domains on any multi-rack job.
PLACED_GROUP_KINDS: tuple[GroupKind, ...] = ("tp", "cp", "ep")


def group_spans(par: Parallelism, kind: GroupKind) -> list[tuple[int, int]]:
    """Every distinct ``kind`` group of the layout as (lowest rank, highest rank), in rank order. Each
    group lies inside one pipeline stage (tp, cp, ep keep the stage; :class:`RankLayout`), and each stage
    holds the same groups shifted by the stage's rank count, so only stage 0 is walked (O(ranks/pp))."""
    layout = RankLayout(par)
    stage = layout.tp * layout.cp * layout.dp
    seen = bytearray(stage)
    first: list[tuple[int, int]] = []
    for rank in range(stage):
        if seen[rank]:
            continue
        members = layout.group(rank, kind)
        for m in members:
            seen[m] = 1
        first.append((min(members), max(members)))
    return [(lo + s * stage, hi + s * stage) for s in range(layout.pp) for lo, hi in first]


def straddling(spans: list[tuple[int, int]], domain_gpus: int) -> int:
    """How many of the groups ``spans`` (:func:`group_spans`) cross a boundary of ``domain_gpus``-GPU NVLink
    domains filled in rank order (domain = rank // domain_gpus, as :meth:`Topology.node_of`)."""
    return sum(lo // domain_gpus != hi // domain_gpus for lo, hi in spans)


def placement_note(scenario, used: int | None = None, physical: int | None = None) -> str | None:
    """The NOTE ``clustersim simulate`` prints where TP, CP or EP groups of the layout straddle NVLink
    domains that span several nodes (GB200/GB300 NVL72 racks): how many of which kind, and which value of
    ``cluster.gpus_used_per_nvlink_domain`` keeps every one inside one domain (the largest such multiple of
    the node's GPUs, none where a group is wider than the domain). Counted, not simulated: a straddling
    group's traffic runs at the NIC pace (:meth:`Topology.send_links`, :meth:`Topology.placement`).
    ``used`` / ``physical``: the field's value and the node's own domain size, where the field is set.
    None: a one-node domain, a job inside one domain, a mixed cluster, or nothing straddles."""
    node = scenario.node
    physical = physical or node.domain_gpus
    domain = node.domain_gpus
    if scenario.mixed or physical <= node.gpus_per_node or scenario.num_gpus <= domain:
        return None
    par = scenario.parallelism
    sizes = {"tp": par.tp, "cp": par.cp, "ep": par.ep}
    spans = {kind: group_spans(par, kind) for kind in PLACED_GROUP_KINDS if sizes[kind] > 1}
    counts = {kind: straddling(s, domain) for kind, s in spans.items()}
    if not any(counts.values()):
        return None
    said = ", ".join(f"{counts[k]} of {len(spans[k])} {k.upper()}-{sizes[k]} groups" for k in spans if counts[k])
    where = (f"{used} GPUs used of each {physical}-GPU NVLink domain (cluster.gpus_used_per_nvlink_domain)"
             if used else f"ranks fill each {physical}-GPU NVLink domain of {node.name} in order")
    keeps = [n for n in range(physical, 0, -node.gpus_per_node)
             if not any(straddling(s, n) for s in spans.values())]
    if keeps:
        fix = (f"cluster.gpus_used_per_nvlink_domain: {keeps[0]} ({keeps[0] // node.gpus_per_node} of each domain's "
               f"{physical // node.gpus_per_node} nodes) keeps every one inside one domain")
    else:
        fix = "no value of cluster.gpus_used_per_nvlink_domain keeps them all inside one domain (a group is wider)"
    return (f"{said} span more than one NVLink domain ({where}): their traffic between domains is priced at the "
            f"NIC pace; {fix}")
