"""NeMo rows of the performance-script era (25.09 on) keep bf16 gradients and a fused cross entropy.

NeMo 2's ``scripts/performance`` (nemo_toolkit 2.5.0 ``helpers.py`` ``set_precision_configs``) and Megatron-Bridge's
performance recipes (megatron-bridge 0.6.2 ``perf_recipes/_common.py`` ``_perf_precision`` / ``_benchmark_common``)
set ``grad_reduce_in_fp32 = False``: Megatron-Core's grad buffer (every ``main_grad``) is then bf16, 2 B a parameter,
not 4 (validation/modern/nemo.py ``BF16_GRADS_FROM``). They also fuse the loss into Transformer Engine's cross
entropy, which keeps only the 16-bit logits (2 B a logit, not 6). The NeMo 1 rows (24.03, 24.07) keep fp32 gradients
(``optim.grad_sync_dtype`` defaults to fp32) and Megatron's unfused vocab-parallel loss.
"""

from __future__ import annotations

import pytest

from simulator.memory.analytic import GIB, peak_rank_memory, rank_memory, stage_params
from simulator.scenario import load_scenario
from validation.modern.nemo import BF16_GRADS_FROM, cases, release_number


@pytest.fixture(scope="module")
def nemo_cases():
    return {c.row: c for c in cases()[0]}


def _release(case) -> tuple[int, ...]:
    return release_number(case.label.split(" GPUs ")[1].split(" tp")[0])


def test_performance_script_rows_map_bf16_gradients_and_the_fused_loss(nemo_cases):
    newer = [c for c in nemo_cases.values() if _release(c) >= BF16_GRADS_FROM]
    older = [c for c in nemo_cases.values() if _release(c) < BF16_GRADS_FROM]
    assert len(newer) == 35 and len(older) == 23  # 25.09..26.06 / 24.03.01 and 24.07
    for c in newer:
        assert (c.scenario["training"]["grad_dtype"], c.scenario["training"]["fused_cross_entropy"]) == ("bf16", True)
    for c in older:
        assert "grad_dtype" not in c.scenario["training"] and "fused_cross_entropy" not in c.scenario["training"]


def test_row_63_stage_bytes_by_hand(nemo_cases):
    """GPT-OSS-120B row 63 (25.11: tp1 pp4 ep8, mbs 4, seq 4,096): every trained parameter keeps a 2-B bf16 weight and
    a 2-B bf16 gradient (the distributed optimizer's fp32 master and moments, 12 B, sharded over dp 16 for the dense
    ones, 2 for the experts); the last stage keeps the 16-bit logits alone: 4 x 4,096 tokens x 201,088 vocabulary
    rows x 2 B = 6.14 GiB (the unfused loss's 6 B a logit would be 18.4 GiB)."""
    sc = load_scenario(nemo_cases[63].scenario)
    for stage in (0, 3):
        b = rank_memory(sc, stage)
        n = stage_params(sc.model, sc.parallelism, stage)
        assert b.gradients_bytes == pytest.approx(2 * n) and b.weights_bytes == pytest.approx(2 * n)
    fp32 = load_scenario({**nemo_cases[63].scenario,
                          "training": {**nemo_cases[63].scenario["training"], "grad_dtype": "fp32"}})
    assert rank_memory(fp32, 0).gradients_bytes == pytest.approx(2 * rank_memory(sc, 0).gradients_bytes)
    logits = 4 * 4096 * 201088
    unfused = load_scenario({**nemo_cases[63].scenario,
                             "training": {**nemo_cases[63].scenario["training"], "fused_cross_entropy": False}})
    # the last 1F1B stage holds min(pp - (pp - 1), m) = 1 micro-batch in flight
    assert rank_memory(unfused, 3).activations_bytes - rank_memory(sc, 3).activations_bytes == pytest.approx(
        (6 - 2) * logits)
    assert 2 * logits / GIB == pytest.approx(6.14, abs=0.01)


def test_row_63_still_predicted_out_of_memory_and_its_mbs_1_twins_fit(nemo_cases):
    """Row 63: 96.0 GiB on stage 0 with bf16 gradients: still OOM, listed in memory_rows.UNEXPLAINED_OOM with these
    what-ifs, each computed here: fp32 gradients 104.2; the row's GA column (2 micro-batches: GBS 128 at MBS 4 on dp
    16) 67.2, fits; MBS 1 at GBS 512 51.8, fits (its mbs-1 twins, row 41, likewise); full recompute 47.0, fits; no
    recompute 136.0."""
    from simulator.memory.analytic import fits
    from validation.modern.memory_rows import UNEXPLAINED_OOM

    raw = nemo_cases[63].scenario

    def peak(training=None, parallelism=None, case=raw) -> tuple[bool, float]:
        sc = load_scenario({**case, "training": {**case["training"], **(training or {})},
                            "parallelism": {**case["parallelism"], **(parallelism or {})}})
        _, best, stages = peak_rank_memory(sc)
        return fits(sc, best, stages)[0], round(best.total_bytes / GIB, 1)

    what_ifs = {"mapped": peak(), "fp32 gradients": peak(training={"grad_dtype": "fp32"}),
                "GA 2": peak(parallelism={"global_batch_size": 128}),
                "MBS 1": peak(parallelism={"micro_batch_size": 1}),
                "full": peak(parallelism={"recompute": "full", "recompute_modules": None}),
                "none": peak(parallelism={"recompute": "none", "recompute_modules": None}),
                "row 41": peak(case=nemo_cases[41].scenario)}
    assert what_ifs == {"mapped": (False, 96.0), "fp32 gradients": (False, 104.2), "GA 2": (True, 67.2),
                        "MBS 1": (True, 51.8), "full": (True, 47.0), "none": (False, 136.0), "row 41": (True, 51.8)}
    text = UNEXPLAINED_OOM[("nemo", 63)]
    assert all(f"{gib:.1f}" in text for _, gib in what_ifs.values())
