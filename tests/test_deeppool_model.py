"""DeepPool's A100 profiles as whole networks (issue 19): the CNN pooling / concatenation kernel
efficiencies fitted on the fit half, and the whole-model check (validation/deeppool_model.py)."""

from __future__ import annotations

import pytest

from hardware_specs.catalog import ACCELERATORS
from simulator.cost.compute import ComputeModel
from simulator.cost.memory_kernels import memory_kernel_class
from validation import deeppool_model
from workloads.networks.builder import NetBuilder


def test_a100_specs_carry_the_kernel_efficiencies_the_script_fits():
    fitted = deeppool_model.fitted_memory_kernels()
    for name in ("a100-sxm-40g", "a100-sxm-80g"):
        assert ACCELERATORS.get(name).efficiency.memory_kernels == fitted
    assert "fit half" in fitted.fitted_on and f">= {deeppool_model.MEMORY_MIN_BATCH}" in fitted.fitted_on


def test_kernel_class_is_the_builders_kernel_token():
    assert memory_kernel_class("layer1.0.pool.maxpool.grad") == "maxpool"
    assert memory_kernel_class("avgpool.adaptive_avgpool") == "adaptive_avgpool"
    assert memory_kernel_class("mixed_5b.concat") == "concat"
    assert memory_kernel_class("bn1.bn") == "bn"


def test_a_pool_runs_at_its_class_efficiency_and_a_relu_at_the_streaming_one():
    """Max pooling: bytes of x, y and the int64 indices each way, at the maxpool efficiency."""
    accel = ACCELERATORS.get("a100-sxm-40g")
    model = ComputeModel(accel, "fp32", tf32=True)
    b = NetBuilder("t", 8, 4)
    x = b._new((64, 112, 112), "previous")
    y = b.maxpool("pool", x, 3, 2, 1)
    b.relu("relu", y)
    pool, relu = b.layers
    n_in, n_out = 8 * 64 * 112 * 112, 8 * 64 * 56 * 56
    assert pool.forward[0].bytes_moved == 4 * (n_in + n_out) + 8 * n_out
    eff = accel.efficiency.memory_kernels.by_kernel["maxpool"]
    launch = accel.efficiency.kernel_launch_overhead_us * 1e-6
    assert model.time_s(pool.forward[0]) == pytest.approx(
        pool.forward[0].bytes_moved / (accel.hbm_bandwidth_gb_per_s * 1e9 * eff) + launch)
    assert model.time_s(relu.forward[0]) == pytest.approx(
        relu.forward[0].bytes_moved / (accel.hbm_bandwidth_gb_per_s * 1e9 * accel.efficiency.memory_bound_efficiency)
        + launch)


def test_blocks_are_whole_networks_and_their_rows_add_up_to_the_footers():
    """Nine blocks (VGG-16, ResNet-34, Inception-v3 at batch 32, 64, 128) whose measured rows add up
    to DeepPool's printed footers (seeds/deeppool_profile_blocks.csv: 54.964, 29.946, 168.958 ms)."""
    blocks = deeppool_model.whole_model_errors().set_index(["network", "batch"])
    assert len(blocks) == 9
    assert blocks.loc[("vgg", 32), "block_measured_ms"] == pytest.approx(54.964, abs=0.01)
    assert blocks.loc[("resnet", 64), "block_measured_ms"] == pytest.approx(29.946, abs=0.01)
    assert blocks.loc[("inception", 128), "block_measured_ms"] == pytest.approx(168.958, abs=0.01)
    assert (blocks.heldout_rows > 0).all()


def test_gpu_bound_blocks_within_the_whole_model_target():
    """At batch 64 and 128 (the GPU sets the pace) every network's held-out rows add up within 5%."""
    blocks = deeppool_model.whole_model_errors()
    gpu_bound = blocks[blocks.batch >= deeppool_model.MEMORY_MIN_BATCH]
    print(gpu_bound.to_string())
    assert len(gpu_bound) == 6
    assert (gpu_bound.heldout_error.abs() <= deeppool_model.WHOLE_MODEL_TARGET).all()


@pytest.mark.xfail(strict=True, reason="issue 19 whole-model target (<= 5% per model) unmet at batch 32: held-out "
                                       "rows VGG-16 -5.2%, Inception-v3 -8.4% (ResNet-34 -4.1%: met; batch 64/128: "
                                       "all six within 3.4%) with DeepPool's host time per kernel (20 us, fitted on the "
                                       "fit-half rows of the nine blocks, each pass issue-bound); before it -7.0/-10.0/"
                                       "-5.5%. What is left is in GPU-bound rows: Inception's concatenations and small "
                                       "convolutions, VGG's large convolutions and fully connected layers at batch 32")
def test_every_block_within_the_whole_model_target():
    blocks = deeppool_model.whole_model_errors()
    assert (blocks.heldout_error.abs() <= deeppool_model.WHOLE_MODEL_TARGET).all()


def test_each_pass_of_a_row_is_issue_bound_by_the_fitted_host_time():
    """A row's forward and backward each end at max_j (j·host + the kernels from the j-th on) (an empty launch
    queue at each pass, simulator/cost/host_floor.py); a kernel-less flatten row costs nothing, and a
    single-kernel pass costs the host time plus its kernel."""
    host = deeppool_model.fitted_host_s()
    assert 5e-6 <= host <= 100e-6
    rows = deeppool_model.block_rows()
    flatten = next(r for r in rows if r.layer_type == "flatten")
    assert deeppool_model.simulated_s(flatten) == 0.0
    pool = next(r for r in rows if r.layer_type == "maxPool2d")
    (fwd,), (bwd,) = deeppool_model.pass_kernels_s(pool)
    assert deeppool_model.simulated_s(pool) == pytest.approx(2 * host + fwd + bwd)
    assert deeppool_model.simulated_s(pool, host_s=0.0) == pytest.approx(fwd + bwd)
