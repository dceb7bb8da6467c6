"""ZeRO's parameter all-gather of routed-expert weights runs over the expert-data-parallel group.

Megatron-Core's distributed optimizer keeps the experts' parameters in their own buffers whose data-parallel
group is the expert-data-parallel group (``DistributedDataParallel``: ``expert_parallel_buffers`` over
``parallel_state.get_expert_data_parallel_group()``; torchtitan shards experts over its ``efsdp`` mesh): the
optimizer state of an expert is sharded over the dp/ep ranks that hold that expert, so after the step each
of them gathers the other (edp - 1)/edp of those weights -- the ring all-gather's (n - 1)/n * S bytes
(Thakur et al. 2005; NCCL's all-gather) over that group. The gradients already go that way (``edp_grad_*``
tasks); this pins the gather, first found by the session-15 audit (the whole chunk was gathered over dp).

Scenario: 16 H100s on two DGX nodes, dp 16, ep 8, so each expert is held by edp = 2 ranks on different
nodes: half of every rank's expert weights cross its NIC. Lower bound on the gather: those bytes at the
NIC's line rate (400 Gb/s = 50 GB/s), no efficiency, no latency.
"""

from __future__ import annotations

from simulator.scenario import load_scenario
from simulator.simulate import simulate

LAYERS, H, F, E, TOP_K = 2, 4096, 14336, 8, 2


def _scenario(zero_stage: int, overlap: bool = True):
    return load_scenario({
        "name": "moe-gather",
        "model": {"name": "moe-toy", "num_layers": LAYERS, "hidden_size": H, "num_attention_heads": 32,
                  "num_kv_heads": 8, "ffn_hidden_size": F, "gated_mlp": True, "vocab_size": 32000,
                  "seq_length": 1024, "tied_embeddings": False, "position_embedding": "rope", "norm": "rmsnorm",
                  "linear_bias": False, "dropout": False, "moe": {"num_experts": E, "top_k": TOP_K}},
        "cluster": {"node": "dgx-h100", "fabric": "fat-tree", "num_gpus": 16},
        "parallelism": {"tp": 1, "pp": 1, "dp": 16, "ep": 8, "zero_stage": zero_stage, "micro_batch_size": 1,
                        "global_batch_size": 16, "overlap_param_gather": overlap},
        "training": {"seq_length": 1024, "precision": "bf16", "attention": "flash"},
    })


def _gathers(result, stem: str) -> list:
    return [e for e in result.timeline if e.category == "dp_comm" and stem in e.name and e.rank_class == result.timeline[0].rank_class]


def _expert_bytes_per_rank() -> float:
    # E/ep experts of a gated MLP (3 matrices h x f) per layer, BF16 weights
    return LAYERS * (E // 8) * 3 * H * F * 2


NIC_BYTES_PER_S = 400e9 / 8  # DGX H100: one ConnectX-7 NDR (400 Gb/s) per GPU


def test_zero1_expert_weights_are_gathered_over_the_expert_data_parallel_group():
    for overlap in (True, False):
        result = simulate(_scenario(1, overlap=overlap), detail=True)
        gathers = _gathers(result, "param_all_gather")
        assert gathers, [e.name for e in result.timeline if e.category == "dp_comm"]
        seconds = sum(e.end_s - e.start_s for e in gathers)
        edp = 16 // 8
        floor = (edp - 1) / edp * _expert_bytes_per_rank() / NIC_BYTES_PER_S
        assert seconds >= floor, (overlap, seconds, floor)


def test_zero3_expert_weights_are_gathered_over_the_expert_data_parallel_group():
    result = simulate(_scenario(3), detail=True)
    forward = [e for e in _gathers(result, "zero3_gather") if e.name.startswith("F.mb0.")]
    assert forward
    seconds = sum(e.end_s - e.start_s for e in forward)
    floor = (2 - 1) / 2 * _expert_bytes_per_rank() / NIC_BYTES_PER_S
    assert seconds >= floor, (seconds, floor)
