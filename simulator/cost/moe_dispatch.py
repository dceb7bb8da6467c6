"""Expert-parallel token dispatch that crosses each node once per token (DeepEP).

DeepSeek-V3 (arXiv:2412.19437 Sec. 3.2.2) and its DeepEP library dispatch a token to the experts of
another node in two hops: over InfiniBand once, to the GPU with the same local index on that node,
then over NVLink to each of its experts' GPUs there; the combine returns the same way (NVLink
gather, one IB transfer per node). A plain all-to-all sends one copy per expert, so a token whose
top-k experts share a node crosses that node's IB link several times.

Per rank, for ``payload`` = its token copies (tokens x top_k x hidden x bytes, what the plain
all-to-all moves) over an expert-parallel group of ``k`` nodes with ``g`` members each:

- IB: each token once per remote node holding one of its experts. With experts chosen uniformly
  (balanced routing; group- or node-limited routing, which bounds the nodes further, is not
  modelled), a given node receives none of a token's ``top_k`` copies with probability
  (1 - 1/k)^top_k, so the expected remote nodes are (k - 1)·(1 - (1 - 1/k)^top_k) and the IB bytes
  payload / top_k times that (at most the plain all-to-all's (k-1)/k of the copies: k >= 2);
- NVLink: every copy whose expert is on another GPU of the node it arrives at, (g - 1)/g of the
  copies (forwarded remote copies and the node's own alike; by symmetry each rank forwards as much
  as it is forwarded).

Latency as the plain all-to-all's (one inter-node hop plus a step per peer). No DeepEP kernel was
measured: the bytes run at the links' catalog rates, as every other collective without a law.
"""

from __future__ import annotations

from simulator.cost.collectives import CollectiveCost
from simulator.cost.topology import LinkCapacities, Placement


def expected_remote_nodes(num_nodes: int, top_k: int) -> float:
    """Expected number of other nodes a token's ``top_k`` uniformly chosen experts live on."""
    if num_nodes <= 1:
        return 0.0
    return (num_nodes - 1) * (1.0 - (1.0 - 1.0 / num_nodes) ** top_k)


def node_dedup_all_to_all(payload_bytes: float, top_k: int, placement: Placement,
                          links: LinkCapacities) -> CollectiveCost:
    """One dispatch (or combine) of ``payload_bytes`` token copies per rank (module docstring)."""
    n, g, k = placement.size, placement.members_per_node, placement.num_nodes
    if n <= 1 or payload_bytes <= 0:
        return CollectiveCost("none", 0.0, {})
    by_link: dict[str, float] = {}
    if k > 1:
        by_link["nic"] = payload_bytes / top_k * expected_remote_nodes(k, top_k)
        if placement.num_pods > 1:
            by_link["up"] = by_link["nic"]
    if g > 1:
        by_link["nvl"] = payload_bytes * (g - 1) / g
    return CollectiveCost("node_dedup", links.inter_latency_s + (n - 1) * 1e-6, by_link)
