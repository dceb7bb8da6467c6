"""Time, cost and energy to train (simulator/economics/cost.py).

Narayanan et al. 2021 Sec. 5.1 (validation/data/narayanan2021_text_numbers.csv): GPT-3 175B on
1024 A100 at 140 TFLOP/s for 300B tokens ~ 34 days; 1T on 3072 A100 at 163 TFLOP/s for 450B
tokens ~ 84 days. Tolerance 3% (their figures are rounded to whole days and their 8·T·P/(n·X)
drops the attention and logit terms that Eq. 3 counts: 2.1% for 175B, 1.1% for 1T).
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from simulator.economics.cost import (
    ECONOMICS_KEYS,
    EconomicsSpec,
    checkpoint_bytes_per_parameter,
    gpu_power_watts,
    narayanan_training_days,
    training_economics,
)
from simulator.errors import ConfigError
from simulator.scenario import load_scenario
from validation.closed_forms import narayanan_flops_with_recompute, narayanan_params

DATA = Path(__file__).resolve().parent.parent / "validation" / "data"
TOLERANCE = 0.03


def _published_days() -> dict[str, float]:
    with (DATA / "narayanan2021_text_numbers.csv").open(newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["category"] == "training_time_estimate"]
    return {("175B" if "175B" in r["item"] else "1T"): float(r["value"]) for r in rows}


CASES = {
    # name: (model, gpus, tp, pp, gbs, tokens, tflops, l, h)
    "175B": ("gpt3-175b", 1024, 8, 8, 1536, 300e9, 140.0, 96, 12288),
    "1T": ("gpt-1t", 3072, 8, 64, 3072, 450e9, 163.0, 128, 25600),
}


def _narayanan_result(case: str) -> tuple[object, dict]:
    """A scenario of the case and a result whose step runs at X TFLOP/s by Narayanan's Eq. 3."""
    model, gpus, tp, pp, gbs, tokens, tflops, layers, hidden = CASES[case]
    scenario = load_scenario(
        None,
        [f"model={model}", f"cluster.num_gpus={gpus}", f"parallelism.tp={tp}", f"parallelism.pp={pp}",
         "parallelism.virtual_stages=1", "parallelism.schedule=1f1b", f"parallelism.global_batch_size={gbs}",
         f"training.tokens={tokens}", "economics.failures=false"],
    )
    flops = narayanan_flops_with_recompute(gbs, layers, 2048, hidden, 51200)
    step = flops / (gpus * tflops * 1e12)
    result = {"step_time_s": step, "tokens_per_s": gbs * 2048 / step, "fits": True, "hfu": tflops / 312,
              "time_breakdown_s": {"compute": 0.8 * step, "optimizer": 0.0}}
    return scenario, result


@pytest.mark.parametrize("case", ["175B", "1T"])
def test_narayanan_formula_matches_text(case):
    published = _published_days()[case]
    _, gpus, _, _, _, tokens, tflops, layers, hidden = CASES[case]
    params = narayanan_params(layers, hidden, 51200, 2048)
    days = narayanan_training_days(tokens, params, gpus, tflops)
    assert abs(days - published) / published < TOLERANCE, (case, days, published)


@pytest.mark.parametrize("case", ["175B", "1T"])
def test_training_economics_matches_text(case):
    published = _published_days()[case]
    scenario, result = _narayanan_result(case)
    out = training_economics(scenario, result)
    assert set(out) == set(ECONOMICS_KEYS)
    assert abs(out["time_to_train_days"] - published) / published < TOLERANCE, (case, out["time_to_train_days"])
    # failures off -> goodput only pays the checkpoints (Young interval undefined -> none taken)
    assert out["goodput"] == 1.0
    assert out["effective_time_to_train_days"] == pytest.approx(out["time_to_train_days"])


