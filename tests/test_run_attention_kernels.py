"""The attention kernel each published run used, from its source: ``training.attention_kernel: cudnn``
(Transformer Engine's choice on Hopper+, measured nowhere: priced as the accelerator's default kernel,
every constant assumed), the per-run table validation/data/modern/attention_kernel_by_run.csv applied by
the modern mappers, and the causal FLOP convention of ml-engineering's step (row 22 of the other set)."""

from __future__ import annotations

import pandas as pd
import pytest

from hardware_specs.catalog import ACCELERATORS
from simulator.cost.attention_kernel import ATTENTION_CONSTANTS, with_attention_kernel
from simulator.cost.provenance import efficiency_provenance
from simulator.scenario import load_scenario
from validation.modern.case import outcome
from validation.modern.mapping import MODERN
from validation.modern.registry import built
from validation.modern.run_kernels import CSV, run_kernel
from workloads.catalog import resolve_model


def _scenario(node: str, **training) -> dict:
    return {"model": "llama3-8b", "cluster": {"node": node, "num_gpus": 8},
            "parallelism": {"tp": 1, "pp": 1, "global_batch_size": 8, "micro_batch_size": 1, "zero_stage": 3},
            "training": {"seq_length": 8192, **training}}


@pytest.mark.parametrize("accelerator", ["h100-sxm-80g", "h200-sxm-141g", "b200"])
def test_cudnn_prices_as_the_default_kernel_with_every_constant_assumed(accelerator):
    part = ACCELERATORS.get(accelerator)
    cudnn = with_attention_kernel(part, "cudnn", "flash").efficiency.attention
    default = part.efficiency.attention
    assert cudnn.kernel == "cuDNN fused attention"
    assert cudnn.model_dump(include=set(ATTENTION_CONSTANTS)) == default.model_dump(include=set(ATTENTION_CONSTANTS))
    assert set(cudnn.assumed) == set(ATTENTION_CONSTANTS) and cudnn.fitted_on is None
    assert default.kernel in cudnn.source


def test_cudnn_changes_the_provenance_not_the_time():
    from simulator.simulate import simulate_point

    auto, cudnn = _scenario("dgx-h100"), _scenario("dgx-h100", attention_kernel="cudnn")
    assert simulate_point(cudnn)["step_time_s"] == simulate_point(auto)["step_time_s"]
    prov = efficiency_provenance(load_scenario(cudnn))
    assert prov["attention_kernel"] == "assumed"  # the kernel assumed whole: one entry, not one per constant
    assert not any(key.startswith("attention_kernel.") for key in prov)
    # without a default fused kernel (A100: the GEMM-curve estimate) cudnn keeps that fallback
    a100 = load_scenario(_scenario("dgx-a100-80g", attention_kernel="cudnn"))
    assert a100.accelerator.efficiency.attention is None
    assert efficiency_provenance(a100)["attention_efficiency_factor"] == "assumed"


def test_every_run_line_names_its_source_and_a_kernel_the_simulator_knows():
    df = pd.read_csv(MODERN / CSV)
    assert not df.duplicated(["set", "run", "gpu"]).any()
    assert set(df.attention_kernel) <= {"auto", "fa2", "fa3", "triton", "cudnn"}
    assert df.source.str.len().min() > 40 and df.kernel_run.notna().all()


@pytest.mark.parametrize("name", ["nemo", "torchtitan", "llmfoundry", "other"])
def test_every_hopper_case_names_the_kernel_its_run_used(name):
    for case in built(name)[0]:
        kernel = case.scenario["training"].get("attention_kernel", "auto")
        if case.accelerator.startswith(("h100", "h200")):
            assert kernel != "auto", case.label  # Hopper rows say which kernel ran
        else:
            assert kernel == "auto", case.label  # A100 / MI300X keep their calibrated default


def test_run_kernels_by_framework():
    assert run_kernel("nemo", "nemo", "H100").attention_kernel == "cudnn"
    assert run_kernel("other", "deepspeed-hf", "H200").attention_kernel == "fa3"
    assert {c.scenario["training"]["attention_kernel"] for c in built("nemo")[0]} == {"cudnn"}
    row22 = next(c for c in built("other")[0] if c.row == 22)
    assert row22.scenario["training"]["attention_kernel"] == "fa3"
    with pytest.raises(KeyError):
        run_kernel("torchtitan", "torchtitan", "B200")  # a run the table lacks must be added, not guessed


def test_causal_count_is_converted_with_the_causal_half_of_the_attention_core_taken_off():
    # ml-engineering's TFLOP/s count the causal half of s x s; the simulator's model FLOPs the whole product
    row22 = next(c for c in built("other")[0] if c.row == 22)
    spec = resolve_model("llama3-8b")
    assert row22.uncounted_flops_per_token == 6.0 * spec.num_layers * 8192 * spec.num_attention_heads * spec.head_dim
    tokens, tflops = 8 * 10_000.0, 500.0  # a result: 10,000 tokens/s per GPU at 500 model TFLOP/s per GPU
    got = outcome(row22, {"tokens_per_s": tokens, "model_tflops_per_gpu": tflops, "fits": True})
    flops_per_token = tflops * 1e12 / 10_000.0 - row22.uncounted_flops_per_token
    assert got.measured_rate_per_gpu == pytest.approx(row22.measured_tflops * 1e12 / flops_per_token)
    # the same row without the correction reads fewer tokens/s (the simulator's larger count per token)
    plain = outcome(row22.__class__(**{**row22.__dict__, "uncounted_flops_per_token": 0.0}),
                    {"tokens_per_s": tokens, "model_tflops_per_gpu": tflops, "fits": True})
    assert plain.measured_rate_per_gpu < got.measured_rate_per_gpu


def test_the_report_lists_each_row_kernel():
    from validation.modern.registry import report

    case = next(c for c in built("other")[0] if c.row == 22)
    block = report("other", [outcome(case, {"tokens_per_s": 8e4, "model_tflops_per_gpu": 400.0, "fits": True})])
    assert block["cases"][0]["attention_kernel"] == "fa3"
