"""The routed experts' permuted input, saved by their FC1 (megatron-core 0.16.1 ``transformer/moe/experts.py``
``TEGroupedMLP.forward``: Transformer Engine's GroupedLinear keeps its input for the weight gradient), counted
by hand on a toy MoE block: top_k copies of each routed token, h wide, per rank."""

from __future__ import annotations

import pytest

from tests.test_recompute_modules import MOE, TOP_K
from workloads.graph import ShardShape
from workloads.transformer_graph import block_saved_tensors

H = MOE.hidden_size


def _permuted(shard: ShardShape, model=MOE) -> float:
    return {x.name: x.nbytes for x in block_saved_tensors(model, shard, True)}["expert_fc1_input"]


def test_top_k_copies_of_each_token_h_wide():
    shard = ShardShape(micro_batch=2, seq_length=128, flash_attention=True)
    assert _permuted(shard) == 2 * (2 * 128) * TOP_K * H


def test_per_rank_share_under_sp_and_etp():
    # tp 2 with sequence parallelism: a rank routes half the tokens; etp 2: its expert shard's tokens are
    # all-gathered over the 2 etp ranks
    sp = ShardShape(micro_batch=2, seq_length=128, tp=2, sequence_parallel=True, flash_attention=True)
    assert _permuted(sp) == 2 * (2 * 128 / 2) * TOP_K * H
    etp = ShardShape(micro_batch=2, seq_length=128, etp=2, ep=2, flash_attention=True)
    assert _permuted(etp) == 2 * (2 * 128) * 2 * TOP_K * H


def test_fp8_keeps_it_quantized_and_capacity_pads_it():
    fp8 = ShardShape(micro_batch=2, seq_length=128, flash_attention=True, fp8_saved_inputs=frozenset({"experts"}))
    assert _permuted(fp8) == 1 * (2 * 128) * TOP_K * H
    padded = MOE.model_copy(update={"moe": MOE.moe.model_copy(update={"capacity_factor": 1.5})})
    shard = ShardShape(micro_batch=2, seq_length=128, flash_attention=True)
    assert _permuted(shard, padded) == pytest.approx(2 * (2 * 128) * TOP_K * 1.5 * H)


def test_dense_blocks_have_none():
    shard = ShardShape(micro_batch=2, seq_length=128, flash_attention=True)
    assert "expert_fc1_input" not in {x.name for x in block_saved_tensors(MOE, shard, False)}
