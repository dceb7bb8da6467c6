"""The misaligned-GEMM factor applies to row strides, not to row counts (simulator/cost/compute.py is_aligned).

Found by the Blackwell sanity table (validation/blackwell_sanity.py): Mixtral 8x7B with moe_load_imbalance 1.2
gave each busiest expert 9,830 tokens, and every one of its GEMMs on Hopper took the 0.69 misalignment factor
(fitted on the H100 torch.bmm d_ff sweep, where d_ff is a stride), so the imbalance cost H100 +54% of its
compute against B200's +15%, and B200 came out 2.65x H100 (more than any of its parts: GEMM 2.20x)."""

from __future__ import annotations

import pytest

from hardware_specs.catalog import ACCELERATORS
from simulator.cost.compute import ComputeModel, is_aligned
from workloads.graph import Op

H100 = ACCELERATORS.get("h100-sxm-80g")


def _gemm(name: str, m: int, n: int, k: int) -> Op:
    return Op(name, "gemm", 2.0 * m * n * k, 2.0 * (m * k + k * n + m * n), m, n, k)


def test_strides_decide_alignment():
    assert is_aligned(9830, 4096, 4096, "bf16")               # tokens (rows) of a forward GEMM: any count
    assert not is_aligned(4096, 4096, 10923, "bf16")          # the d_ff sweep's misaligned K (a stride)
    assert not is_aligned(4096, 50257, 4096, "bf16")          # GPT-2's vocabulary as the output width
    assert is_aligned(4096, 14336, 9830, "bf16", weight_grad=True)      # dW = X^T dY: tokens are its k
    assert not is_aligned(4097, 14336, 8192, "bf16", weight_grad=True)  # ... and its m a stride
    assert is_aligned(4096, 16, 4096, "fp8") and not is_aligned(4096, 8, 4096, "fp8")  # 16 bytes of fp8


@pytest.mark.parametrize("name", ["experts.fc1", "experts.fc1.dgrad", "experts.fc1.wgrad"])
def test_an_odd_token_count_costs_no_more_than_its_flops(name):
    # the same GEMM with 9,830 and 9,832 tokens: time in proportion to the work, no 0.69 step
    model = ComputeModel(H100, "bf16")
    assert H100.efficiency.misaligned_gemm_factor < 0.75

    def op(tokens: int) -> Op:
        if name.endswith(".wgrad"):
            return _gemm(name, 4096, 14336, tokens)
        return _gemm(name, tokens, 14336, 4096)
    ratio = model.time_s(op(9830)) / model.time_s(op(9832))
    assert ratio == pytest.approx(9830 / 9832, rel=0.01)


def test_a_misaligned_stride_still_takes_the_factor():
    model = ComputeModel(H100, "bf16")
    slow = model.time_s(_gemm("fc1", 8192, 4096, 10923)) / model.time_s(_gemm("fc1", 8192, 4096, 10928))
    assert slow == pytest.approx(1 / H100.efficiency.misaligned_gemm_factor, rel=0.02)
