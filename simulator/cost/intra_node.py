"""Ring bandwidth inside a node whose GPUs are not all joined alike.

A switch (NVSwitch) or a bus gives every GPU the same port rate to every other, which is what
``IntraNodeFabric.bandwidth_per_gpu_gb_per_s`` says. A point-to-point NVLink mesh does not: in the
*hybrid cube mesh* of the DGX-1V / AWS p3.16xlarge each V100 spends its 6 NVLink2 links on 4 of the
7 others (two quads, each fully joined, one or two links per pair, plus one link to its peer in the
other quad), and 3 pairs have no link at all (their traffic crosses PCIe and the host bridge).
Consumer cards joined by NVLink bridges form pairs.

NCCL runs a collective over such links as rings, one per *channel*, each a directed Hamiltonian
cycle over the group's GPUs; a link direction carries one ring at its full rate (NCCL's topology
search, src/graph/search.cc, packs as many rings as the links hold). So a group inside the node
moves bytes at ``rings · link_bandwidth`` per GPU, ``rings`` being the most edge-disjoint directed
rings the link counts hold over its members, or at the unlinked (PCIe) rate where they hold none:
one ring then crosses PCIe on its missing hop, which sets its pace. Two GPUs are the ring of two:
a pair with c links exchanges at c links' rate. This is an exact packing (n <= 8 members: at most
5,040 cycles), not NCCL's heuristic, so it is an upper bound on the rings NCCL finds.

``group_slowdown`` turns that into the factor on the bytes a rank moves through its intra-node port
(whose capacity is the full ``bandwidth_per_gpu_gb_per_s``): port rate / ring rate, ≥ 1.
"""

from __future__ import annotations

from functools import cache
from itertools import permutations

from hardware_specs.schema import IntraNodeFabric


def _cycles(members: tuple[int, ...], links: tuple[tuple[int, ...], ...]) -> list[tuple[tuple[int, int], ...]]:
    """Every directed Hamiltonian cycle over ``members`` on linked pairs, as its directed edges."""
    first, rest = members[0], members[1:]
    cycles = []
    for order in permutations(rest):
        ring = (first, *order)
        edges = tuple((ring[i], ring[(i + 1) % len(ring)]) for i in range(len(ring)))
        if all(links[a][b] > 0 for a, b in edges):
            cycles.append(edges)
    return cycles


def _max_packing(cycles, capacity: dict[tuple[int, int], int], start: int, bound: int) -> int:
    """Most cycles (with repetition) from ``cycles[start:]`` within the edge capacities (depth-first)."""
    best = 0
    for index in range(start, len(cycles)):
        edges = cycles[index]
        if all(capacity[e] > 0 for e in edges):
            for e in edges:
                capacity[e] -= 1
            best = max(best, 1 + _max_packing(cycles, capacity, index, bound - 1))
            for e in edges:
                capacity[e] += 1
            if best >= bound:
                break
    return best


@cache
def ring_count(members: tuple[int, ...], links: tuple[tuple[int, ...], ...]) -> int:
    """The most edge-disjoint directed rings over ``members`` (node-local GPU indices) that the
    per-pair link counts hold (each link is full duplex: one ring per direction per link)."""
    members = tuple(sorted(set(members)))
    if len(members) < 2:
        return 0
    if len(members) == 2:
        a, b = members
        return links[a][b]
    cycles = _cycles(members, links)
    capacity = {(a, b): links[a][b] for a in members for b in members if a != b}
    bound = min(sum(links[a][b] for b in members if b != a) for a in members)
    return _max_packing(cycles, capacity, 0, bound)


def ring_bandwidth_gb_per_s(fabric: IntraNodeFabric, members: tuple[int, ...]) -> float:
    """One-direction rate per GPU of a ring (or a pair's exchange) over ``members`` inside the node."""
    if fabric.link_counts is None:
        return fabric.bandwidth_per_gpu_gb_per_s
    links = tuple(tuple(row) for row in fabric.link_counts)
    rings = ring_count(tuple(members), links)
    return max(rings * fabric.link_bandwidth_gb_per_s, fabric.unlinked_pair_bandwidth_gb_per_s)


def group_slowdown(fabric: IntraNodeFabric, members: tuple[int, ...]) -> float:
    """Factor (≥ 1) on the bytes a group member moves through its intra-node port: the port's
    rate over the group's ring rate (1 on a switch or bus)."""
    if fabric.link_counts is None or len(set(members)) < 2:
        return 1.0
    return max(1.0, fabric.bandwidth_per_gpu_gb_per_s / ring_bandwidth_gb_per_s(fabric, members))
