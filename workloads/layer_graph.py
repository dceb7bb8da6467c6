"""The layer graph: the one description of a network that compute, memory and every strategy read.

A :class:`LayerGraph` is a DAG of :class:`Layer` s in topological order (usually a chain), built
for one micro-batch on one rank after a layout's shard (a transformer builder takes the layout's
``ShardShape``; a CNN builder takes the micro-batch and precision). Each layer holds

- its kernels: ``forward`` and ``backward`` :class:`~workloads.graph.Op` s in execution order
  (GEMMs and convolutions as implicit GEMMs with M×N×K, memory-bound ops, attention, collectives
  of the layout), from which FLOPs and HBM bytes are summed;
- ``params``: the parameters this rank holds for the layer, the sum of its forward ops' (each op's
  weight shape k x n, bias, norm or embedding tables: :attr:`workloads.graph.Op.params`; derived, never
  stated beside the ops), plus ``stated_params``, what a measured per-layer profile states for a layer
  whose kernels it does not know (0 for every built layer); ``expert_params`` of them routed experts
  (the ops of the "experts" GEMM class), sharded over the expert-parallel group and reduced over the
  expert-data-parallel one; ``frozen_params`` of them frozen (ops marked ``Op.frozen``: LoRA's base,
  workloads/lora.py), held but without gradients or optimizer state (``trained_params`` the rest);
- ``saved_bytes``: the activation bytes it keeps for its backward (per micro-batch) without
  recompute; ``saved_bytes_selective`` what it keeps under selective recompute (the attention
  core and, for MLA, the norms and up-projections dropped; None: nothing selective to drop),
  ``saved_bytes_selective_op`` what it keeps under torchtitan's per-op selective checkpointing
  (None: everything, the policy is stated for transformer blocks only) and
  ``checkpoint_bytes`` what it keeps under full recompute (its input; None: the output bytes of
  its inputs). :meth:`Layer.kept_bytes` picks one by recompute mode;
- ``output_bytes``: the bytes it hands to each consumer (what a pipeline sends across a stage
  boundary after it);
- ``splittable``: which dimensions of its iteration space may be split over devices (batch,
  channels, heads, reduction, spatial, sequence, experts), for per-layer parallelism;
- ``flops_counted``: False for a layer whose kernels are unknown (a block measured as a whole in
  a per-layer profile, whose line gives no shapes), so the model's counted FLOPs leave it out (it
  counts 0) and the run says so in a NOTE (:meth:`LayerGraph.flops_counted_layers`,
  workloads/networks/profiles.py ``uncounted_flops_note``); True where its ops are its kernels (none,
  for a view);
- ``window``: for a sliding-window layer (convolution, pooling), ``(kernel_h, kernel_w, stride_h,
  stride_w, padding_h, padding_w)``, from which a spatial split's halo widths follow
  (simulator/strategies/per_layer/halo.py); None for every other layer;
- ``piece_of``: for a view that is one piece of a split of its input (``chunk``, ``split``,
  ``unbind``), the split's name: the pieces count as one reader of the input; ``passes_gradient``
  False for a layer that reads only its input's shape (PipeDream's ``Size`` node): no reader;
- ``inputs``: the names of the layers it reads (empty for the graph's first layer, and for an
  embedding of a second input such as a translation model's target tokens);
- ``measured_forward_s`` / ``measured_backward_s``: for a graph read from a measured per-layer
  profile (``workloads.networks.profiles``), the layer's measured times at this micro-batch, which
  the compute model uses instead of pricing the ops (``ComputeModel.layer_time_s``).

A general graph split by tensor parallelism (``workloads.tensor_parallel``) records the degree in
``tensor_parallel``; a transformer's blocks carry their own split and leave it at 1.

A graph may pin its first ``prologue`` layers to the first pipeline chunk and its last
``epilogue`` layers to the last (a transformer's embedding and LM head): a pipeline splits only
the layers between; a CNN's graph pins none.

**Gradient sums at a fan-out.** A tensor read by k layers (a residual block's input, an Inception
branch point, a concatenation read by the next module's branches) receives k gradients in the
backward, and autograd adds them before the producer's backward runs (PyTorch
``torch/csrc/autograd/input_buffer.cpp``, ``InputBuffer::add``: the first gradient is kept, each
later one added to it): k - 1 element-wise adds over the tensor, each reading two and writing one
(3 x its bytes). :func:`with_gradient_sums` puts them at the head of the producer's ``backward``
(``<layer>.gradient_sum``, the ``gradient_sum`` memory-kernel class), from the graph's wiring, for
every graph with a fan-out (the network builder's, a traced PyTorch module's, a graph.txt's, a
DeepPool profile's; a decoder transformer's graph is a chain of blocks whose residual adds are
inside each block's kernels, workloads/graph.py); a layer with measured times keeps them (its ops carry 0 s: the
measured backward holds whatever autograd ran).

Parameters, FLOPs and activation memory of a whole model are the sums over this description
(:meth:`LayerGraph.total_params`, :meth:`forward_flops`, :meth:`step_flops` — MFU's numerator, by
the graph's ``model_flops_rule`` — :meth:`saved_bytes`); nothing else describes a layer again. A
transformer's counts too (workloads/counting.py sums its graph; the literature's closed forms are
test oracles in validation/closed_forms.py). ``check`` refuses cycles, unknown inputs, duplicate names, unknown
kinds and shapes that do not chain, naming the layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from simulator.errors import ConfigError
from workloads.graph import (
    MODULES_PREFIX,
    PARTIAL_FULL_PREFIX,
    ModelFlops,
    Op,
    full_units,
    gemm_class,
    modules_of_mode,
    partial_full_of,
    recompute_ops_of,
)

GRADIENT_SUM = "gradient_sum"   # the op-name token (memory-kernel class) of a fan-out's gradient add

#: How a graph's model FLOPs (MFU's numerator) count the backward (:meth:`LayerGraph.step_flops`):
#: ``counted``: forward + backward as the kernels count them (a CNN's dgrad and wgrad, an LSTM's);
#: ``three_forward``: the backward as twice the forward, 3 x forward in all (Korthikanti et al. 2022
#: Eq. 7, PaLM (Chowdhery et al. 2022) App. B): the attention core counted at its full s x s (no causal
#: halving) and FlashAttention's re-computed scores in the backward left to the hardware FLOPs.
ModelFlopsRule = Literal["counted", "three_forward"]
FLOPS_KINDS = ("gemm", "attention")   # ops whose FLOPs count: GEMMs, convolutions, the attention core

SplitDim = Literal["batch", "channels", "heads", "reduction", "spatial", "sequence", "experts"]
SPLIT_DIMS: frozenset[str] = frozenset(SplitDim.__args__)

#: Layer kinds a graph may hold. A builder or an importer that meets something else maps it
#: to one of these or refuses the model naming the layer.
LAYER_KINDS: frozenset[str] = frozenset({
    "embedding", "transformer_block", "lm_head", "loss",
    "conv2d", "conv_transpose2d", "linear", "batchnorm", "layernorm", "groupnorm",
    "relu", "activation", "maxpool", "avgpool", "adaptive_avgpool", "dropout",
    "add", "concat", "flatten", "upsample", "softmax",
    "lstm", "attention", "patch_embedding", "mlp_block", "other",
})


#: (forward ops, params, expert params) by the ops tuple's id: a transformer's blocks of one kind share
#: one tuple, summed once (the tuple is kept with its sums, so its id is not reused while cached)
_PARAMS_OF_OPS: dict[int, tuple[tuple[Op, ...], float, float, float]] = {}
_PARAMS_CACHE_SIZE = 4096


def _forward_params(forward: tuple[Op, ...]) -> tuple[tuple[Op, ...], float, float, float]:
    """(``forward``, the parameters its ops hold, those of them in routed-expert GEMMs, those of them
    frozen: ``Op.frozen``, LoRA's base), kept in ``_PARAMS_OF_OPS``."""
    params = expert = frozen = 0
    for op in forward:
        held = op.params
        if held:
            params += held
            if gemm_class(op) == "experts":
                expert += held
            if op.frozen:
                frozen += held
    if len(_PARAMS_OF_OPS) >= _PARAMS_CACHE_SIZE:
        _PARAMS_OF_OPS.clear()
    hit = _PARAMS_OF_OPS[id(forward)] = (forward, params, expert, frozen)
    return hit


@dataclass(frozen=True)
class Layer:
    """One layer of the graph for one micro-batch on one rank (see the module docstring)."""

    name: str
    kind: str
    forward: tuple[Op, ...] = ()
    backward: tuple[Op, ...] = ()
    stated_params: float = 0      # parameters no op carries: a profiled layer's, from its file (module docstring)
    saved_bytes: float = 0.0
    output_bytes: float = 0.0
    saved_bytes_selective: float | None = None
    saved_bytes_selective_op: float | None = None  # kept under recompute: selective_op (None: all of saved)
    # (bytes, ((module, share dropped), ...)) of each saved tensor a Megatron-Core recompute module drops
    # (recompute_modules; workloads/transformer_graph.py _module_drops); () for a layer none drops
    module_drops: tuple[tuple[float, tuple[tuple[str, float], ...]], ...] = ()
    checkpoint_bytes: float | None = None
    inputs: tuple[str, ...] = ()
    splittable: frozenset[str] = frozenset({"batch"})
    input_shape: tuple[int, ...] | None = None   # per sample, e.g. (C, H, W) or (tokens, hidden)
    output_shape: tuple[int, ...] | None = None
    measured_forward_s: float | None = None      # a profiled time that replaces the priced ops
    measured_backward_s: float | None = None
    window: tuple[int, int, int, int, int, int] | None = None  # (kh, kw, sh, sw, ph, pw) of a conv / pool
    flops_counted: bool = True                   # False: kernels unknown (a profiled block), FLOPs not counted
    piece_of: str | None = None                  # a view that is one piece of this split (chunk/split/unbind)
    passes_gradient: bool = True                 # False: reads only its input's shape (a graph.txt Size node)
    saved_input_bytes: float = 0.0               # of saved_bytes, the layer's own input (0: not saved, or an
                                                 # earlier layer saved that storage); set where it matters:
                                                 # an attention layer's input is the residual stream
    params: float = field(init=False)          # the forward ops' parameters + stated_params
    expert_params: float = field(init=False)   # of them, the routed experts' ("experts" GEMMs)
    frozen_params: float = field(init=False)   # of them, frozen ones (Op.frozen: LoRA's base): held, never trained

    def __post_init__(self) -> None:
        # summed when the layer is made (memory and the planner read them for every layout); a copy made
        # by dataclasses.replace with other ops sums its own
        hit = _PARAMS_OF_OPS.get(id(self.forward))
        if hit is None or hit[0] is not self.forward:
            hit = _forward_params(self.forward)
        object.__setattr__(self, "params", hit[1] + self.stated_params if self.stated_params else hit[1])
        object.__setattr__(self, "expert_params", hit[2])
        object.__setattr__(self, "frozen_params", hit[3])

    @property
    def trained_params(self) -> float:
        """The parameters that get gradients and optimizer state: all but the frozen ones (stated ones are trained)."""
        return self.params - self.frozen_params

    @property
    def forward_flops(self) -> float:
        return sum(op.flops for op in self.forward)

    @property
    def backward_flops(self) -> float:
        return sum(op.flops for op in self.backward)

    def kept_bytes(self, recompute: str, input_bytes: float = 0.0) -> float:
        """Activation bytes the layer keeps for its backward under ``recompute`` ("none",
        "selective", "selective_op", "full", or a Megatron-Core module list "selective:<modules>",
        workloads/graph.py ``modules_mode``); ``input_bytes``: what its inputs hand it (the
        full-recompute checkpoint when the layer states none). Full recompute of a layer that is
        its own checkpoint unit (a transformer block); a graph of smaller layers checkpoints
        groups of them (simulator/memory/checkpoints.py)."""
        if recompute == "full" or recompute.startswith(PARTIAL_FULL_PREFIX):  # a layer that is checkpointed
            return self.checkpoint_bytes if self.checkpoint_bytes is not None else min(self.saved_bytes, input_bytes)
        if recompute == "selective" and self.saved_bytes_selective is not None:
            return self.saved_bytes_selective
        if recompute == "selective_op" and self.saved_bytes_selective_op is not None:
            return self.saved_bytes_selective_op
        if self.module_drops and recompute.startswith(MODULES_PREFIX):
            # Megatron-Core recompute_modules: each tensor loses the share its listed modules drop (shares of
            # nested modules overlap: capped at the whole tensor)
            modules = modules_of_mode(recompute)
            dropped = sum(nbytes * min(1.0, sum(share for module, share in drops if module in modules))
                          for nbytes, drops in self.module_drops)
            return self.saved_bytes - dropped
        return self.saved_bytes

    def recompute_ops(self, recompute: str) -> tuple[Op, ...]:
        """Ops re-run before the backward: the whole forward (full), the ops marked for selective
        recompute (the attention core; with MLA also the norms and up-projections), torchtitan's
        per-op policy (selective_op: workloads.graph.op_sac_recompute)."""
        return recompute_ops_of(self.forward, recompute)


@dataclass(frozen=True)
class LayerGraph:
    """A network as layers in topological order, built for ``micro_batch`` samples on one rank.

    ``sample``: what one sample is ("sequence" for language models, "image", "sentence"...);
    ``seq_length``: tokens per sample where the model has a sequence (None otherwise)."""

    name: str
    layers: tuple[Layer, ...]
    micro_batch: int
    sample: str = "sequence"
    seq_length: int | None = None
    prologue: int = 0
    epilogue: int = 0
    tensor_parallel: int = 1   # the tp degree a general graph was split for (workloads/tensor_parallel.py)
    model_flops_rule: ModelFlopsRule = "counted"
    # parameters a pipeline's last stage holds again when the first and last layers share a weight, per
    # rank: a transformer's tied word embedding (Megatron keeps a copy for the LM head on the last stage
    # when pp > 1 and sums the two copies' gradients); 0 for a graph without one
    tied_copy_params: float = 0.0
    _index: dict[str, int] = field(default_factory=dict, compare=False, repr=False)
    _input_bytes: dict[tuple[str, ...], float] = field(default_factory=dict, compare=False, repr=False)
    _flops: dict[str, tuple[float, float]] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        # fresh caches: a copy (dataclasses.replace) is handed the original's dicts, which it must not share
        object.__setattr__(self, "_index", {layer.name: i for i, layer in enumerate(self.layers)})
        object.__setattr__(self, "_input_bytes", {})
        object.__setattr__(self, "_flops", {})

    def layer(self, name: str) -> Layer:
        return self.layers[self._index[name]]

    def predecessors(self, layer: Layer) -> tuple[Layer, ...]:
        return tuple(self.layers[self._index[n]] for n in layer.inputs)

    def total_params(self) -> int:
        return sum(layer.params for layer in self.layers)

    def trained_params(self) -> float:
        """The parameters that are trained (all but LoRA's frozen base, workloads/lora.py)."""
        return sum(layer.trained_params for layer in self.layers)

    def forward_flops(self) -> float:
        return sum(layer.forward_flops for layer in self.layers)

    def backward_flops(self) -> float:
        return sum(layer.backward_flops for layer in self.layers)

    def saved_bytes(self) -> float:
        return sum(layer.saved_bytes for layer in self.layers)

    def step_flops(self, global_batch: int, recompute: str, chunk_layers: tuple[int, ...] | None = None) -> ModelFlops:
        """FLOPs per optimizer step of ``global_batch`` samples, summed over this graph's ops
        (:data:`FLOPS_KINDS`; per micro-batch of ``micro_batch`` samples, scaled): model FLOPs
        forward + backward by ``model_flops_rule`` (MFU's numerator), hardware FLOPs forward +
        backward as the kernels run them + the forward work re-run under ``recompute`` (HFU's). Only
        the pipelined layers are re-run: a prologue and epilogue (a transformer's embedding and LM head)
        keep their activations (Narayanan et al. 2021 Eq. 3 counts no recomputed head). Layers that
        share their kernels (a transformer's blocks of one kind) are summed once and counted n times.
        Cached on the graph per recompute mode (a search asks for every layout). Under a partial full recompute
        (``full:<method>:<N>``, workloads/graph.py :func:`~workloads.graph.full_units`) ``chunk_layers``, the
        pipelined layers of every model chunk in order, says which layers are re-run."""
        key = recompute if partial_full_of(recompute) is None else (recompute, tuple(chunk_layers))
        sums = self._flops.get(key)
        if sums is None:
            sums = self._flops[key] = self._flops_per_micro_batch(recompute, chunk_layers)
        model, hardware = sums
        return ModelFlops(model * global_batch / self.micro_batch, hardware * global_batch / self.micro_batch,
                          self.flops_counted_layers(), len(self.layers))

    def _flops_per_micro_batch(self, recompute: str, chunk_layers=None) -> tuple[float, float]:
        def flops(ops: tuple[Op, ...]) -> float:
            return sum(op.flops for op in ops if op.kind in FLOPS_KINDS)

        def executed(ops: tuple[Op, ...]) -> float:
            # what the kernels run: a causal fused attention kernel skips the tiles above the diagonal
            # (``Op.executed_fraction``; the model FLOPs keep the non-causal count, Narayanan et al. 2021)
            return sum(op.flops * op.executed_fraction for op in ops if op.kind in FLOPS_KINDS)

        first, last = self.prologue, len(self.layers) - self.epilogue
        groups: dict[tuple[int, int, bool], list] = {}  # (forward, backward, pipelined) -> [layer, count]
        for i, layer in enumerate(self.layers):
            group = groups.setdefault((id(layer.forward), id(layer.backward), first <= i < last), [layer, 0])
            group[1] += 1
        forward = backward = recomputed = frozen = run_forward = run_backward = 0.0
        for (_, _, pipelined), (layer, count) in groups.items():
            forward += count * flops(layer.forward)
            backward += count * flops(layer.backward)
            run_forward += count * executed(layer.forward)
            run_backward += count * executed(layer.backward)
            # a frozen GEMM (LoRA's base, workloads/lora.py) runs no weight gradient: its forward FLOPs' worth
            frozen += count * sum(op.flops for op in layer.forward if op.frozen and op.kind == "gemm")
            if pipelined:
                recomputed += count * executed(layer.recompute_ops(recompute))
        if partial_full_of(recompute) is not None:  # the layers of the chunks' checkpoint units alone
            recomputed, start = 0.0, first
            for count in chunk_layers:
                for unit_first, unit_end in full_units(recompute, count):
                    recomputed += sum(executed(self.layers[start + i].forward) for i in range(unit_first, unit_end))
                start += count
        model = 3 * forward - frozen if self.model_flops_rule == "three_forward" else forward + backward
        return model, run_forward + run_backward + recomputed

    def flops_counted_layers(self) -> int:
        """How many layers' FLOPs are counted (all but the profiled blocks whose kernels are unknown)."""
        return sum(layer.flops_counted for layer in self.layers)

    @property
    def pipelined(self) -> tuple[Layer, ...]:
        """The layers a pipeline splits (all but the prologue and epilogue)."""
        return self.layers[self.prologue:len(self.layers) - self.epilogue]

    def input_bytes(self, layer: Layer) -> float:
        """Bytes a layer reads from the layers before it (0 for the first); cached per input
        tuple (memory and the planner ask for every layer of every stage of every layout)."""
        hit = self._input_bytes.get(layer.inputs)
        if hit is None:
            hit = self._input_bytes[layer.inputs] = sum(self.layers[self._index[n]].output_bytes for n in layer.inputs)
        return hit

    def kept_bytes(self, recompute: str) -> float:
        """Activation bytes of one micro-batch through the whole graph under ``recompute``; full
        recompute keeps the inputs of the graph's checkpoint units (residual blocks, sqrt(n)
        segments: simulator/memory/checkpoints.py, which reads the blocks from the wiring)."""
        from simulator.memory.checkpoints import graph_kept_bytes  # the units need the residual blocks

        return graph_kept_bytes(self, recompute)

    def is_chain(self) -> bool:
        return all(layer.inputs == ((self.layers[i - 1].name,) if i else ()) for i, layer in enumerate(self.layers))

    def check(self) -> LayerGraph:
        """Refuse a graph that cannot run; one error naming the layer. Returns the graph."""
        seen: set[str] = set()
        if not self.layers:
            raise ConfigError("model", f"{self.name}: the graph has no layers")
        if self.prologue < 0 or self.epilogue < 0 or self.prologue + self.epilogue >= len(self.layers):
            raise ConfigError("model", f"{self.name}: prologue + epilogue must leave layers to split")
        for i, layer in enumerate(self.layers):
            where = f"model.layers.{layer.name}"
            if layer.name in seen:
                raise ConfigError(where, "a second layer has this name")
            if layer.kind not in LAYER_KINDS:
                raise ConfigError(where, f"unknown layer kind {layer.kind!r} (known: {', '.join(sorted(LAYER_KINDS))})")
            bad_split = set(layer.splittable) - SPLIT_DIMS
            if bad_split:
                raise ConfigError(where, f"unknown splittable dimension(s) {sorted(bad_split)}")
            if i and not layer.inputs and layer.kind != "embedding":
                raise ConfigError(where, "has no inputs (only the first layer and embeddings of a second input, "
                                         "such as a decoder's target tokens, may)")
            for name in layer.inputs:
                if name == layer.name:
                    raise ConfigError(where, "reads its own output (a cycle)")
                if name not in self._index:
                    raise ConfigError(where, f"reads {name!r}, which is not a layer of the graph")
                if name not in seen:
                    raise ConfigError(where, f"reads {name!r}, which comes after it (a cycle, or not in "
                                             "topological order)")
            if len(layer.inputs) == 1 and layer.input_shape is not None:
                source = self.layer(layer.inputs[0])
                if source.output_shape is not None and source.output_shape != layer.input_shape:
                    raise ConfigError(where, f"expects input {list(layer.input_shape)} but {source.name} gives "
                                             f"{list(source.output_shape)}")
            for number, label in ((layer.params, "params"), (layer.stated_params, "stated_params"), (layer.saved_bytes, "saved_bytes"),
                                  (layer.output_bytes, "output_bytes"), (layer.expert_params, "expert_params"),
                                  (layer.measured_forward_s or 0.0, "measured_forward_s"),
                                  (layer.measured_backward_s or 0.0, "measured_backward_s")):
                if not number >= 0:
                    raise ConfigError(f"{where}.{label}", f"must be a non-negative number, got {number!r}")
            seen.add(layer.name)
        return self


def is_gradient_sum(op: Op) -> bool:
    """Whether ``op`` adds gradients of one tensor: a fan-out's (:func:`with_gradient_sums`) or one
    inside a layer (an attention layer's q, k, v gradients of one packed tensor)."""
    return op.name.endswith("." + GRADIENT_SUM)


def _fan_out_sum(layer: Layer, op: Op) -> bool:
    return op.name == f"{layer.name}.{GRADIENT_SUM}"


def without_gradient_sums(graph: LayerGraph) -> LayerGraph:
    """``graph`` with the fan-out gradient adds of :func:`with_gradient_sums` taken out (a transform
    that rebuilds layers by their kernels, such as tensor parallelism, works on the graph without
    them and puts them back after); the sums inside a layer stay."""
    layers = tuple(replace(layer, backward=tuple(op for op in layer.backward if not _fan_out_sum(layer, op)))
                   if any(_fan_out_sum(layer, op) for op in layer.backward) else layer for layer in graph.layers)
    return replace(graph, layers=layers)


def consumer_counts(graph: LayerGraph) -> dict[str, int]:
    """How many readers each layer's output has: a layer listing it twice reads it once, and the
    pieces of one split (``Layer.piece_of``: chunk, split, unbind) read it once together (autograd's
    backward of a split gathers its pieces' gradients into one: ``SplitBackward``, a copy, no sum),
    and a layer that reads only its shape (``Layer.passes_gradient`` False) not at all."""
    readers: dict[str, set[str]] = {layer.name: set() for layer in graph.layers}
    for layer in graph.layers:
        for name in set(layer.inputs) if layer.passes_gradient else ():
            if name in readers:
                readers[name].add(layer.piece_of or layer.name)
    return {name: len(who) for name, who in readers.items()}


def gradient_sum_ops(name: str, consumers: int, output_bytes: float, measured: bool = False) -> tuple[Op, ...]:
    """The ``consumers - 1`` gradient adds of a tensor of ``output_bytes`` read by ``consumers``
    layers (module docstring): each reads two gradients and writes one. ``measured``: the layer's
    time is measured, so the adds carry 0 s."""
    if consumers < 2 or output_bytes <= 0:
        return ()
    return tuple(Op(f"{name}.{GRADIENT_SUM}", "memory", 0.0, 3.0 * output_bytes,
                    measured_s=0.0 if measured else None) for _ in range(consumers - 1))


def with_gradient_sums(graph: LayerGraph) -> LayerGraph:
    """``graph`` with autograd's gradient adds at every fan-out, at the head of the producer's
    backward (module docstring). Idempotent: adds already there are replaced, so a graph whose
    wiring or sizes changed gets them anew."""
    graph = without_gradient_sums(graph)
    counts = consumer_counts(graph)
    layers = []
    for layer in graph.layers:
        sums = gradient_sum_ops(layer.name, counts[layer.name], layer.output_bytes,
                                measured=layer.measured_backward_s is not None)
        layers.append(replace(layer, backward=sums + layer.backward) if sums else layer)
    return replace(graph, layers=tuple(layers))
