"""The layer graph's checks: cycles, unknown inputs and kinds, shapes that do not chain."""

from __future__ import annotations

import pytest

from simulator.errors import ConfigError
from workloads.graph import Op
from workloads.layer_graph import Layer, LayerGraph


def _chain(*layers: Layer) -> LayerGraph:
    return LayerGraph("toy", layers, micro_batch=2, sample="image")


def test_totals_are_sums_over_the_layers():
    fc = Op("fc", "gemm", flops=2.0 * 2 * 3 * 4, m=2, n=3, k=4, weights=1)   # holds a 4 x 3 weight
    g = _chain(Layer("a", "linear", (fc,), (fc, fc), saved_bytes=16.0, output_shape=(3,)),
               Layer("b", "relu", saved_bytes=8.0, inputs=("a",), input_shape=(3,))).check()
    assert g.total_params() == 12
    assert g.forward_flops() == 48.0 and g.backward_flops() == 96.0
    assert g.saved_bytes() == 24.0
    assert g.is_chain()


@pytest.mark.parametrize("layers, message", [
    ((Layer("a", "linear"), Layer("a", "relu", inputs=("a",))), "model.layers.a: a second layer"),
    ((Layer("a", "linear"), Layer("b", "relu", inputs=("c",))), "model.layers.b: reads 'c', which is not"),
    ((Layer("a", "linear", inputs=("b",)), Layer("b", "relu", inputs=("a",))), "model.layers.a: reads 'b', which comes"),
    ((Layer("a", "linear"), Layer("b", "warp_drive", inputs=("a",))), "unknown layer kind 'warp_drive'"),
    ((Layer("a", "linear", output_shape=(3,)), Layer("b", "relu", inputs=("a",), input_shape=(4,))),
     r"model.layers.b: expects input \[4\] but a gives \[3\]"),
    ((Layer("a", "linear"), Layer("b", "relu")), "model.layers.b: has no inputs"),
])
def test_bad_graphs_name_the_layer(layers, message):
    with pytest.raises(ConfigError, match=message):
        _chain(*layers).check()
