"""Refuse a per-layer planner before it plans when no plan it can express holds the model state.

The per-layer planners (PaSE, DeepPool, adaptive) have no memory term in their objectives (nor
have their papers), so on a model larger than one GPU they used to return a plan that cannot run
(Llama-3-70B on 64 GB200s: pure data parallelism, 1787 GiB of 171 GiB usable) with exit code 0.
Before planning, each planner now states the most its plan space can shard each layer's weights
(1 for DeepPool's batch-only bursts, the largest product of channel, head and reduction cuts among
a layer's PaSE configurations; the adaptive planner's pipelines also spread the layers over stages,
with ZeRO-1), and :func:`refuse_unless_state_fits` raises one ConfigError when even the least model
state per GPU that space allows exceeds the usable HBM.

The least state is a lower bound of every plan's peak in that space: the per_layer kind puts
layer l's ``params / shards`` weights, gradients and optimizer state on device 0 for every layer
(simulator/strategies/per_layer/kind.py ``per_layer_memory``: device 0 holds a part of every
layer, whatever its split), so the least sum is each layer at its most shards; activations only
add to it. Bytes per parameter are ZeRO's (Rajbhandari 2020, Sec. 3: 2 + 2 + 12 with mixed
precision and Adam; :func:`simulator.memory.analytic.bytes_per_param`), the gradients at
``training.grad_dtype`` (:func:`simulator.memory.analytic.gradient_bytes`), fp32 with ``param_dtype: fp32``
(:func:`simulator.memory.analytic.held_gradient_bytes`).
"""

from __future__ import annotations

from collections.abc import Callable

from simulator.errors import ConfigError
from simulator.strategies.per_layer.config import MODEL_FIELDS, Split


def weight_shards(split: Split) -> int:
    """Devices one layer's weights are sharded over under ``split`` (its channel, head and reduction cuts)."""
    shards = 1
    for field in MODEL_FIELDS:
        shards *= getattr(split, field)
    return shards


def state_bytes_per_param(scenario) -> tuple[float, float]:
    """``(weights + gradients, optimizer state)`` bytes of one parameter, as the per_layer kind counts them."""
    from simulator.memory.analytic import bytes_per_param, gradient_bytes, held_gradient_bytes

    tr = scenario.training
    fp32_params = getattr(tr, "param_dtype", "auto") == "fp32"
    per = bytes_per_param(tr.precision, tr.optimizer, fp32_params)
    return per["weights"] + held_gradient_bytes(gradient_bytes(tr), tr.precision, tr.optimizer, fp32_params), \
        float(per["optimizer"])


def replica_state_bytes(scenario, graph) -> float:
    """One replica's weights, gradients and optimizer state in bytes."""
    return sum(layer.params for layer in graph.layers) * sum(state_bytes_per_param(scenario))


def per_layer_least_bytes(scenario, graph, max_shards: Callable[[object], int]) -> float:
    """The least model state device 0 holds in a per_layer plan whose layer l shards its weights at
    most ``max_shards(l)`` ways (every layer at its most shards)."""
    per = sum(state_bytes_per_param(scenario))
    return sum(-(-layer.params // max(1, max_shards(layer))) for layer in graph.layers) * per


def pipeline_least_bytes(scenario, graph, max_stages: int, num_gpus: int) -> float:
    """The least model state of a pipeline's busiest stage with at most ``max_stages`` stages of
    ``num_gpus / S`` data-parallel replicas each and ZeRO-1 (the optimizer state sharded over a
    stage's replicas; replicated_pipeline.py ``stage_memory``): the busiest stage holds at least P/S of
    the P parameters, so at least ``P * ((w + g) / S + o / num_gpus)`` bytes, least at the most stages."""
    together, optimizer = state_bytes_per_param(scenario)
    params = sum(layer.params for layer in graph.layers)
    stages = max(1, max_stages)
    return params * (together / stages + optimizer / num_gpus)


def usable_bytes(scenario) -> float:
    """HBM one GPU may fill (on a mixed cluster: the largest group's, a bound for every plan)."""
    from simulator.memory.analytic import usable_hbm_bytes

    if getattr(scenario, "mixed", False):
        return max(usable_hbm_bytes(scenario, group.accelerator) for group in scenario.groups)
    return usable_hbm_bytes(scenario)


def refuse_unless_state_fits(scenario, graph, least_bytes: float, planner: str, space: str) -> None:
    """ConfigError (``model``, exit 2) when ``least_bytes``, the least model state one GPU holds in
    any plan of the planner's space (``space`` says what it is, for the message), exceeds the usable
    HBM of one GPU."""
    from simulator.memory.analytic import GIB

    whole = replica_state_bytes(scenario, graph)
    usable = usable_bytes(scenario)
    if least_bytes <= usable:
        return
    at_least = "" if least_bytes >= whole * (1 - 1e-9) else f", at least {least_bytes / GIB:.1f} GiB a GPU"
    raise ConfigError("model", f"{scenario.model.name}'s model state (weights + gradients + optimizer state) is "
                               f"{whole / GIB:.1f} GiB a replica{at_least} in any {planner} plan ({space}), more "
                               f"than the {usable / GIB:.1f} GiB usable on one {scenario.accelerator.name}: use "
                               "`clustersim search` (tensor/pipeline parallel, ZeRO) or `--planner dapple`")
