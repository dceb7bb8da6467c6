"""The harness's training strategies and the parallel layout each one runs (torch-free, so the
simulator side can map recorded runs to scenarios without the ``validation`` extra)."""

from __future__ import annotations

from typing import Any

STRATEGIES = ("single", "ddp", "fsdp", "pp_gpipe", "pp_1f1b", "tp", "local_learning")
#: Measured when asked for (``TrainingConfig.strategies``): local SGD with H = 4 (each rank its own
#: replica, parameters averaged every 4 steps) and the optimizer step inside the backward
#: (``register_post_accumulate_grad_hook``) beside the same job with a separate step. Their
#: predictions need the simulator's ``local_sgd`` kind and ``training.optimizer_fusion``.
EXTRA_STRATEGIES = ("local_sgd", "step_in_backward", "step_separate")
LOCAL_SGD_STEPS = 4


def layout_of(strategy: str, cfg: Any, world: int) -> dict[str, Any]:
    """The parallel layout a strategy ran: what the simulator is given for it (``strategy``: the
    scenario's strategy block where the run is not the default ``spmd`` kind)."""
    g, mb = cfg.global_batch, cfg.micro_batch
    if strategy == "single":
        return {"num_gpus": 1, "tp": 1, "pp": 1, "dp": 1, "zero_stage": 0, "schedule": "1f1b",
                "micro_batch_size": mb, "global_batch_size": g, "num_micro_batches": g // mb}
    if strategy in ("ddp", "fsdp"):
        return {"num_gpus": world, "tp": 1, "pp": 1, "dp": world, "zero_stage": 3 if strategy == "fsdp" else 0,
                "schedule": "1f1b", "micro_batch_size": g // world, "global_batch_size": g, "num_micro_batches": 1}
    if strategy in ("pp_gpipe", "pp_1f1b"):
        m = cfg.pp_micro_batches
        return {"num_gpus": world, "tp": 1, "pp": world, "dp": 1, "zero_stage": 0,
                "schedule": "gpipe" if strategy == "pp_gpipe" else "1f1b",
                "micro_batch_size": g // m, "global_batch_size": g, "num_micro_batches": m}
    if strategy == "local_learning":
        # one layer group per rank, each but the last with an auxiliary head; a barrier per step
        m = cfg.pp_micro_batches
        return {"num_gpus": world, "tp": 1, "pp": world, "dp": 1, "zero_stage": 0, "schedule": "1f1b",
                "micro_batch_size": g // m, "global_batch_size": g, "num_micro_batches": m,
                "strategy": {"kind": "local_learning", "sync_steps": True}}
    if strategy == "local_sgd":
        return {"num_gpus": world, "tp": 1, "pp": 1, "dp": world, "zero_stage": 0, "schedule": "1f1b",
                "micro_batch_size": g // world, "global_batch_size": g, "num_micro_batches": 1,
                # training.py averages the replicas one all-reduce per parameter tensor (a plain loop)
                "strategy": {"kind": "local_sgd", "local_steps": LOCAL_SGD_STEPS, "outer_optimizer": "sgd",
                             "outer_all_reduce": "per_tensor"},
                "steps": LOCAL_SGD_STEPS}
    if strategy in ("step_in_backward", "step_separate"):
        # every rank its own copy (as single), the whole global batch as one micro-batch: a step
        # in the backward cannot accumulate gradients over micro-batches
        return {"num_gpus": 1, "tp": 1, "pp": 1, "dp": 1, "zero_stage": 0, "schedule": "1f1b",
                "micro_batch_size": g, "global_batch_size": g, "num_micro_batches": 1,
                **({"optimizer_fusion": "backward"} if strategy == "step_in_backward" else {})}
    if strategy == "tp":
        return {"num_gpus": world, "tp": world, "pp": 1, "dp": 1, "zero_stage": 0, "schedule": "1f1b",
                "micro_batch_size": mb, "global_batch_size": g, "num_micro_batches": g // mb}
    raise ValueError(f"unknown strategy {strategy!r} (known: {', '.join(STRATEGIES + EXTRA_STRATEGIES)})")