def test_175b_cost_energy_exact():
    scenario, result = _narayanan_result("175B")
    out = training_economics(scenario, result)
    hours = out["effective_time_to_train_days"] * 24
    assert out["gpu_hours"] == pytest.approx(1024 * hours)
    assert out["cost_usd"] == pytest.approx(1024 * hours * 2.0)
    # A100: idle 60, TDP 400, busy 0.8 -> 60 + 340*0.8 = 332 W; DGX A100 overhead 3300 W x 128 nodes; PUE 1.2
    assert out["gpu_power_watts"] == pytest.approx(332.0)
    facility_w = 1.2 * (1024 * 332.0 + 128 * 3300.0)
    assert out["avg_power_kw"] == pytest.approx(facility_w / 1e3)
    assert out["energy_mwh"] == pytest.approx(facility_w * hours / 1e6)
    # ~34.7 days x 24 h x 915 kW = 762 MWh
    assert 700 < out["energy_mwh"] < 830
    # checkpoint: 14 B/param (mixed-precision Adam)
    assert out["checkpoint_gb"] == pytest.approx(scenario_params(scenario) * 14 / 1e9)


def scenario_params(scenario) -> float:
    from workloads.counting import total_params

    return float(total_params(scenario.model))


def test_failures_fold_into_days():
    scenario, result = _narayanan_result("175B")
    scenario = load_scenario(None, ["training.tokens=300e9"])
    out = training_economics(scenario, result)
    assert 0.9 < out["goodput"] < 1.0
    assert out["effective_time_to_train_days"] == pytest.approx(out["time_to_train_days"] / out["goodput"])
    # 1024 GPUs at the Llama 3 rate: MTBF = 54*24*16384/(419*1024) h = 49.5 h
    assert out["job_mtbf_hours"] == pytest.approx(54 * 24 * 16 / 419)
    assert out["expected_interruptions"] == pytest.approx(out["effective_time_to_train_days"] * 24 / out["job_mtbf_hours"])
    doubled = load_scenario(None, ["training.tokens=300e9", "economics.failure_rate_scale=2"])
    assert training_economics(doubled, result)["goodput"] < out["goodput"]


def test_no_tokens_or_no_fit_gives_none():
    scenario = load_scenario(None, ["training.tokens=null"])
    out = training_economics(scenario, {"tokens_per_s": 1e5, "step_time_s": 1.0, "fits": True, "hfu": 0.5})
    assert out["time_to_train_days"] is None and out["cost_usd"] is None
    assert out["avg_power_kw"] > 0
    scenario = load_scenario(None)
    out = training_economics(scenario, {"tokens_per_s": 0.0, "step_time_s": None, "fits": False})
    assert out["time_to_train_days"] is None and out["energy_mwh"] is None


def test_power_model_and_overrides():
    spec = EconomicsSpec()
    assert gpu_power_watts(spec, 700.0, None, 1.0) == 700.0
    assert gpu_power_watts(spec, 700.0, None, 0.0) == pytest.approx(0.15 * 700)
    assert gpu_power_watts(EconomicsSpec(gpu_tdp_watts=500, gpu_idle_watts=100), 700.0, 50.0, 0.5) == 300.0
    with pytest.raises(ConfigError) as info:
        gpu_power_watts(EconomicsSpec(gpu_idle_watts=800), 700.0, None, 0.5)
    assert info.value.field == "economics.gpu_idle_watts"
    assert checkpoint_bytes_per_parameter("bf16", "adam") == 14
    assert checkpoint_bytes_per_parameter("fp32", "adam") == 12
    assert checkpoint_bytes_per_parameter("bf16", "sgd") == 10


@pytest.mark.parametrize(
    "override, field",
    [
        ("economics.pue=0.5", "economics.pue"),
        ("economics.gpu_hour_usd=-1", "economics.gpu_hour_usd"),
        ("economics.utilisation=2", "economics.utilisation"),
        ("economics.utilisation=sometimes", "economics.utilisation"),
        ("economics.bogus=1", "economics.bogus"),
        ("economics.failure_rates_per_gpu_hour={GPU: -1}", "economics.failure_rates_per_gpu_hour"),
    ],
)
def test_bad_economics_names_the_field(override, field):
    with pytest.raises(ConfigError) as info:
        load_scenario(None, [override])
    assert info.value.field == field, info.value
