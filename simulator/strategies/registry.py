"""The registry of strategy kinds: one name, one module, one config.

A kind module defines a pydantic config whose ``kind`` field is ``Literal["<name>"]`` and
calls :func:`register` once at import with a :class:`StrategyKind`. The scenario's
``strategy:`` block is one of the discriminated union of every registered config, told apart
by ``kind`` (:func:`parse_strategy`, :func:`strategy_union`); a block without ``kind`` (or no block) is the default kind,
``spmd``. Kind modules are listed in :data:`KIND_MODULES` and imported on first use, so that
reading a scenario does not import every planner (and there is no import cycle between the
scenario, which holds a config, and the planners, which read the scenario).

Registering a name twice is an error (Vidur's registries keyed by name, without silent
overrides).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Union

from simulator.errors import ConfigError, did_you_mean, from_pydantic

if TYPE_CHECKING:  # pydantic is imported where it is used: --help reads this module without it
    from pydantic import BaseModel

DEFAULT_KIND = "spmd"

#: Every strategy kind module, imported by :func:`load_kinds`. A new kind is one module and one line here.
KIND_MODULES: tuple[str, ...] = (
    "simulator.strategies.spmd.kind",
    "simulator.strategies.local_sgd",
    "simulator.strategies.parameter_server",
    "simulator.strategies.async_pipeline",
    "simulator.strategies.local_learning",
    "simulator.strategies.cyclic_dp",
    "simulator.strategies.per_layer.kind",
    "simulator.strategies.subnetwork_dp",
    "simulator.strategies.layer_parallel_mgrit",
    "simulator.strategies.swarm",
    "simulator.strategies.replicated_pipeline",
)


@dataclass(frozen=True)
class StrategyKind:
    """What a kind gives the simulator.

    ``config``: its pydantic model (a ``kind: Literal[name]`` field first). ``compile(scenario,
    mode, detail)``: a :class:`simulator.strategies.plan.Plan` (per-actor task lists with
    ``streams``, ``actors``, ``stage_of``, ``compute_tasks``, ``topology``) holding
    ``scenario.simulation.steps`` steps: ``Plan.steps`` and, per step, ``Plan.step_ends`` (the tasks
    whose last end is the end of that step). A kind whose period spans steps (every H steps, async
    updates) unrolls the steps it is asked for and marks each one's end; the result's
    ``step_time_s`` is the makespan / steps and ``step_times_s`` each step (simulator/strategies/plan.py).
    ``memory(scenario)``: ``(peak stage, its MemoryBreakdown, one per stage)``. ``summary``:
    one line on what it models, for ``--help`` and the README. ``convergence_inputs(scenario)``
    (optional): ``{"staleness_steps": tau, "local_steps": H}`` that the scenario's ``convergence:``
    block turns into steps to target (simulator/economics/convergence.py); absent: synchronous, 0 and 1.
    ``step_flops(scenario)`` (optional): the step's :class:`workloads.graph.ModelFlops` for a kind whose
    workers run less than the whole model per sample (masked subnetworks); absent: counted from the graph.
    ``layout_gpus(config, parallelism, num_gpus)`` (optional): the GPUs ``parallelism:`` lays out (``dp: auto`` is
    inferred from them); absent: ``cluster.num_gpus``. A kind whose GPUs are not a product of the
    layout's degrees says so here (swarm: the layout is one pipeline, its pools of peers are its own).
    ``optimizer_fusion``: the ``training.optimizer_fusion`` modes ("backward", "forward") the kind models; a
    scenario asking another is refused naming the field and the kind (simulator/scenario.py), never ignored.
    ``searched_layout_fields(config)`` (optional): the fields of ``clustersim search``'s space
    (:class:`simulator.explore.search.SearchSpace`) that change what the kind simulates; ``search`` keeps
    every other at the scenario's value (one layout, not copies of it under other names) and refuses a
    ``--space`` that lists other values for one (simulator/explore/search.py, :func:`kind_space`); absent:
    every field (the kind runs spmd's layout). Each kind's declaration is checked by
    tests/test_kind_layout_fields.py: changing a field it leaves out keeps the step and peak bit-identical.
    ``derives_layout``: with ``searched_layout_fields``, whether ``search`` derives the values of the read
    fields as it does for spmd (tp, pp, dp from the GPUs, micro-batches from the batch:
    :func:`simulator.explore.search.enumerate_layouts`) and folds the rest onto the scenario's values (a kind
    that runs spmd's layout inside: local SGD, a parameter server, an asynchronous pipeline); False: the
    scenario's layout with the read fields over ``--space`` lists alone (a kind whose GPUs or stages its own
    block lays out: per_layer, DAPPLE's stages, MGRIT's ranks, SWARM's pools).
    ``spmd_chain_bound``: whether ``search`` may prune the kind's layouts by spmd's pipeline chain (the
    step-time bound without the step's tail: simulator/explore/checks.py), for a kind whose every step runs
    spmd's passes in spmd's schedule on spmd's planner (local SGD's inner steps, a parameter server's
    workers); otherwise not spmd's (the kind's own ``step_lower_bound`` where it has one, else every feasible
    layout timed): spmd's bound is above the simulated step of most other kinds' examples.
    ``step_lower_bound(scenario, prices)`` (optional): a lower bound on the kind's simulated step (seconds), by
    which ``search`` orders and prunes the kind's layouts as it does spmd's (simulator/explore/checks.py).
    ``prices`` (:class:`simulator.explore.bounds.KindPrices`) gives spmd's chunk pass prices (``prices.passes``:
    global chunk -> phase -> seconds, kernels plus exposed collectives, each transfer alone) and other op tuples
    on a stage (``prices.stage_ops_s``), shared over a search's layouts; a kind with a cost model of its own prices
    from ``scenario`` alone. Sound only as the kind's own argument says (each kind's docstring), and checked
    against the engine on random layouts (tests/test_kind_bounds.py).
    Absent, and not ``spmd_chain_bound``: every feasible layout is timed."""

    name: str
    config: type[BaseModel]
    summary: str
    compile: Callable[..., Any]
    memory: Callable[..., Any]
    convergence_inputs: Callable[..., dict[str, float]] | None = None
    step_flops: Callable[..., Any] | None = None
    layout_gpus: Callable[[BaseModel, Any, int], int] | None = None
    optimizer_fusion: tuple[str, ...] = ()  # the training.optimizer_fusion modes the kind models; others refused
    searched_layout_fields: Callable[[BaseModel], tuple[str, ...]] | None = None  # None: all of search's space
    derives_layout: bool = False  # search derives the read fields' values as for spmd (True) or takes --space's
    spmd_chain_bound: bool = False  # search may bound the step by spmd's pipeline chain (simulator/explore/checks.py)
    step_lower_bound: Callable[[Any, Any], float] | None = None  # the kind's own bound (scenario, KindPrices)


#: The layout fields ``clustersim search`` varies (:class:`simulator.explore.search.SearchSpace`'s fields;
#: tests/test_kind_layout_fields.py checks they are the same), named here so that ``simulate`` can say which
#: of them a kind leaves unread without importing the search.
SEARCHED_LAYOUT_FIELDS: tuple[str, ...] = (
    "tp", "pp", "cp", "ep", "virtual_stages", "micro_batch_size", "zero_stage", "recompute", "sequence_parallel",
    "schedule", "global_batch_size", "pp_split", "overlap_grad_reduce", "overlap_param_gather",
    "overlap_tp_grad_comm", "overlap_p2p_comm", "tp_comm_overlap")


def layout_fields_read(kind: StrategyKind, config: BaseModel) -> frozenset[str] | None:
    """The ``parallelism:`` fields a kind reads, for what ``simulate``'s layout line and ``search``'s table show
    (simulator/report/result.py, simulator/report/search_table.py): its ``searched_layout_fields``, plus ``dp``
    where the kind runs spmd's layout inside (``derives_layout``: its replicas or workers are ``dp``, inferred
    from the GPUs as for spmd). None: every field (spmd, and a kind that declares no list). A kind that lays out
    its own GPUs (swarm's pools, DAPPLE's stages, per_layer's splits, MGRIT's ranks) does not read ``dp``, nor a
    field it refuses unless at its default (swarm's tp, its ``schedule`` set to GPipe by the kind): showing them
    printed ``1f1b`` for swarm, which runs GPipe."""
    if kind.searched_layout_fields is None:
        return None
    return frozenset(kind.searched_layout_fields(config)) | ({"dp"} if kind.derives_layout else frozenset())


def unread_layout_fields(scenario) -> dict[str, Any]:
    """The fields of ``scenario.parallelism`` among :data:`SEARCHED_LAYOUT_FIELDS` that its strategy kind
    does not read (``StrategyKind.searched_layout_fields``) and that differ from the layout's default: field ->
    value. The run is the same whatever their values (tests/test_kind_layout_fields.py), so ``simulate`` names
    them in a NOTE rather than refusing them (a per_layer scenario may state a ``micro_batch_size``; plans written
    by ``clustersim plan`` state none). Empty for a kind that reads every field (spmd)."""
    kind = get_kind(scenario.strategy_kind)
    if kind.searched_layout_fields is None:
        return {}
    read = set(kind.searched_layout_fields(scenario.strategy))
    par = scenario.parallelism
    fields = type(par).model_fields
    return {name: getattr(par, name) for name in SEARCHED_LAYOUT_FIELDS
            if name not in read and getattr(par, name) != fields[name].default}


def unread_layout_note(scenario, unread: dict[str, Any]) -> str:
    """The NOTE ``simulate`` prints for :func:`unread_layout_fields`' result."""
    kind = get_kind(scenario.strategy_kind)
    read = kind.searched_layout_fields(scenario.strategy) if kind.searched_layout_fields else ()
    given = ", ".join(f"parallelism.{name} ({value})" for name, value in unread.items())
    return (f"strategy kind {kind.name} does not read {given}: the run is the same whatever "
            f"{'its value' if len(unread) == 1 else 'their values'} (of the layout it reads "
            f"{', '.join(read) or 'nothing'})")


_KINDS: dict[str, StrategyKind] = {}


def register(kind: StrategyKind) -> StrategyKind:
    """Add a kind; a name registered twice is an error (two modules claiming one name)."""
    if kind.name in _KINDS:
        raise ValueError(f"strategy kind {kind.name!r} is registered twice")
    field = kind.config.model_fields.get("kind")
    if field is None or getattr(field.annotation, "__args__", None) != (kind.name,):
        raise ValueError(f"strategy kind {kind.name!r}: its config needs a field kind: Literal[{kind.name!r}]")
    _KINDS[kind.name] = kind
    return kind


def kind_summaries() -> dict[str, str]:
    """Every kind's name and one-line summary, read from the kind modules' source without importing
    them (simulator/registry_source.py), so that ``clustersim --help`` lists the kinds without loading
    simpy, numpy or pydantic; a module whose ``StrategyKind(...)`` call is not literal is imported.
    tests/test_strategy_registry.py checks the result against :func:`load_kinds`."""
    from simulator.registry_source import literal_call_fields

    out: dict[str, str] = {}
    for module in KIND_MODULES:
        found = literal_call_fields(module, "StrategyKind", ("name", "summary"))
        if found is not None:
            out[str(found["name"])] = str(found["summary"])
        else:  # not literal: import the module (slower)
            before = set(_KINDS)
            importlib.import_module(module)
            out.update({name: _KINDS[name].summary for name in set(_KINDS) - before})
    return out


@functools.cache
def _module_of_kind() -> dict[str, str]:
    """Each kind's name -> its module, in :data:`KIND_MODULES` order, read from the modules' source
    (simulator/registry_source.py) without importing them; a module whose call is not literal is absent."""
    from simulator.registry_source import literal_call_fields

    out: dict[str, str] = {}
    for module in KIND_MODULES:
        found = literal_call_fields(module, "StrategyKind", ("name",))
        if found is not None:
            out.setdefault(str(found["name"]), module)
    return out


def load_kinds() -> dict[str, StrategyKind]:
    """Every registered kind, importing the kind modules on first use; in :data:`KIND_MODULES` order
    whichever kind :func:`get_kind` imported first (the order of the union's tags in its errors)."""
    for module in KIND_MODULES:
        importlib.import_module(module)
    order = {name: i for i, name in enumerate(_module_of_kind())}
    return {name: _KINDS[name] for name in sorted(_KINDS, key=lambda name: order.get(name, len(order)))}


def get_kind(name: str) -> StrategyKind:
    """The kind ``name``, importing only its own module where its source names it: a scenario of one kind
    does not import every planner (per_layer and swarm import numpy: ~0.1 s of a simulate's start-up)."""
    if name not in _KINDS:  # its module by the usual naming first (reading every kind's source costs ~12 ms)
        named = [m for m in (f"simulator.strategies.{name}", f"simulator.strategies.{name}.kind") if m in KIND_MODULES]
        for module in named:
            importlib.import_module(module)
    if name not in _KINDS and (module := _module_of_kind().get(name)) is not None:
        importlib.import_module(module)
    if name in _KINDS:
        return _KINDS[name]
    kinds = load_kinds()
    if name not in kinds:
        raise ConfigError("strategy.kind", f"unknown kind {name!r}{did_you_mean(name, kinds)} "
                                           f"(known: {', '.join(sorted(kinds))})")
    return kinds[name]


def strategy_union() -> Any:
    """The discriminated union of every kind's config (``kind`` is the tag), for schemas."""
    from pydantic import Field

    configs = tuple(k.config for k in load_kinds().values())
    return configs[0] if len(configs) == 1 else Annotated[Union[configs], Field(discriminator="kind")]  # noqa: UP007


def parse_strategy(raw: Any) -> BaseModel:
    """The scenario's ``strategy:`` block as its kind's config (the default kind when absent)."""
    from pydantic import ValidationError

    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError("strategy", "must be a mapping with a 'kind' (e.g. {kind: spmd})")
    raw = {"kind": DEFAULT_KIND, **raw}
    kind = get_kind(str(raw["kind"]))  # unknown kind: one line naming the known ones
    try:  # what the union would dispatch to, so that errors name strategy.<field> without the tag
        return kind.config.model_validate(raw)
    except ValidationError as exc:
        raise _strategy_error(exc, kind) from None


def _strategy_error(exc, kind: StrategyKind) -> ConfigError:
    """A kind's validation error; an unknown top-level key also lists the kind's own keys and names the kinds
    that have it (``strategy.local_steps`` on an spmd scenario: "a field of strategy kind local_sgd, not
    spmd"; until the tenth session the line said "unknown key" and nothing else)."""
    error = from_pydantic(exc, "strategy", schema=kind.config)
    key = error.field.removeprefix("strategy.")
    if error.reason.startswith("unknown key") and "." not in key:
        owners = [name for name, other in load_kinds().items() if key in other.config.model_fields]
        if owners:
            error = ConfigError(error.field, error.reason.replace(
                "unknown key", f"unknown key: a field of strategy kind {' and '.join(owners)}, not {kind.name} "
                               f"(set strategy.kind)", 1))
    return error
