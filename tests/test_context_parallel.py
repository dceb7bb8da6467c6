"""Context parallelism variants: all-gather K/V (Llama 3) vs ring passes, and causal load
balancing of the FlashAttention work, with exact volumes and shares on toy specs."""

from __future__ import annotations

import pytest

from simulator.cost.collectives import bus_bytes
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from workloads.graph import FLASH_TILE, ShardShape, layer_work
from workloads.schema import TransformerSpec

MODEL = TransformerSpec(name="toy", num_layers=2, hidden_size=1024, num_attention_heads=8, num_kv_heads=2,
                        vocab_size=1000, seq_length=8192)


def _kv_bytes(cp: int, b: int = 1) -> int:
    return 2 * b * (8192 // cp) * 2 * 128 * 2  # K and V: b·(s/cp)·kv_heads·head_dim bf16 elements


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_all_gather_cp_gathers_the_whole_sequence_kv_and_reduce_scatters_its_gradient(cp):
    work = layer_work(MODEL, ShardShape(micro_batch=1, seq_length=8192, cp=cp, cp_comm="all_gather",
                                        flash_attention=True))
    fwd = [op for op in work.forward if op.group == "cp"]
    assert [(op.collective, op.overlaps_next) for op in fwd] == [("all_gather", False)]
    assert fwd[0].comm_bytes == cp * _kv_bytes(cp)  # S = the gathered tensor
    bwd = [op for op in work.backward if op.group == "cp"]
    assert [op.collective for op in bwd] == ["all_gather", "reduce_scatter"]
    attention_grads = [i for i, op in enumerate(work.backward) if op.kind == "attention"]
    regather, scatter = (work.backward.index(op) for op in bwd)
    assert regather < min(attention_grads) and scatter > max(attention_grads)


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_all_gather_and_ring_move_the_same_bus_volume(cp):
    # ring: the local K/V makes cp-1 hops; all-gather: (cp-1)/cp of cp local chunks. Both (cp-1)·kv.
    ring = layer_work(MODEL, ShardShape(micro_batch=1, seq_length=8192, cp=cp))
    gather = layer_work(MODEL, ShardShape(micro_batch=1, seq_length=8192, cp=cp, cp_comm="all_gather"))

    def volume(ops):
        return sum(bus_bytes(op.collective, op.comm_bytes, cp) for op in ops if op.group == "cp")

    assert volume(ring.forward) == volume(gather.forward) == (cp - 1) * _kv_bytes(cp)
    assert volume(ring.backward) == volume(gather.backward) == 2 * (cp - 1) * _kv_bytes(cp)


def test_causal_share_of_flash_attention_work():
    n = 8192 // FLASH_TILE  # 64 tiles along the sequence
    assert ShardShape(micro_batch=1, seq_length=8192).causal_fraction == 0.5 + 0.5 / n
    # balanced cp: every rank runs the same share of its s/cp x s block
    assert ShardShape(micro_batch=1, seq_length=8192, cp=4).causal_fraction == 0.5 + 0.5 / n
    # contiguous chunks: the last of 4 ranks attends to 3 full chunks and half of its own (16 tiles)
    unbalanced = ShardShape(micro_batch=1, seq_length=8192, cp=4, cp_load_balance=False)
    assert unbalanced.causal_fraction == (3 + 0.5 + 0.5 / 16) / 4
    work = layer_work(MODEL, ShardShape(micro_batch=1, seq_length=8192, flash_attention=True))
    flash = [op for op in work.forward + work.backward if op.kind == "attention"]
    assert flash and all(op.executed_fraction == 0.5 + 0.5 / n for op in flash)
    standard = layer_work(MODEL, ShardShape(micro_batch=1, seq_length=8192))
    assert all(op.executed_fraction == 1.0 for op in standard.forward if op.kind == "attention")


def _scenario(**par):
    return load_scenario({
        "model": {"name": "toy", "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 8,
                  "num_kv_heads": 2, "vocab_size": 1000, "seq_length": 32768},
        "cluster": {"node": "dgx-h100", "fabric": "fat-tree", "num_gpus": 8},
        "parallelism": {"cp": 8, "micro_batch_size": 1, "global_batch_size": 2, **par},
        "training": {"attention": "flash"},
    })


def test_load_balancing_speeds_up_causal_context_parallel_attention():
    balanced = simulate(_scenario()).step_time_s
    unbalanced = simulate(_scenario(cp_load_balance=False)).step_time_s
    assert unbalanced > 1.2 * balanced


def test_all_gather_cp_exposes_its_communication_and_ring_hides_it():
    ring = simulate(_scenario())
    gather = simulate(_scenario(cp_comm="all_gather"))
    assert gather.time_breakdown_s["cp_comm"] > ring.time_breakdown_s["cp_comm"]
    assert gather.model_flops_per_step == ring.model_flops_per_step
