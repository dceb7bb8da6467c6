"""The ``spmd`` strategy kind: one synchronous step of data, tensor, sequence, pipeline,
context and expert parallelism with ZeRO/FSDP, recompute and overlaps (Megatron-LM,
DeepSpeed, torchtitan). Its layout is the scenario's ``parallelism:`` block
(:mod:`simulator.strategies.spmd.layout`), its schedules :mod:`.schedule`, its planner :mod:`.plan`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from simulator.memory.analytic import peak_rank_memory
from simulator.strategies.registry import StrategyKind, register
from simulator.strategies.spmd.plan import Planner


class SpmdConfig(BaseModel):
    """No fields of its own: the layout is ``parallelism:``, the step ``training:``."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    kind: Literal["spmd"] = "spmd"


def compile_spmd(scenario, mode: str | None = None, detail: bool = False, chains: bool = False):
    """The plan; ``chains``: a pass's back-to-back tasks as one engine task where that is exact
    (:class:`Planner`; for the engine, which runs them: the fast path reads single tasks)."""
    return Planner(scenario, mode=mode, detail=detail, chains=chains).build()


SPMD = register(StrategyKind(
    name="spmd",
    config=SpmdConfig,
    summary="one synchronous step: dp/tp/sp/pp/cp/ep, ZeRO 1-3, recompute, overlaps (the default)",
    compile=compile_spmd,
    memory=peak_rank_memory,
    optimizer_fusion=("backward", "forward"),
))
