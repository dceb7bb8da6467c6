"""The softmax cross-entropy split over its classes (vocabulary-parallel cross-entropy, Shoeybi et
al. 2019 Sec. 3), in the ``per_layer`` kind's prices: each device takes the logits of its slice of
the vocabulary from a projection split by output features (nothing gathered), and the per-token
maximum, sum of exponentials and target logit (3 fp32) are all-reduced over the class group."""

from __future__ import annotations

import pytest

from simulator.explore.planners.oracle import per_layer_pricer
from simulator.strategies.per_layer.config import Split
from simulator.strategies.per_layer.cost import reshard

GNMT = {"name": "gnmt-vocab", "model": "gnmt-16", "cluster": {"node": "dgx-a100-80g", "num_gpus": 8},
        "parallelism": {"global_batch_size": 64, "micro_batch_size": 8}, "training": {"precision": "bf16"}}


@pytest.fixture(scope="module")
def priced():
    scenario, pricer = per_layer_pricer(GNMT)
    layers = {layer.name: layer for layer in pricer.graph.layers}
    return scenario, pricer, layers["decoder.classifier"], layers["loss"]


@pytest.mark.parametrize(("split", "tokens", "ranks"), [
    (Split(reduction=8), 64 * 50, tuple(range(8))),
    (Split(batch=2, reduction=4), 32 * 50, (0, 1, 2, 3)),
    (Split(batch=4, sequence=2), None, None),  # no class cut: nothing reduced
])
def test_the_loss_all_reduces_three_floats_per_token_over_its_class_group(priced, split, tokens, ranks):
    _, pricer, _, loss = priced
    assert loss.input_shape == (50, 32320)  # GNMT-16's 50 target tokens, its 32,320-word vocabulary
    reduces = [c for c in pricer.halo_collectives(loss, split) if c.kind == "all_reduce"]
    if tokens is None:
        assert reduces == []
        return
    (stats,) = reduces
    assert stats.payload_bytes == 3 * tokens * 4 and stats.ranks == ranks
    assert stats.volume_bytes == pytest.approx(2 * stats.payload_bytes * (len(ranks) - 1) / len(ranks))
    cost = pricer.layer_cost(loss, split)
    assert cost.halo_forward_s == pytest.approx(pricer.collective_s(stats)) and cost.gradient_reduce_s == 0


def test_a_projection_split_by_features_hands_its_logits_to_the_class_split_loss_without_a_reshard(priced):
    """The vocabulary-parallel pair: the projection's output-feature (channels) cut is the loss's
    class (reduction) cut, so no logits move; a batch-split loss after it would gather them."""
    scenario, _, classifier, loss = priced
    assert reshard(scenario, classifier, {"channels": 8}, {"reduction": 8}, consumer=loss).total_s == 0
    assert reshard(scenario, classifier, {"channels": 8}, {"batch": 8}, consumer=loss).total_s > 0
