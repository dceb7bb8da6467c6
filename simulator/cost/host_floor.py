"""Host-side floors: a pipeline stage whose pipeline neighbour is on another node; eager dispatch.

Some frameworks cannot get a decoder layer's work done faster than a fixed host-side time while
their pipeline sends and receives cross the inter-node network. nanotron on AWS p5 / EFA (the
Ultra-Scale Playbook sweep) shows it plainly: with pipeline stages on different nodes, a step
takes a fixed time per decoder layer of a stage and micro-batch (fitted: ~9 ms at tp 1-2, 14 / 22 /
47 ms at tp 4 / 8 / 16), whatever the micro-batch size and model width (1B to 70B alike), until the
GPU work is longer; on one node, or without
pipelining, the same layouts run at their kernel speed. The Playbook does not say why (a host
thread starved by the network progress threads, or each tensor-parallel collective waiting for
the last of its tp ranks' hosts, would both look like this): the constants are fitted, and their
spec (``hardware_specs.schema.CrossNodePipelineFloor``) records where.

The GPU's kernels run while the host is stalled, so the floor does not add to them: a layer's
passes for one micro-batch take the longer of their device time and the floor (the roofline of
a host-bound loop). The planner applies it per layer kind: with ``device_s`` the isolated time
of a layer's forward + backward (+ recompute) and ``floor_s`` the floor, every pass of that
layer is stretched by ``max(1, floor_s / device_s)``, so the micro-batch's passes together take
``max(device_s, floor_s)`` whichever way the floor splits between forward and backward.

**Eager dispatch** (``host_dispatch_us_per_kernel``): a framework that runs PyTorch eager ops
(Megatron-DeepSpeed) issues every kernel and collective from Python, one every host time. The GPU
runs a kernel once it is issued and the one before it has ended, so a pass that starts with an
empty launch queue ends at ``max_j (j·host + sum of the kernel times from the j-th on)``
(:func:`issue_bound_s`): the host's issue time where the kernels are short, the kernels' where they
are long, and more than either where short and long kernels mix. Each pass of a layer (forward,
recomputed forward, backward) is taken to start with an empty queue (the host does not run ahead of
the GPU across passes; fitted: on vTrain's fit half this per-pass bound gives median |error| 6.3%,
a bound over the whole micro-batch, ``max(kernels x host, GPU time)``, 8.1%, and the launch cost
added to every kernel 11.5%). vTrain's single-node Megatron-DeepSpeed rows show the floor plainly:
at micro-batch 1-2 on h 1024 the time per micro-batch is ~3.1-3.4 ms per decoder layer whatever the
micro-batch size and tensor-parallel degree (validation/modern/vtrain.py). The count is the layer
graph's ops (one per priced kernel or collective): a fitted host time per op stands for the
framework's real kernels behind each. The same stretch applies, with the floor the larger of the
cross-node and the eager one where both are set.

**A fixed time per MoE layer** (``moe_layer_fixed_us``): Megatron-Core's MoE layer does work per layer and
micro-batch that neither its FLOPs nor its bytes describe -- the router's top-k and bookkeeping kernels, the
token dispatcher's count exchange (an all-gather of tokens per expert over the tp x ep group), index and split
computations and the host's wait for the counts before the expert all-to-all
(``MoEAlltoAllTokenDispatcher.preprocess`` / ``_maybe_dtoh_and_synchronize``, megatron-core 0.14). NeMo's Qwen3 MoE
rows leave about the same time per MoE layer and micro-batch over the simulated step (2.1-3.1 ms, forward and
backward together) whatever the model width, expert-parallel size, node count, micro-batch size and dispatcher
(validation/modern/moe_audit.py); so it is a constant per layer pass, fitted on the NeMo fit half. An MoE
layer's passes take their isolated time plus the constant, spread over the passes as the other floors are
(the stretch below); a dense layer is not touched.
"""

from __future__ import annotations

from hardware_specs.schema import CrossNodePipelineFloor
from simulator.cost.topology import Coordinates, RankLayout, Topology


def has_cross_node_neighbour(layout: RankLayout, topology: Topology, rank: int) -> bool:
    """Whether the rank's previous or next pipeline stage (same tp/cp/dp coordinates) is on
    another node."""
    c = layout.coords(rank)
    node = topology.node_of(rank)
    for stage in (c.pp - 1, c.pp + 1):
        if 0 <= stage < layout.par.pp:
            neighbour = layout.rank(Coordinates(c.tp, c.cp, c.dp, stage))
            if topology.node_of(neighbour) != node:
                return True
    return False


def floor_per_layer_s(spec: CrossNodePipelineFloor | None, layout: RankLayout, topology: Topology, rank: int,
                      remote: bool = False) -> float:
    """The floor on one decoder layer's forward + backward of one micro-batch on ``rank``
    (0 without a spec, without pipelining, or with both neighbours on the rank's node; ``remote``: the
    stages always reach each other over the network, as a swarm's peers, each its own machine)."""
    if spec is None or layout.par.pp == 1 or not (remote or has_cross_node_neighbour(layout, topology, rank)):
        return 0.0
    return spec.per_layer_s(layout.par.tp)


def issue_bound_s(kernel_s: list[float], host_s: float) -> float:
    """Seconds until the last of a pass's kernels ends when the host issues one every ``host_s``
    from the pass's start (an empty launch queue) and the GPU runs them in order, each taking
    ``kernel_s[i]``: kernel i starts at the later of its issue and the previous kernel's end, so the
    pass ends at ``max_j (j·host_s + sum_{i>=j} kernel_s[i])`` (j = 1..n) -- between the longer and
    the sum of the host's and the GPU's time, by the order of short and long kernels."""
    end = 0.0
    for i, seconds in enumerate(kernel_s, start=1):
        end = max(end, i * host_s) + seconds
    return end


def stretch(device_s: float, floor_s: float) -> float:
    """The factor on a layer's passes: ``max(1, floor_s / device_s)``."""
    if floor_s <= 0 or device_s <= 0 or floor_s <= device_s:
        return 1.0
    return floor_s / device_s
