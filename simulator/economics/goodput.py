"""Goodput under failures: the analytic model (simulated: simulator/economics/job_timeline.py).

A long training job is interrupted now and then (a GPU falls off the bus, a switch reboots,
a host goes to maintenance). Every interruption costs the work done since the last
checkpoint plus the time to restart; checkpoints cost the time to write them. The model:

- **Interruption rate.** Per-component failure rates *per GPU-hour* (default: Llama 3's
  Table 5, 419 unexpected interruptions in a 54-day snapshot on 16,384 H100 GPUs, Dubey et
  al. 2024, arXiv:2407.21783, Sec. 3.3.4), summed over components and multiplied by the GPUs
  of the job: ``λ_job = N · Σ_c λ_c``; the job's mean time between interruptions is
  ``M = 1/λ_job`` (failures are independent and exponentially distributed; a rate quoted per
  GPU that in fact belongs to a host or a switch scales the same way, as long as the job is
  built of the same nodes).
- **Checkpoint write time** ``δ = bytes / bandwidth``: model state (weights + optimizer state,
  ~14 bytes per parameter for mixed-precision Adam; Narayanan et al. 2021 Sec. 5.10 report
  13.8 TB for their 1T model) over the aggregate storage write bandwidth.
- **Checkpoint interval** ``τ = sqrt(2·δ·M)`` (Young 1974, "A first order approximation to the
  optimum checkpoint interval", CACM 17(9):530; the leading term of Daly 2006, FGCS 22:303).
- **Restart time** ``R``: scheduling, initialisation, and re-reading the checkpoint.
- **Wall time.** Useful work ``T`` takes ``T·(1 + δ/τ)`` including checkpoints; each
  interruption, ``W/M`` of them over a wall time ``W``, costs ``R`` plus on average half a
  segment of lost work ``(τ + δ)/2`` (Daly 2006, Eq. 5, first order), so
  ``W = T·(1 + δ/τ) + (W/M)·(R + (τ + δ)/2)``, i.e.
  ``W = T·(1 + δ/τ) / (1 - (R + (τ + δ)/2)/M)`` and **goodput** ``= T/W``.
  When the denominator is not positive the job never finishes (goodput 0).

Llama 3 report ">90% effective training time" over that snapshot; with a ~10-minute restart
this model gives about 92% for their 405B run (see tests/test_goodput.py).
"""

from __future__ import annotations

import csv
import math
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

from simulator.errors import ConfigError

LLAMA3_TABLE5 = Path(__file__).resolve().parents[2] / "validation" / "data" / "llama3_2024_table5_interruptions.csv"
"""Dubey et al. 2024 Table 5 (shipped as validation package data)."""

LLAMA3_SNAPSHOT_DAYS = 54.0
LLAMA3_SNAPSHOT_GPUS = 16_384
_SUMMARY_ROWS = {"TOTAL job interruptions (54 days)", "planned interruptions", "unexpected interruptions"}


@cache
def llama3_interruption_counts() -> dict[str, int]:
    """Unexpected interruptions by component in Llama 3's 54-day snapshot (Table 5): 419 in all."""
    if not LLAMA3_TABLE5.is_file():
        raise ConfigError("economics.failure_rates_per_gpu_hour", f"default failure data not found: {LLAMA3_TABLE5}")
    counts: dict[str, int] = {}
    with LLAMA3_TABLE5.open(newline="") as fh:
        for row in csv.DictReader(fh):
            if row["component"] in _SUMMARY_ROWS:
                continue
            counts[row["component"]] = int(row["interruption_count"])
    return counts


def llama3_failure_rates_per_gpu_hour() -> dict[str, float]:
    """Per-component interruption rates per GPU-hour: count / (54 days · 24 h · 16,384 GPUs)."""
    gpu_hours = LLAMA3_SNAPSHOT_DAYS * 24.0 * LLAMA3_SNAPSHOT_GPUS
    return {name: count / gpu_hours for name, count in llama3_interruption_counts().items()}


