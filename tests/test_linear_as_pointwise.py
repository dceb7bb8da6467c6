"""TF32 linear layers on the A100 priced as the 1x1 convolution passes they are (simulator/cost/compute.py,
``linear_as_pointwise_conv`` in the specs): a linear over M rows is the implicit GEMM of a 1x1 convolution
over M pixels, so its passes read the convolution shape model by their channels and reduction length,
not the GEMM's size (validation/deeppool_vit.py checks it on DeepPool's ViT, every row held out)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from hardware_specs.catalog import ACCELERATORS
from hardware_specs.schema import ComputeEfficiency
from simulator.cost.compute import ComputeModel, as_pointwise_pass, kernel_gemm_efficiency
from simulator.cost.provenance import ASSUMED, efficiency_provenance
from simulator.scenario import load_scenario
from workloads.networks.builder import NetBuilder

A100 = ACCELERATORS.get("a100-sxm-40g")
TF32_PEAK = 156e12
LAUNCH_S = 4e-6


def _linear_ops(batch: int, tokens: int = 257, in_features: int = 512, out_features: int = 1536):
    """forward, data gradient and weight gradient of a linear over (batch, tokens, in_features)."""
    net = NetBuilder("linear", batch, 4)
    x = net._new((tokens, in_features), "previous")
    net.linear("qkv", x, out_features, bias=False)
    layer = net.layers[-1]
    return {op.name.rsplit(".", 1)[-1]: op for op in (*layer.forward, *layer.backward)}


def _pointwise_s(op, channels: float, reduction: float) -> float:
    conv = A100.efficiency.conv_efficiency["tf32"]
    eff = conv.efficiency(channels, reduction, 1, 1, 1)
    memory_s = op.bytes_moved / (A100.hbm_bandwidth_gb_per_s * 1e9 * A100.efficiency.memory_bound_efficiency)
    return max(op.flops / (TF32_PEAK * eff), memory_s) + LAUNCH_S


def test_each_pass_of_a_tf32_linear_reads_the_convolution_model_by_its_channels_and_reduction():
    """forward: channels = out features, reduction = in features; data gradient: channels = in features,
    reduction = out features; weight gradient: channels = in features, reduction = the rows (as a 1x1
    convolution's passes read them, simulator/cost/conv.py)."""
    model = ComputeModel(A100, "fp32", tf32=True)
    ops = _linear_ops(32)
    rows = 32 * 257
    assert model.time_s(ops["gemm"]) == pytest.approx(_pointwise_s(ops["gemm"], 1536, 512), rel=1e-12)
    assert model.time_s(ops["dgrad"]) == pytest.approx(_pointwise_s(ops["dgrad"], 512, 1536), rel=1e-12)
    assert model.time_s(ops["wgrad"]) == pytest.approx(_pointwise_s(ops["wgrad"], 512, rows), rel=1e-12)


def test_its_rate_does_not_grow_with_the_batch():
    """The size curve raised a linear's rate with its rows (the qkv GEMM 40 -> 62 TFLOP/s from 32 to 128
    images); the shape model's forward and data gradient run at one rate whatever the rows."""
    model = ComputeModel(A100, "fp32", tf32=True)
    small, large = _linear_ops(32), _linear_ops(128)
    for name in ("gemm", "dgrad"):
        assert (model.time_s(large[name]) - LAUNCH_S) == pytest.approx(4 * (model.time_s(small[name]) - LAUNCH_S))
    rate = [ops["gemm"].flops / (model.time_s(ops["gemm"]) - LAUNCH_S) / 1e12 for ops in (small, large)]
    assert rate[0] == pytest.approx(rate[1]) and 40 < rate[0] < 45


def test_a_spec_without_the_rule_and_bf16_linears_keep_the_gemm_curve():
    plain = A100.model_copy(update={"efficiency": A100.efficiency.model_copy(update={"linear_as_pointwise_conv": ()})})
    op = _linear_ops(128)["gemm"]
    curve_eff = kernel_gemm_efficiency(A100, op.m, op.n, op.k, "tf32")
    assert ComputeModel(plain, "fp32", tf32=True).time_s(op) == pytest.approx(op.flops / (TF32_PEAK * curve_eff)
                                                                              + LAUNCH_S)
    bf16 = ComputeModel(A100, "bf16")
    bf16_eff = kernel_gemm_efficiency(A100, op.m, op.n, op.k, "bf16")
    assert bf16.time_s(op) == pytest.approx(max(op.flops / (312e12 * bf16_eff), op.bytes_moved / (1555e9 * 0.8))
                                            + LAUNCH_S)


def test_attention_gemms_stay_on_the_curve():
    model = ComputeModel(A100, "fp32", tf32=True)
    net = NetBuilder("bmm", 8, 4)
    q = net._new((4, 257, 128), "q")
    k = net._new((4, 257, 128), "k")
    net.batched_matmul("scores", q, k, 257, 257, 128, 4, q, k, (4, 257, 257))
    op = net.layers[-1].forward[0]
    assert op.kind == "attention" and op.conv is None
    eff = (kernel_gemm_efficiency(A100, op.m, op.n, op.k, "tf32") * A100.efficiency.in_training_gemm_factor
           * A100.efficiency.attention_efficiency_factor)
    assert model.time_s(op) == pytest.approx(max(op.flops / (TF32_PEAK * eff), op.bytes_moved / (1555e9 * 0.8))
                                             + LAUNCH_S)


def test_naming_a_precision_without_a_convolution_model_is_refused():
    data = A100.efficiency.model_dump()
    data["linear_as_pointwise_conv"] = ["bf16"]
    with pytest.raises(ValidationError, match="linear_as_pointwise_conv names \\['bf16'\\]"):
        ComputeEfficiency.model_validate(data)


def test_the_output_says_which_rule_priced_the_linears_and_that_each_is_assumed():
    """Llama-3-8B's linears (4,096 wide and more) all lie outside the shapes the rule was chosen on: the size
    curve prices them; ViT-B/16's 768 x 768 projection lies inside, its 2,304- and 3,072-wide ones outside."""
    def linear_entries(scenario: dict) -> dict[str, str]:
        return {k: v for k, v in efficiency_provenance(load_scenario(scenario)).items() if k.startswith("linear_")}

    llm = {"model": "llama3-8b", "cluster": {"node": "dgx-a100-80g", "num_gpus": 8},
           "training": {"precision": "fp32", "tf32": True}}
    assert linear_entries(llm) == {"linear_tf32_gemm_curve": ASSUMED}
    vit = {**llm, "model": "vit-b-16"}
    assert linear_entries(vit) == {"linear_tf32": ASSUMED, "linear_tf32_gemm_curve": ASSUMED}
    llm["training"] = {"precision": "bf16"}
    assert linear_entries(llm) == {}


def _priced_as_pointwise(ops, model: ComputeModel) -> list[bool]:
    """Per pass, whether ``model`` prices it as the 1x1 convolution pass (not the size curve); where it says so,
    the time is that pass's."""
    out = [model.prices_linear_as_pointwise(op) for op in ops.values()]
    for op, pointwise in zip(ops.values(), out, strict=True):
        assert not pointwise or model.time_s(op) == model._conv_time(as_pointwise_pass(op))
    return out


@pytest.mark.parametrize(("batch", "tokens", "in_features", "out_features", "inside"), [
    (1, 32, 512, 1536, True),      # the fewest rows and the widest output of the evidence
    (1, 16, 512, 1536, False),     # fewer rows than any
    (32, 257, 512, 1536, True),
    (32, 257, 512, 1600, False),   # wider than DeepPool's ViT qkv (1,536)
    (32, 257, 4608, 512, True),    # VGG's 3x3 x 512 reduction
    (32, 257, 4672, 512, False),   # a longer reduction than any fitted convolution
    (2, 2048, 4096, 4096, False),  # Llama-3-8B's attention projection
])
def test_the_rule_applies_only_within_the_shapes_it_was_chosen_on(batch, tokens, in_features, out_features, inside):
    """Inside the spec's linear_as_pointwise_conv_range every pass of the linear is the 1x1 convolution pass;
    outside, every pass is on the TF32 size curve, as on a spec without the rule."""
    model = ComputeModel(A100, "fp32", tf32=True)
    plain = ComputeModel(A100.model_copy(update={"efficiency": A100.efficiency.model_copy(
        update={"linear_as_pointwise_conv": (), "linear_as_pointwise_conv_range": {}})}), "fp32", tf32=True)
    ops = _linear_ops(batch, tokens, in_features, out_features)
    assert _priced_as_pointwise(ops, model) == [inside] * 3
    if not inside:
        assert [model.time_s(op) for op in ops.values()] == [plain.time_s(op) for op in ops.values()]


def test_without_a_range_the_rule_applies_at_every_shape():
    unbounded = ComputeModel(A100.model_copy(update={"efficiency": A100.efficiency.model_copy(
        update={"linear_as_pointwise_conv_range": {}})}), "fp32", tf32=True)
    assert _priced_as_pointwise(_linear_ops(2, 2048, 4096, 4096), unbounded) == [True] * 3


@pytest.mark.slow
@pytest.mark.parametrize("part", ["a100-sxm-40g", "a100-sxm-80g", "a100-pcie-40g", "a100-pcie-80g"])
def test_each_a100_range_is_the_span_of_the_rows_the_rule_was_chosen_on(part):
    """The bounds are the least and greatest forward M, N, K of the conv_efficiency.tf32 fit rows and of DeepPool's
    ViT linears (validation/deeppool_vit.py pointwise_rule_range), not numbers picked by hand."""
    from validation.deeppool_vit import pointwise_rule_range

    bounds = ACCELERATORS.get(part).efficiency.linear_as_pointwise_conv_range["tf32"]
    assert bounds.model_dump(include=set(pointwise_rule_range())) == pointwise_rule_range()


def test_a_range_for_a_precision_the_rule_does_not_name_or_with_min_above_max_is_refused():
    data = A100.efficiency.model_dump()
    data["linear_as_pointwise_conv_range"] = {"bf16": data["linear_as_pointwise_conv_range"]["tf32"]}
    with pytest.raises(ValidationError, match="linear_as_pointwise_conv_range names \\['bf16'\\]"):
        ComputeEfficiency.model_validate(data)
    data = A100.efficiency.model_dump()
    data["linear_as_pointwise_conv_range"]["tf32"]["n_min"] = 4096
    with pytest.raises(ValidationError, match="n_min is above n_max"):
        ComputeEfficiency.model_validate(data)


def test_the_rows_of_a_linear_over_tokens_are_the_batch_times_the_tokens():
    """The builder's linear over a 3-D input folds the leading dimensions into the GEMM's rows (the pixels
    of the 1x1 convolution it is priced as)."""
    ops = _linear_ops(2, tokens=7, in_features=16, out_features=24)
    assert (ops["gemm"].m, ops["gemm"].n, ops["gemm"].k) == (14, 24, 16)
    assert (ops["wgrad"].m, ops["wgrad"].n, ops["wgrad"].k) == (16, 24, 14)
