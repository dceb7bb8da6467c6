"""Huge numbers in a scenario (a typo: extra zeros, bytes for a count) are refused in one line naming the field, in
seconds, instead of running for ever.

Before: the swarm example with ``model.num_layers`` (or hidden_size, vocab_size, seq_length, a NIC latency) of 10**30
ran for ever (per-layer loops over 10**30 layers; simulator/engine/failures.py drawing preemptions over an
astronomically long run), 10**6 layers took over a minute, and ``cluster.num_gpus: 10**30`` with dp auto named
``parallelism.global_batch_size``. The subprocess cases run under a timeout (a hang fails the test); each refusal
took < 1 s here.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from simulator.cli import main
from simulator.engine.failures import MAX_OUTAGES, OutageLimitError, draw_outage_arrays, expected_outages
from simulator.errors import ConfigError
from workloads.schema import MODEL_SIZE_LIMITS, TransformerSpec

ROOT = Path(__file__).resolve().parents[1]
HUGE = str(10**30)
#: A hang fails the test; the fixed runs take < 1 s (a loaded host: several times that).
TIMEOUT_S = 30


def _refused(*args: str) -> str:
    """Run ``clustersim ARGS`` under TIMEOUT_S; it must be refused in one line (exit 2, no traceback)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("CLUSTERSIM_CALIBRATION_DIR", None)
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "simulator", *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"clustersim {' '.join(args)} ran past {TIMEOUT_S} s")
    elapsed = time.perf_counter() - start
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr and len(lines) == 1 and lines[0].startswith("clustersim: error: "), \
        proc.stderr[-2000:]
    assert elapsed < TIMEOUT_S
    return lines[0]


@pytest.mark.parametrize("field", ["num_layers", "hidden_size", "vocab_size", "seq_length"])
def test_swarm_model_size_of_10_30_is_refused_naming_the_field(field):
    line = _refused("simulate", "examples/swarm-t4-preemptible.yaml", "--set", f"model.{field}={HUGE}")
    limit, _ = MODEL_SIZE_LIMITS[field]
    assert f"model.{field}:" in line and f"limit of {limit:,}" in line, line


def test_a_million_layers_is_refused_not_simulated_for_a_minute():
    line = _refused("simulate", "examples/gpt3-xl-parameter-server-v100.yaml", "--set", "model.num_layers=1000000")
    assert "model.num_layers:" in line and "1,000" in line, line  # the bound's reason: DeepNet's 1,000 layers


def test_swarm_step_astronomically_long_refuses_the_preemption_draw():
    """Model sizes within their bounds can still make a step so long that drawing the peers' preemptions over it
    would not end: refused up front with the count, the limit and the step. (A NIC latency of 10**30 us was refused
    so too; it is now past its own bound, hardware_specs/schema.py LINK_LIMITS, and named.)"""
    line = _refused("simulate", "examples/swarm-t4-preemptible.yaml", "--set", "model.hidden_size=1000000")
    assert "strategy.preemptions_per_hour:" in line and "over the limit of 100,000" in line, line
    line = _refused("simulate", "examples/swarm-t4-preemptible.yaml", "--set", f"cluster.node.nic_latency_us={HUGE}")
    assert line.startswith("clustersim: error: cluster.node.nic_latency_us: ") and "limit of 10,000,000" in line, line


def test_swarm_example_with_fewer_steps_still_runs():
    """The control: the example (a few dozen preemptions) is not refused."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main(["simulate", str(ROOT / "examples" / "swarm-t4-preemptible.yaml"), "--json"]) == 0, err.getvalue()


def test_num_gpus_10_30_with_dp_auto_names_num_gpus():
    line = _refused("simulate", "examples/gpt3-175b-1024-a100.yaml", "--set", f"cluster.num_gpus={HUGE}")
    assert line.startswith("clustersim: error: cluster.num_gpus: "), line
    assert "at most 98,304 GPUs" in line, line  # 1536 samples / micro-batch 1 x tp*cp*pp 64


def test_model_size_bounds_accept_the_bound_and_refuse_past_it():
    base = dict(name="m", num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=100, seq_length=16)
    for field, (limit, why) in MODEL_SIZE_LIMITS.items():
        value = limit if field != "num_attention_heads" else 64  # heads must divide hidden: check the bound alone
        TransformerSpec(**{**base, field: value})
        with pytest.raises(ValidationError, match=f"limit of {limit:,}"):
            TransformerSpec(**{**base, field: limit + 1})
        assert why


def test_outage_draw_past_the_limit_is_refused_before_drawing():
    """16 actors failing once an hour over 10**12 s would be 4.4e9 outages (tens of GB, minutes to hours)."""
    start = time.perf_counter()
    with pytest.raises(OutageLimitError) as info:
        draw_outage_arrays(np.random.default_rng(0), 16, 1.0, 1e12)
    assert info.value.limit == MAX_OUTAGES and info.value.expected == pytest.approx(16 * 1e12 / 3600)
    assert isinstance(info.value, ConfigError)  # a caller that does not check first still ends in one line
    assert time.perf_counter() - start < 5


def test_reliability_over_a_hundred_million_days_is_refused_in_one_line():
    """The job timeline's failure draw (simulator/economics/simulated_goodput.py) past the limit: before the bound it
    drew ~2.7e8 outages (tens of GB of Python objects); now the bound's ConfigError is one line, exit 2."""
    line = _refused("simulate", "examples/llama3-405b-16k-h100-failures.yaml", "--set", "reliability.days=100000000")
    assert "outages" in line and "over the limit of 10,000,000" in line and "days or steps" in line, line
    assert line.startswith("clustersim: error: reliability.days: "), line  # the field that set the horizon


def test_local_learning_aux_layers_past_the_layer_bound_is_refused():
    """An auxiliary head of 10**6 layers took over 20 s in per-layer loops (10**30: for ever); the bound is a
    model's own num_layers' (workloads/schema.py MODEL_SIZE_LIMITS)."""
    line = _refused("simulate", "examples/gpt-1.7b-local-learning-a100.yaml", "--set", "strategy.aux_layers=1000000")
    assert "strategy.aux_layers:" in line and "20000" in line.replace(",", ""), line


@pytest.mark.parametrize("renewal", ["after_repair", "immediate"])
def test_expected_outages_is_the_mean_count(renewal):
    """The estimate the bound uses is the renewal count's mean (within 3% over ~20,000 outages)."""
    arrays = draw_outage_arrays(np.random.default_rng(3), 200, 1.0, 100 * 3600.0, down_mean_s=600.0,
                                down_distribution="exponential", renewal=renewal)
    assert len(arrays) == pytest.approx(expected_outages(200, 1.0, 100 * 3600.0, 600.0, renewal), rel=0.03)
