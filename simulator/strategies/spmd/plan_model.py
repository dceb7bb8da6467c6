"""The spmd planner's model-side queries: which layers a chunk holds, their parameters, their memory, and
the ops each chunk pass runs.

Part of :class:`simulator.strategies.spmd.plan.Planner` (a mixin: the methods read the planner's state, set up
in ``Planner.__init__``). It holds the layer and chunk parameters (split, local, held), a chunk's layers and
their names, a stage's memory (base, activations, working set, gradients), the recompute units, and the op
lists of a chunk's forward / backward (``pass_ops``, with selective and partial full recompute). Nothing here
prices or builds tasks: these are the questions the pricing (plan_costs.py) and the task building
(plan_tasks.py) ask of the model and the layout.
"""

from __future__ import annotations

from simulator.memory.analytic import (
    MemoryBreakdown,
    chunk_activation_bytes,
    rank_memory,
    recompute_working_bytes,
)
from simulator.memory.checkpoints import plan_of
from workloads.graph import LayerWork, Op, full_units, partial_full_of
from workloads.layer_kinds import layer_kind_runs


class PlanModel:
    """The model-side queries of :class:`~simulator.strategies.spmd.plan.Planner` (see the module docstring)."""

    # -- params ----------------------------------------------------------------------------

    def layer_params_split(self, kind=None) -> tuple[float, float]:
        """(dense, routed-expert) parameters one rank holds of a layer of ``kind`` (default: the
        first layer's), as the layer graph states them."""
        return self._params_split[self.layer_kinds[0] if kind is None else kind]

    def layer_params_local(self, kind=None) -> float:
        """The trained parameters one rank holds of a layer of ``kind`` (see :meth:`layer_params_split`)."""
        return sum(self.layer_params_split(kind))

    def layer_params_held(self, kind=None) -> float:
        """Every parameter one rank holds of a layer of ``kind``, frozen ones too (what ZeRO-3 gathers)."""
        return self._held[self.layer_kinds[0] if kind is None else kind]

    def chunk_runs(self, global_chunk: int) -> tuple[tuple[bool, int], ...]:
        """The chunk's layers as runs of equal kind, in order: ((moe_layer, count), ...) (cached:
        the planner asks for every pass of every micro-batch)."""
        runs = self._chunk_runs.get(global_chunk)
        if runs is None:
            runs = self._chunk_runs[global_chunk] = layer_kind_runs(
                self.layer_kinds, self.chunk_starts[global_chunk], self.layers_per_chunk[global_chunk])
        return runs

    def unit_recompute(self, global_chunk: int, layer: int, recompute: str) -> tuple[tuple[Op, ...], tuple]:
        """(ops, runs of layer kinds) re-run before the backward of the chunk's ``layer``-th layer.
        Full recompute re-runs a checkpoint unit's forward once, before the backward of its last
        layer on the chunk (simulator/memory/checkpoints.py: a transformer block, a CNN's residual
        block or sqrt(n) segment, cut at the chunk's borders); nothing before its other layers.
        Other modes: the layer's own selected ops. Approximation under ZeRO-3: the unit's
        recompute waits for its last layer's gather only. Cached per (chunk, layer)."""
        kind = self.chunk_layer_kind(global_chunk, layer)
        if partial_full_of(recompute) is not None:  # Megatron-Core's units, per chunk (workloads/graph.py full_units)
            key = ("partial_R", global_chunk, layer)
            hit = self._pass_ops.get(key)
            if hit is None:
                hit = ((), ())
                for first, end in full_units(recompute, self.layers_per_chunk[global_chunk]):
                    if layer == end - 1:  # re-run before the backward of the unit's last layer
                        kinds = [self.chunk_layer_kind(global_chunk, i) for i in range(first, end)]
                        hit = (tuple(op for k in kinds for op in self.layer_works[k].forward),
                               tuple((k, 1) for k in kinds))
                self._pass_ops[key] = hit
            return hit
        plan = plan_of(self.graph) if recompute == "full" else None
        if plan is None or plan.per_layer:
            return self.layer_works[kind].recompute_ops(recompute), ((kind, 1),)
        key = ("unit_R", global_chunk, layer)
        hit = self._pass_ops.get(key)
        if hit is None:
            start = self.chunk_starts[global_chunk]
            unit = plan.unit[self.graph.prologue + start:self.graph.prologue + start + self.layers_per_chunk[global_chunk]]
            if layer + 1 < len(unit) and unit[layer + 1] == unit[layer]:
                hit = ((), ())
            else:
                first = layer
                while first > 0 and unit[first - 1] == unit[layer]:
                    first -= 1
                kinds = [self.chunk_layer_kind(global_chunk, i) for i in range(first, layer + 1)]
                ops = tuple(op for k in kinds for op in self.layer_works[k].recompute_ops(recompute))
                hit = (ops, tuple((k, 1) for k in kinds))
            self._pass_ops[key] = hit
        return hit

    def layer_name(self, global_chunk: int, layer: int) -> str:
        """The layer graph's name of the chunk's ``layer``-th pipelined layer (for the trace)."""
        return self.pipelined[self.chunk_starts[global_chunk] + layer].name

    def chunk_layers(self, global_chunk: int) -> str:
        """The chunk's pipelined layers as ``first..last`` (for the trace); "" for a chunk without any
        (a last stage holding only the head: ``last_stage_layers: 0``). Cached: asked for every pass."""
        hit = self._chunk_names.get(global_chunk)
        if hit is None:
            hit = self._chunk_names[global_chunk] = self._chunk_layers(global_chunk)
        return hit

    def _chunk_layers(self, global_chunk: int) -> str:
        count = self.layers_per_chunk[global_chunk]
        if count == 0:
            return ""
        first = self.chunk_starts[global_chunk]
        last = first + count - 1
        return self.pipelined[first].name if last <= first else f"{self.pipelined[first].name}..{self.pipelined[last].name}"

    @property
    def prologue_name(self) -> str:
        return "+".join(layer.name for layer in self.graph.layers[:self.graph.prologue]) or "prologue"

    @property
    def epilogue_name(self) -> str:
        return "+".join(layer.name for layer in self.graph.layers[len(self.graph.layers) - self.graph.epilogue:]) or "epilogue"

    def chunk_layer_kind(self, global_chunk: int, layer: int) -> bool:
        """Kind (MoE or not) of the chunk's ``layer``-th layer."""
        return self.layer_kinds[self.chunk_starts[global_chunk] + layer]

    def _layers_params(self, runs, expert_only: bool = False) -> float:
        """Local parameters (or routed-expert ones only) of layers given as runs of equal kind."""
        total = 0.0
        for kind, count in runs:
            total += count * (self.layer_params_split(kind)[1] if expert_only else self.layer_params_local(kind))
        return total

    def chunk_params_local(self, global_chunk: int) -> float:
        params = self._layers_params(self.chunk_runs(global_chunk))
        if global_chunk == 0:
            params += self.prologue_params
        if global_chunk == self.chunks - 1:
            params += self.epilogue_params
            if self.tied_trained_params and self.chunks > 1 and self.par.pp > 1:
                params += self.tied_trained_params
        return params

    def stage_params_local(self, stage: int) -> float:
        return sum(self.chunk_params_local(c * self.par.pp + stage) for c in range(self.par.virtual_stages))

    # -- memory over time ------------------------------------------------------------------

    def _memory_count(self, name: str, count, arg: int):
        """``count(scenario, arg)``, one of simulator/memory/analytic.py's counts, cached per (``name``, ``arg``)
        (asked per pass and per stage while building; kinds that override :meth:`stage_memory` share the cache)."""
        key = (name, arg)
        hit = self._memory_cache.get(key)
        if hit is None:
            hit = self._memory_cache[key] = count(self.sc, arg)
        return hit

    def stage_memory(self, stage: int) -> MemoryBreakdown:
        """The analytic memory of a rank of ``stage`` (:func:`simulator.memory.analytic.rank_memory`)."""
        return self._memory_count("stage", rank_memory, stage)

    def base_memory_bytes(self, stage: int) -> float:
        """Held from the start (the steady state of training): weights, optimizer state and the
        communication buffers of :func:`simulator.memory.analytic.rank_memory`."""
        m = self.stage_memory(stage)
        return m.weights_bytes + m.optimizer_bytes + m.other_bytes

    def activation_bytes(self, global_chunk: int) -> float:
        """Saved by one micro-batch's forward of the chunk until its backward (analytic accounting)."""
        return self._memory_count("act", chunk_activation_bytes, global_chunk)

    def working_bytes(self, stage: int) -> float:
        """Recompute working set alive during a backward pass of the stage (0 without recompute)."""
        return self._memory_count("working", recompute_working_bytes, stage)

    def largest_module_gradient_bytes(self, stage: int) -> float:
        """Gradient bytes of the stage's largest module (a layer, the embedding or the head), as the
        analytic count gives them under optimizer fusion "backward" with one micro-batch."""
        return self.stage_memory(stage).gradients_bytes

    def gradient_bytes_of_chunk(self, stage: int, global_chunk: int) -> float:
        """The chunk's share (by local parameters) of the stage's gradient bytes (ZeRO-sharded as the
        analytic count)."""
        share = self.chunk_params_local(global_chunk) / max(self.stage_params_local(stage), 1.0)
        return self.stage_memory(stage).gradients_bytes * share

    def _chunk_ops(self, phase: str, global_chunk: int) -> tuple[Op, ...]:
        """All ops of one chunk pass, concatenated (cached): "F" forward, "B" backward,
        "R" the recomputed forward work of the chunk's layers."""
        ops = self._chunk_pass_ops.get((phase, global_chunk))  # asked for every pass of every micro-batch
        if ops is not None:
            return ops
        ops = self.pass_ops(phase, global_chunk == 0, global_chunk == self.chunks - 1,
                            self.chunk_runs(global_chunk))  # keyed by the kinds' counts, in layer order
        self._chunk_pass_ops[(phase, global_chunk)] = ops
        return ops

    def pass_ops(self, phase: str, first: bool, last: bool, runs: tuple[tuple[bool, int], ...]) -> tuple[Op, ...]:
        """The ops of a pass over a chunk of ``runs`` ((layer kind, count), ...), with the prologue
        if ``first`` and the epilogue if ``last`` (cached; :meth:`_chunk_ops`)."""
        key = (phase, first, last, runs)
        ops = self._pass_ops.get(key)
        if ops is None:
            works = self.layer_works

            def layers(part, order=runs) -> tuple[Op, ...]:
                return sum((part(works[kind]) * count for kind, count in order), ())

            backward = tuple(reversed(runs))  # the backward runs the chunk's layers last to first
            if phase == "F":
                ops = ((self.embedding.forward if first else ()) + layers(lambda w: w.forward)
                       + (self.head.forward if last else ()))
            elif phase == "B" and self.par.schedule == "zb-h1":
                ops = ((self.head.input_grad_ops() if last else ()) + layers(LayerWork.input_grad_ops, backward)
                       + (self.embedding.backward if first else ()))
            elif phase == "W":
                ops = (self.head.weight_grad_ops() if last else ()) + layers(LayerWork.weight_grad_ops, backward)
            elif phase == "B":
                ops = ((self.head.backward if last else ()) + layers(lambda w: w.backward, backward)
                       + (self.embedding.backward if first else ()))
            elif partial_full_of(self.par.recompute_mode) is not None:
                ops = self._partial_recompute_ops(runs)
            else:
                ops = layers(lambda w: w.recompute_ops(self.par.recompute_mode), backward)
            self._pass_ops[key] = ops
        return ops

    def _rerun_runs(self, runs: tuple[tuple[bool, int], ...]) -> tuple[tuple[bool, int], ...]:
        """The runs of layer kinds a chunk of ``runs`` re-runs under a partial full recompute (its checkpoint
        units' layers, workloads/graph.py ``full_units``), in layer order."""
        kinds = [kind for kind, count in runs for _ in range(count)]
        out: list[list] = []
        for first, end in full_units(self.par.recompute_mode, len(kinds)):
            for position in range(first, end):
                if out and out[-1][0] == kinds[position]:
                    out[-1][1] += 1
                else:
                    out.append([kinds[position], 1])
        return tuple((kind, count) for kind, count in out)

    def _partial_recompute_ops(self, runs: tuple[tuple[bool, int], ...]) -> tuple[Op, ...]:
        """The forwards a chunk of ``runs`` re-runs under Megatron-Core's partial full recompute: its checkpoint
        units' layers (workloads/graph.py ``full_units``: block N the first N, uniform N all), last to first."""
        kinds = [kind for kind, count in runs for _ in range(count)]
        rerun = [position for first, end in full_units(self.par.recompute_mode, len(kinds))
                 for position in range(first, end)]
        return sum((self.layer_works[kinds[p]].forward for p in reversed(rerun)), ())
