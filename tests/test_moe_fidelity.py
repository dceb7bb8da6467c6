"""Mixture-of-experts fidelity on the current-hardware sets (issue 23): what the memory model holds for
FSDP with fp32 parameters (NeMo AutoModel's Qwen3 MoE 30B on 8 H100s fits), and which NeMo Qwen3 rows
are set aside and why."""

from __future__ import annotations

import pytest

from simulator.memory.analytic import GIB, bytes_per_param, fits, model_state_bytes, peak_rank_memory
from simulator.scenario import load_scenario
from validation.modern.registry import built


def _case(name: str, row: int):
    return next(c for c in built(name)[0] if c.row == row)


# --------------------------------------------------------------------------- fp32 parameters (FSDP)


def test_fp32_parameters_are_the_master_weights():
    # PyTorch FSDP2 MixedPrecisionPolicy(param_dtype=bf16): the sharded parameters stay fp32 and are the
    # optimizer's master copy, so Adam adds only its two moments; no 16-bit copy is kept; the reduced gradient is
    # cast back to the parameter's dtype, fp32 (torch 2.13 foreach_reduce _to_dtype_if_needed(reduce_output,
    # orig_dtype))
    assert bytes_per_param("bf16", "adam", fp32_params=True) == {"weights": 4, "gradients": 4, "optimizer": 8}
    assert bytes_per_param("bf16", "sgd", fp32_params=True) == {"weights": 4, "gradients": 4, "optimizer": 4}
    assert bytes_per_param("bf16", "adam") == {"weights": 2, "gradients": 2, "optimizer": 12}
    # ZeRO-3 over 8 ranks with fp32 gradients: 16 B per parameter in all, sharded, against 18 B
    assert sum(model_state_bytes(8.0, 3, 8, "bf16", "adam", grad_bytes=4, fp32_params=True)) == pytest.approx(16.0)
    assert sum(model_state_bytes(8.0, 3, 8, "bf16", "adam", grad_bytes=4)) == pytest.approx(18.0)
    # an fp32 run already holds fp32 weights: the switch changes nothing there
    assert bytes_per_param("fp32", "adam", fp32_params=True) == bytes_per_param("fp32", "adam")


def _memory(raw: dict):
    sc = load_scenario(raw)
    _, peak, per_stage = peak_rank_memory(sc)
    return sc, peak, fits(sc, peak, per_stage)[0]


def test_automodel_qwen3_moe_fits_in_80_gb_with_fsdp2_parameters():
    c = _case("other", 6)  # NeMo AutoModel Qwen3 MoE 30B, 8 H100, FSDP 8 x EP 8, mbs 4, s 4096, BF16
    assert c.scenario["training"]["param_dtype"] == "fp32"
    assert c.scenario["parallelism"]["recompute"] == "full" and c.scenario["parallelism"]["ep"] == 8
    sc, peak, ok = _memory(c.scenario)
    assert ok
    params = 30_532_122_624
    dense = params - 48 * 128 * 3 * 2048 * 768
    local = dense / 8 + (params - dense) / 8  # dense sharded over FSDP 8, experts over EP 8 (EDP 1)
    assert peak.weights_bytes == pytest.approx(4 * local, rel=1e-6)
    assert peak.optimizer_bytes == pytest.approx(8 * local, rel=1e-6)
    # with a separate 16-bit weight copy beside the fp32 master (Megatron / DeepSpeed) it would not fit
    raw = {**c.scenario, "training": {**c.scenario["training"], "param_dtype": "auto"}}
    _, peak_auto, ok_auto = _memory(raw)
    assert not ok_auto and peak_auto.total_bytes / GIB > 80 > 78 > peak.total_bytes / GIB
    states = (peak_auto.weights_bytes + peak_auto.optimizer_bytes) - (peak.weights_bytes + peak.optimizer_bytes)
    assert states == pytest.approx(2 * local, rel=1e-6)  # 2 + 12 B against 4 + 8 B per local parameter


def test_fms_fsdp_rows_hold_fp32_parameters_too():
    c = _case("other", 30)  # IBM fms-fsdp Llama 2 7B on 96 H100s (PyTorch FSDP1)
    assert c.scenario["training"]["param_dtype"] == "fp32"


# --------------------------------------------------------------------------- NeMo Qwen3 rows set aside


def test_the_slow_qwen3_pp2_releases_are_set_aside_with_their_twin():
    aside = {c.row: c.set_aside for c in built("nemo")[0] if c.set_aside and "Qwen3" in c.set_aside}
    assert set(aside) == {58, 64}
    assert "26.02.01" in aside[58] and "1.77x" in aside[58] and "row 52" in aside[58]
    assert "1.99x" in aside[64] and "row 71" in aside[64]
    assert all("6% of the FP8 peak" in why for why in aside.values())
    # their twins are counted
    assert not _case("nemo", 52).set_aside and not _case("nemo", 71).set_aside
    assert _case("nemo", 52).key == _case("nemo", 58).key  # one configuration measured twice


def test_a_row_whose_accumulation_column_disagrees_with_its_batch_is_set_aside():
    # of the 13 NeMo rows that give GA, only GPT-OSS row 63 (25.11) disagrees: GA 2 vs 512 / (4 x 16) = 8
    aside = {c.row: c.set_aside for c in built("nemo")[0] if c.set_aside}
    assert set(aside) == {58, 63, 64}
    assert "GA 2 where GBS 512 / (MBS 4 x DP 16) = 8 micro-batches" in aside[63]
    from validation.modern.nemo import batch_contradiction
    row = {"ga": 8.0, "gbs": 512, "mbs": 4, "num_gpus": 64, "tp": 1, "pp": 4, "cp": 1}
    assert batch_contradiction(row) == ""
    assert "GA 2 " in batch_contradiction({**row, "ga": 2.0})
    assert batch_contradiction({**row, "ga": float("nan")}) == ""  # no GA column: nothing to check
    assert batch_contradiction({**row, "ga": 16.0, "cp": 2}) == ""  # cp shares the GPUs: dp 8


# --------------------------------------------------------------------------- what-if overrides


def test_an_override_changes_every_case_and_only_the_what_if(monkeypatch):
    from validation.modern import registry

    seen: list[dict] = []

    def fake(raws, workers=2):
        seen.extend(raws)
        return [{"tokens_per_s": 1.0, "model_tflops_per_gpu": 1.0, "fits": True} for _ in raws]

    monkeypatch.setattr(registry, "simulate_many", fake)
    registry.evaluate("other", "all", overrides=("parallelism.moe_dispatch=deepep",))
    assert len(seen) == len(built("other")[0])
    assert all(raw["parallelism"]["moe_dispatch"] == "deepep" for raw in seen)
    seen.clear()
    registry.evaluate("other", "all")  # the cases as mapped: DeepEP only where the row names it
    assert {raw["parallelism"].get("moe_dispatch") for raw in seen} == {None, "deepep"}
    assert all(c.scenario["parallelism"].get("moe_dispatch") != "deepep" for c in built("other")[0]
               if c.scenario["model"] == "llama3-70b")


@pytest.mark.parametrize("args", [["--override", "nokey"], ["--fit", "--override", "parallelism.ep=2"]])
def test_a_bad_override_or_a_fit_with_one_exits_2(args):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "validation.modern", "--set", "other", *args],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert "--override" in out.stderr and out.stderr.strip().splitlines()[-1].count("error") == 1
