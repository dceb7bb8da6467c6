"""The ``local_sgd`` kind (simulator/strategies/local_sgd.py): H inner steps per replica without
gradient reduction, then an outer all-reduce of the parameter deltas and an outer step.

Toy cluster of tests/test_simulate.py, dp = 2 on NVLink (100 GB/s, 1 us): an inner step is
T = 3·3·L·t (m = 3 micro-batches); the memory-bound delta and outer-step kernels take ~1e-13 s
(HBM 1e12 GB/s). The outer all-reduce of P deltas over 2 ranks: 2·1 us + 2·(n-1)/n · P·e / 100 GB/s,
e = 2 B (the toy's bf16 gradient dtype, as DDP) = the spmd all-reduce T_AR; int8: e = 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_simulate import T_LAYER, TOY_PARAMS, L, toy_raw

from simulator.errors import ConfigError
from simulator.report.result import render_table
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.strategies.local_sgd import LocalSgdPlanner
from simulator.strategies.spmd.plan import Planner

T = 3 * 3 * L * T_LAYER
T_AR = 2e-6 + 2 * TOY_PARAMS / 100e9
T_AR_INT8 = 2e-6 + TOY_PARAMS / 100e9


def scenario(steps: int, num_gpus: int = 2, **strategy):
    raw = toy_raw(num_gpus, nvl_gb_per_s=100, nvl_latency_us=1, dp=num_gpus, global_batch_size=3 * num_gpus,
                  overlap_grad_reduce=False)
    raw["simulation"] = {"steps": steps}
    if strategy:
        raw["strategy"] = {"kind": "local_sgd", **strategy}
    return load_scenario(raw)


@pytest.mark.parametrize("mode", ["symmetric", "full"])
def test_blocking_outer_sync_every_h_steps(mode):
    r = simulate(scenario(4, local_steps=2), mode=mode)
    assert r.step_times_s == pytest.approx([T, T + T_AR, T, T + T_AR], rel=1e-9)
    assert r.step_time_s == pytest.approx(T + T_AR / 2, rel=1e-9)


def test_int8_compression_halves_the_bytes_of_bf16():
    r = simulate(scenario(2, local_steps=2, compression="int8"))
    assert r.step_times_s == pytest.approx([T, T + T_AR_INT8], rel=1e-9)


def test_overlapped_sync_hides_behind_the_next_inner_step():
    # tau = 1: the all-reduce after step 1 runs beside step 2 (T >> T_AR) and the outer step is applied
    # before step 3; the last period's all-reduce has nothing after it to hide behind.
    r = simulate(scenario(4, local_steps=2, overlap_inner_steps=1))
    assert r.step_times_s == pytest.approx([T, T, T, T + T_AR], rel=1e-9)


def test_steps_round_up_to_whole_periods():
    r = simulate(scenario(1, local_steps=3))
    assert r.steps == 3 and len(r.step_times_s) == 3


def _dp_bytes(plan) -> float:
    return sum(b for (actor, stream), tasks in plan.streams.items() if stream == "dp"
               for t in tasks for b in (t.demands or {}).values())


@pytest.mark.parametrize("h", [1, 4])
def test_dp_bytes_per_inner_step_are_ddp_bytes_over_h(h):
    ddp = _dp_bytes(Planner(scenario(h)).build()) / h
    local = _dp_bytes(LocalSgdPlanner(scenario(h, local_steps=h)).build()) / h
    assert ddp > 0 and local == pytest.approx(ddp / h, rel=1e-12)


def test_memory_adds_the_outer_anchor_and_momentum():
    # fp32 anchor + fp32 Nesterov momentum: 8 B per parameter on top of the spmd count.
    spmd, local = simulate(scenario(1)), simulate(scenario(2, local_steps=2))
    assert (local.peak_memory_gib - spmd.peak_memory_gib) * 2**30 == pytest.approx(8 * TOY_PARAMS)
    assert local.simulated_peak_memory_gib["stage0"] == pytest.approx(local.peak_memory_gib, rel=1e-12)


def test_convergence_counts_h_and_the_overlap_staleness():
    raw = toy_raw(2, dp=2, global_batch_size=6)
    raw["strategy"] = {"kind": "local_sgd", "local_steps": 4, "overlap_inner_steps": 2}
    raw["convergence"] = {"source": "test", "steps_to_target": 1000, "staleness": {"per_step_of_delay": 0.1},
                          "local_steps": {"per_extra_local_step": 0.01}}
    r = simulate(load_scenario(raw)).to_dict()
    assert r["steps_to_target"] == pytest.approx(1000 * 1.2 * 1.03)


@pytest.mark.parametrize(("strategy", "par", "field"), [
    ({"local_steps": 0}, {}, "strategy.local_steps"),
    ({"local_steps": 2, "overlap_inner_steps": 2}, {}, "strategy.overlap_inner_steps"),
    ({"local_steps": 2, "compression": "fp4"}, {}, "strategy.compression"),
    ({"local_steps": 2}, {"zero_stage": 1}, "parallelism.zero_stage"),
])
def test_bad_config_names_the_field(strategy, par, field):
    raw = toy_raw(2, dp=2, global_batch_size=6, **par)
    raw["strategy"] = {"kind": "local_sgd", **strategy}
    with pytest.raises(ConfigError) as err:
        simulate(load_scenario(raw))
    assert err.value.field == field


def test_rounded_steps_are_said_in_the_text_and_the_json():
    """``--steps 8`` on the DiLoCo example (H = 16) runs one whole period: the table and --json say
    8 asked, 16 run, and why (the text and the JSON runs started together)."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    cmd = [sys.executable, "-m", "simulator", "simulate", str(root / "examples/llama3-8b-diloco-h100.yaml"),
           "--steps", "8"]
    text, js = (subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                for c in (cmd, [*cmd, "--json"]))
    (text_out, text_err), (json_out, json_err) = text.communicate(), js.communicate()
    assert text.returncode == 0, text_err
    assert js.returncode == 0, json_err
    assert "8 steps asked, 16 run (one whole period of H = 16)" in text_out
    assert "mean of 16 steps" in text_out
    out = json.loads(json_out)
    assert (out["steps_requested"], out["steps_run"], out["steps"]) == (8, 16, 16)
    assert out["steps_rounding"] == "one whole period of H = 16"
    assert len(out["step_times_s"]) == 16


def test_steps_not_rounded_say_nothing_more():
    r = simulate(scenario(4, local_steps=2))
    assert (r.to_dict()["steps_requested"], r.to_dict()["steps_run"], r.steps_rounding) == (4, 4, None)
    assert "asked" not in render_table(r)
    r = simulate(scenario(4, local_steps=3))  # two periods of 3
    assert "4 steps asked, 6 run (2 whole periods of H = 3)" in render_table(r)
