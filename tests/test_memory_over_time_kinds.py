"""Every strategy kind reports its simulated peak the same way (simulator/memory/over_time.py): the engine's
memory over time per actor fills ``simulated_peak_memory_gib`` (the result field, the sweep column of that name,
``--json``) and the "simulated peak" line under the memory table. The kinds without a pipeline schedule of
their own in the spmd planner (DAPPLE's replicated_pipeline, subnetwork_dp, layer_parallel_mgrit) build it from
their analytic breakdown with :class:`~simulator.memory.over_time.MemoryLedger`, so each actor's simulated peak
equals its analytic peak, over one step and over three.

Probes: each kind's smallest toy scenario of tests/test_framework_terms_coverage.py, and the kinds' examples.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from simulator.engine.engine import Task
from simulator.memory.analytic import MemoryBreakdown
from simulator.memory.over_time import MemoryLedger
from simulator.report.result import render_table
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.strategies.registry import load_kinds

sys.path.insert(0, str(Path(__file__).parent))
from test_framework_terms_coverage import _probe_raw  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LEDGER_KINDS = ("replicated_pipeline", "subnetwork_dp", "layer_parallel_mgrit")


def _actors_in_order(peaks: dict[str, float]) -> list[str]:
    return sorted(peaks, key=lambda name: int("".join(c for c in name if c.isdigit()) or 0))


@pytest.mark.parametrize("kind", sorted(load_kinds()))
def test_every_kind_reports_a_simulated_peak(kind):
    r = simulate(load_scenario(_probe_raw(kind, moe=False)))
    assert r.simulated_peak_memory_gib, f"{kind} tracks no memory over time"
    assert json.loads(json.dumps(r.to_dict()))["simulated_peak_memory_gib"] == max(r.simulated_peak_memory_gib.values())
    assert "simulated peak" in render_table(r)


@pytest.mark.parametrize("kind", LEDGER_KINDS)
@pytest.mark.parametrize("steps", [1, 3])
def test_ledger_kinds_simulated_peak_is_the_analytic_peak(kind, steps):
    sc = load_scenario(_probe_raw(kind, moe=False))
    sc = dataclasses.replace(sc, simulation=sc.simulation.model_copy(update={"steps": steps}))
    r = simulate(sc)
    simulated = [r.simulated_peak_memory_gib[a] for a in _actors_in_order(r.simulated_peak_memory_gib)]
    assert simulated == pytest.approx(r.memory_per_stage_gib, rel=1e-12)


@pytest.mark.parametrize("example", ["gnmt16-dapple-v100", "unet-dapple-8xa100", "resnet50-subnetwork-dp-a100",
                                     "resnet50-layer-parallel-mgrit-a100"])
def test_ledger_kinds_examples(example):
    r = simulate(load_scenario(ROOT / "examples" / f"{example}.yaml"))
    simulated = [r.simulated_peak_memory_gib[a] for a in _actors_in_order(r.simulated_peak_memory_gib)]
    assert simulated == pytest.approx(r.memory_per_stage_gib, rel=1e-12)


def test_ledger_by_hand():
    # base 10 (weights 4 + optimizer 5 + other 1), gradients 3, 2 bytes per micro-batch, working set 1.
    # F0 F1 B0 B1 update: 12, 14, B0 runs with 14 + 1 + 3 = 18, then 18 - 3 = 15, B1 16 -> 12, update frees 3.
    m = MemoryBreakdown(4.0, 3.0, 5.0, 2 * 2 + 1, 1.0)
    ledger = MemoryLedger(m, 2.0, 1.0)
    f0, f1, b0, b1, up = (Task(n, "x", "compute", "compute", duration_s=1.0) for n in ("f0", "f1", "b0", "b1", "up"))
    for t in (f0, f1):
        ledger.forward(t)
    ledger.backward(b0)
    ledger.backward(b1)
    ledger.update(up)
    assert ledger.base_bytes == 10.0
    assert [(t.alloc_bytes, t.free_bytes) for t in (f0, f1, b0, b1, up)] == [(2, 0), (2, 0), (4, 3), (1, 3), (0, 3)]
    live = peak = ledger.base_bytes
    for t in (f0, f1, b0, b1, up):
        live += t.alloc_bytes
        peak = max(peak, live)
        live -= t.free_bytes
    assert peak == m.total_bytes == 18.0 and live == ledger.base_bytes