def job_interruption_rate_per_hour(num_gpus: int, rates_per_gpu_hour: dict[str, float], scale: float = 1.0) -> float:
    """Interruptions per hour of a job on ``num_gpus`` GPUs: ``scale · N · Σ rates``."""
    if num_gpus <= 0:
        raise ConfigError("cluster.num_gpus", "must be positive")
    for name, rate in rates_per_gpu_hour.items():
        if not (rate >= 0 and math.isfinite(rate)):
            raise ConfigError(f"economics.failure_rates_per_gpu_hour.{name}", "must be a finite rate >= 0")
    return scale * num_gpus * sum(rates_per_gpu_hour.values())


def checkpoint_write_seconds(checkpoint_bytes: float, write_gb_per_s: float) -> float:
    """Time to write one checkpoint: bytes over the aggregate write bandwidth (GB = 1e9 bytes)."""
    if write_gb_per_s <= 0:
        raise ConfigError("economics.checkpoint_write_gb_per_s_per_node", "bandwidth must be positive")
    return checkpoint_bytes / (write_gb_per_s * 1e9)


def young_daly_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Young's optimal checkpoint interval ``sqrt(2·δ·M)`` (seconds of work between checkpoints)."""
    if checkpoint_s < 0 or mtbf_s <= 0:
        raise ConfigError("economics", "checkpoint time must be >= 0 and MTBF > 0")
    return math.sqrt(2.0 * checkpoint_s * mtbf_s)


def goodput_fraction(mtbf_s: float, checkpoint_s: float, interval_s: float, restart_s: float) -> float:
    """Useful work / wall time, first-order model of the module docstring (0 when it never finishes)."""
    if interval_s <= 0:
        raise ConfigError("economics.checkpoint_interval_minutes", "must be positive")
    if math.isinf(mtbf_s):
        return 1.0 / (1.0 + checkpoint_s / interval_s)
    loss_fraction = (restart_s + (interval_s + checkpoint_s) / 2.0) / mtbf_s
    if loss_fraction >= 1.0:
        return 0.0
    return (1.0 - loss_fraction) / (1.0 + checkpoint_s / interval_s)


@dataclass(frozen=True)
class GoodputReport:
    """The analytic goodput of one job (times in seconds unless the name says otherwise)."""

    job_interruptions_per_day: float
    job_mtbf_hours: float | None          # None when no failures are modelled
    checkpoint_bytes: float
    checkpoint_write_s: float
    checkpoint_interval_s: float | None   # None when no failures and no interval given
    restart_s: float
    goodput: float

    def to_dict(self) -> dict:
        return asdict(self)


def analyse_goodput(
    *,
    num_gpus: int,
    checkpoint_bytes: float,
    write_gb_per_s: float,
    read_gb_per_s: float,
    restart_overhead_s: float,
    rates_per_gpu_hour: dict[str, float],
    rate_scale: float = 1.0,
    interval_s: float | None = None,
) -> GoodputReport:
    """Everything above for one job; ``interval_s`` None picks Young's optimum."""
    rate_h = job_interruption_rate_per_hour(num_gpus, rates_per_gpu_hour, rate_scale)
    delta = checkpoint_write_seconds(checkpoint_bytes, write_gb_per_s)
    if read_gb_per_s <= 0:
        raise ConfigError("economics.checkpoint_read_gb_per_s_per_node", "bandwidth must be positive")
    restart = restart_overhead_s + checkpoint_bytes / (read_gb_per_s * 1e9)
    if rate_h <= 0:
        tau = interval_s
        goodput = 1.0 if tau is None else goodput_fraction(math.inf, delta, tau, restart)
        return GoodputReport(0.0, None, checkpoint_bytes, delta, tau, restart, goodput)
    mtbf_s = 3600.0 / rate_h
    tau = interval_s if interval_s is not None else young_daly_interval_s(delta, mtbf_s)
    if tau <= 0:  # zero-cost checkpoints: checkpoint continuously, lose nothing but restarts
        goodput = max(0.0, 1.0 - restart / mtbf_s)
    else:
        goodput = goodput_fraction(mtbf_s, delta, tau, restart)
    return GoodputReport(rate_h * 24.0, mtbf_s / 3600.0, checkpoint_bytes, delta, tau, restart, goodput)
