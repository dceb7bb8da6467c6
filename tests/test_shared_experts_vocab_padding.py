"""Two details of the transformer layer as Megatron runs it (workloads/graph.py), counted by hand:

- shared experts are one tensor-parallel MLP (megatron-core ``transformer/moe/shared_experts.py``:
  ``SharedExpertMLP(MLP)`` on the tp group): per rank every token of the micro-batch through 1/tp of
  their width, with or without sequence parallelism (before, without SP each rank ran its tokens through
  the whole width: tp x the FLOPs);
- the vocabulary is padded to a multiple of ``make_vocab_size_divisible_by`` x tp (Megatron-LM
  ``_vocab_size_with_padding``; megatron-bridge ``calculate_padded_vocab_size``): the padded rows are
  held and computed, the model's own count is reported beside them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.report.result import unwrap_table
from validation import closed_forms
from workloads import counting
from workloads.graph import ShardShape, embedding_work, head_work, layer_work
from workloads.schema import MoESpec, TransformerSpec

ROOT = Path(__file__).resolve().parents[1]

H, S, B, EXPERT_FFN, SHARED = 64, 16, 2, 32, 2
TOKENS = B * S                  # 32 tokens per micro-batch
SHARED_WIDTH = SHARED * EXPERT_FFN   # 64: the two shared experts as one MLP
MOE = TransformerSpec(name="tiny-moe", num_layers=2, hidden_size=H, num_attention_heads=4, ffn_hidden_size=128,
                      gated_mlp=True, vocab_size=256, seq_length=S, norm="rmsnorm", linear_bias=False,
                      position_embedding="rope", dropout=False,
                      moe=MoESpec(num_experts=4, top_k=2, num_shared_experts=SHARED, expert_ffn_hidden_size=EXPERT_FFN))


def _shared_ops(tp: int, sp: bool):
    work = layer_work(MOE, ShardShape(micro_batch=B, seq_length=S, tp=tp, sequence_parallel=sp), 0)
    return work, [op for op in work.forward if op.name.startswith("shared_")]


@pytest.mark.parametrize(("tp", "sp"), [(1, False), (2, False), (2, True), (4, False), (4, True)])
def test_shared_experts_are_a_tensor_parallel_mlp(tp, sp):
    work, ops = _shared_ops(tp, sp)
    by = {op.name: op for op in ops}
    w = SHARED_WIDTH // tp                                  # 64, 32, 16 columns of the rank
    fc1, fc2, act = by["shared_fc1"], by["shared_fc2"], by["shared_act"]
    # FC1 (gate and up, SwiGLU): 32 tokens x 64 -> 2w; FC2: 32 x w -> 64; every token, 1/tp of the width
    assert (fc1.m, fc1.n, fc1.k) == (TOKENS, 2 * w, H)
    assert (fc2.m, fc2.n, fc2.k) == (TOKENS, H, w)
    assert fc1.flops == 2 * 32 * (2 * w) * 64 and fc2.flops == 2 * 32 * 64 * w
    assert fc1.flops + fc2.flops == 786_432 / tp           # 6·T·h·64 at tp 1, ÷tp: no tp x over-count
    # parameters on the rank: 3 matrices of 64 x 64 ÷tp, no biases
    assert fc1.params + fc2.params == 12_288 / tp
    # SwiGLU reads 2 x T x w and writes T x w, 2 bytes each
    assert act.bytes_moved == 32 * w * 3 * 2
    # backward: dgrad + wgrad of each, twice the forward's FLOPs
    bwd = sum(op.flops for op in work.backward if op.name.startswith("shared_fc"))
    assert bwd == 2 * 786_432 / tp
    # Megatron's f/g around the MLP: the b·s·h activation is 32 x 64 x 2 B = 4096 B
    comms = [(op.name, op.collective, op.comm_bytes) for op in ops if op.kind == "collective"]
    if tp == 1:
        assert comms == [] and fc1.input_grad_collective is None
    elif sp:
        assert comms == [("shared_in.all_gather", "all_gather", 4096.0),
                         ("shared_out.reduce_scatter", "reduce_scatter", 4096.0)]
        assert (fc1.input_grad_collective, fc1.input_grad_bytes) == ("reduce_scatter", 4096.0)
    else:
        assert comms == [("shared_out.all_reduce", "all_reduce", 4096.0)]
        assert (fc1.input_grad_collective, fc1.input_grad_bytes) == ("all_reduce", 4096.0)


def test_shared_experts_summed_over_ranks_are_the_tp1_work():
    one = sum(op.flops for op in _shared_ops(1, False)[1])
    for tp in (2, 4):
        for sp in (False, True):
            assert tp * sum(op.flops for op in _shared_ops(tp, sp)[1]) == one


def test_shared_expert_params_follow_the_megatron_split():
    """The block's parameters per rank equal the Megatron split (validation/closed_forms.py), whole
    model counts unchanged: 3·64·64 shared-expert weights per MoE layer."""
    for tp in (1, 2, 4):
        graph = MOE.layer_graph(ShardShape(micro_batch=1, seq_length=S, tp=tp))
        assert graph.layers[1].params == closed_forms.params_per_rank(MOE, tp).block[True][0]
    assert counting.layer_params(MOE, True) == closed_forms.layer_params(MOE, True).total
    assert closed_forms.layer_params(MOE, True).mlp_dense == 3 * 64 * 64


# --- the vocabulary padding -----------------------------------------------------------------------

GPT2 = TransformerSpec(name="gpt2-small", num_layers=2, hidden_size=768, num_attention_heads=12, vocab_size=50257,
                       seq_length=64)


@pytest.mark.parametrize(("tp", "padded"), [(1, 50304), (2, 50432), (4, 50688), (8, 51200)])
def test_gpt2_vocabulary_padded_as_megatron_pads_it(tp, padded):
    # ceil(50257 / (128·tp))·128·tp: 393·128, 197·256, 99·512, 50·1024
    assert GPT2.padded_vocab_size(tp) == padded
    shard = ShardShape(micro_batch=1, seq_length=64, tp=tp)
    head = {op.name: op for op in head_work(GPT2, shard).forward}
    assert head["lm_head"].n == padded // tp
    assert head["lm_head"].flops == 2 * 64 * (padded // tp) * 768
    lookup = embedding_work(GPT2, shard).forward[0]
    assert lookup.tables[0] == (padded // tp, 768)


def test_divisor_one_pads_only_to_tp_and_catalog_sizes():
    assert GPT2.model_copy(update={"make_vocab_size_divisible_by": 1}).padded_vocab_size(8) == 50264
    llama2 = GPT2.model_copy(update={"vocab_size": 32000})
    assert [llama2.padded_vocab_size(t) for t in (1, 2, 4, 8)] == [32000, 32000, 32256, 32768]
    llama3 = GPT2.model_copy(update={"vocab_size": 128256})
    assert [llama3.padded_vocab_size(t) for t in (1, 2, 4, 8)] == [128256, 128256, 128512, 129024]


def test_parameter_counts_own_and_padded():
    own = counting.total_params(GPT2)
    # the word table and the untied head each gain the padded rows x 768
    for tp, padded in ((1, 50304), (8, 51200)):
        assert counting.padded_total_params(GPT2, tp) - own == 2 * (padded - 50257) * 768
    assert own == closed_forms.total_params(GPT2)
    tied = GPT2.model_copy(update={"tied_embeddings": True})
    assert counting.padded_total_params(tied, 8) - counting.total_params(tied) == (51200 - 50257) * 768
    # per rank at tp 8: 6400 rows of the table and of the head
    graph = GPT2.layer_graph(ShardShape(micro_batch=1, seq_length=64, tp=8))
    rank = closed_forms.params_per_rank(GPT2, 8)
    assert graph.layers[0].params == rank.embedding == 6400 * 768 + 64 * 768
    assert graph.layers[-1].params == rank.head == 6400 * 768 + 2 * 768


def test_model_flops_count_the_padded_vocabulary():
    base = counting.step_flops(GPT2, 64, 1, "none", tp=1).model_flops
    wide = counting.step_flops(GPT2, 64, 1, "none", tp=8).model_flops
    assert wide - base == 3 * 2 * 64 * (51200 - 50304) * 768   # 3 x the head's forward over the extra rows
    assert base == 3 * closed_forms.forward_flops_per_sequence(GPT2, 64, tp=1)


def test_simulate_reports_both_counts_where_they_differ(tmp_path):
    scenario = {"name": "gpt2-pad", "model": {"name": "gpt2-small", "num_layers": 2, "hidden_size": 768,
                                               "num_attention_heads": 12, "vocab_size": 50257, "seq_length": 256},
                "cluster": {"node": "dgx-a100-80g", "num_gpus": 4},
                "parallelism": {"tp": 4, "micro_batch_size": 1, "global_batch_size": 1}}
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(scenario))
    run = subprocess.run([sys.executable, "-m", "simulator", "simulate", "--json", str(path)], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    out = json.loads(run.stdout)
    own = out["num_parameters"]
    assert out["num_parameters_padded"] - own == 2 * (50688 - 50257) * 768
    text = subprocess.run([sys.executable, "-m", "simulator", "simulate", str(path)], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout
    assert "vocabulary padded to a multiple of make_vocab_size_divisible_by x tp" in "\n".join(unwrap_table(text))
    scenario["model"]["vocab_size"] = 51200            # a multiple of 128 x 4: nothing padded
    path.write_text(json.dumps(scenario))
    run = subprocess.run([sys.executable, "-m", "simulator", "simulate", "--json", str(path)], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    assert "num_parameters_padded" not in json.loads(run.stdout)


def test_bad_divisor_is_one_line_exit_2(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(json.dumps({"model": {"name": "x", "num_layers": 1, "hidden_size": 64, "num_attention_heads": 4,
                                          "vocab_size": 100, "seq_length": 16, "make_vocab_size_divisible_by": 0},
                                "cluster": {"node": "dgx-a100-80g", "num_gpus": 1}}))
    run = subprocess.run([sys.executable, "-m", "simulator", "simulate", str(path)], cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 2
    assert "model.make_vocab_size_divisible_by" in run.stderr and "Traceback" not in run.stderr
