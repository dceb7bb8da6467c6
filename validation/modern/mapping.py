"""Small helpers shared by the row mappers: reading cells and building scenario mappings."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

DATA = Path(__file__).resolve().parents[1] / "data"
MODERN = DATA / "modern"


def read(name: str) -> pd.DataFrame:
    """A CSV of validation/data/modern/ (copied from shared/published/modern/)."""
    return pd.read_csv(MODERN / name)


def cell_int(value: Any) -> int | None:
    """An integer cell; None for empty, NaN, 'n/a', '-' and the like."""
    if value is None:
        return None
    if isinstance(value, float):
        return None if math.isnan(value) else int(value)
    if isinstance(value, int):
        return value
    text = str(value).strip().split()[0] if str(value).strip() else ""
    try:
        return int(float(text))
    except ValueError:
        return None


def cell_float(value: Any) -> float | None:
    if value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(out) else out


def scenario(name: str, model: str | dict, node: str | dict, num_gpus: int, parallelism: dict[str, Any],
             training: dict[str, Any], fabric: str = "fat-tree") -> dict[str, Any]:
    return {"name": name, "model": model,
            "cluster": {"node": node, "fabric": fabric, "num_gpus": num_gpus},
            "parallelism": parallelism, "training": training}


def node_variant(base: str, accelerator_overrides: dict[str, Any] | None = None,
                 node_overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """A catalog node that differs in a few datasheet values (its accelerator's HBM, its NICs),
    resolved with the framework profile in validation/modern/profiles.py."""
    overrides = dict(node_overrides or {})
    if accelerator_overrides:
        overrides["accelerator"] = accelerator_overrides
    return {"base": base, "overrides": overrides}


def megatron_layout(tp: int, pp: int, cp: int, vp: int, ep: int, mbs: int, gbs: int, zero_stage: int,
                    recompute: str = "none") -> dict[str, Any]:
    """Megatron-Core as NeMo / Megatron-Bridge run it today: sequence parallel and userbuffers TP
    overlap with tp > 1, the distributed optimizer (ZeRO-1) with gradient reduce and parameter
    gather overlapped, p2p overlapped, interleaved 1F1B with virtual stages."""
    return {"tp": tp, "pp": pp, "dp": "auto", "cp": cp, "ep": ep,
            "virtual_stages": vp, "schedule": "interleaved" if vp > 1 else "1f1b",
            "sequence_parallel": tp > 1, "tp_comm_overlap": tp > 1, "zero_stage": zero_stage,
            "recompute": recompute, "micro_batch_size": mbs, "global_batch_size": gbs,
            "overlap_grad_reduce": True, "overlap_param_gather": True, "overlap_p2p_comm": True,
            "overlap_tp_grad_comm": True}


def analytic_peak_fits(raw: dict[str, Any]) -> tuple[bool, float]:
    """Whether a scenario mapping's analytic peak memory fits its GPU (HBM less the reserve), and the
    peak in GiB: how a mapper picks what a source leaves out (a batch, a recompute policy) among the
    settings its run could have used at all."""
    from simulator.memory.analytic import GIB, fits, peak_rank_memory
    from simulator.scenario import load_scenario

    sc = load_scenario(raw)
    _, peak, per_stage = peak_rank_memory(sc)
    return fits(sc, peak, per_stage)[0], peak.total_bytes / GIB
