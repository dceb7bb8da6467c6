"""The search's every-stage-at-once memory model (simulator/memory/vectorised.py) against the
analytic model it stands for (simulator/memory/analytic.py ``rank_memory``, stage by stage): every
field of every stage equal within 1e-12 relative, the same peak stage and the same ``fits``, over
random layouts (hypothesis) of dense, MoE (expert and expert-tensor parallel), MLA, tied-embedding,
CNN and mixed-cluster scenarios, every schedule, ZeRO stage and recompute mode."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from simulator.errors import ConfigError
from simulator.memory.analytic import fits, peak_rank_memory, rank_memory
from simulator.memory.vectorised import peak_memory, stage_memories
from simulator.scenario import load_scenario

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

# (scenario file or None, overrides): each drawn with a random layout on top
CASES = [
    (None, []),  # GPT-3 175B on 1,024 A100s
    (None, ["model=mpt-350m", "cluster.num_gpus=16", "parallelism.global_batch_size=64"]),  # tied embeddings
    (None, ["model=llama3-8b", "cluster.node=dgx-h100", "cluster.num_gpus=64", "training.seq_length=4096",
            "parallelism.global_batch_size=256", "training.precision=bf16"]),
    (None, ["model=mixtral-8x7b", "cluster.node=dgx-h100", "cluster.num_gpus=64", "training.seq_length=4096",
            "training.attention=flash", "parallelism.global_batch_size=512", "training.precision=bf16"]),
    (EXAMPLES / "deepseek-v3-h800.yaml", []),
    (EXAMPLES / "qwen3-235b-etp-h100.yaml", []),
    (EXAMPLES / "llama3-8b-torchtitan-sac-h100.yaml", []),
    (EXAMPLES / "mixed-a100-t4.yaml", []),
    (EXAMPLES / "resnet50-8xa100.yaml", []),
    (EXAMPLES / "resnet50-8xa100.yaml", ["model=vgg16"]),  # sqrt(n) checkpoint segments (full recompute)
    (EXAMPLES / "resnet50-8xa100.yaml", ["model=unet"]),   # segments read skips from earlier ones
]
RECOMPUTE = ["none", "selective", "full", "selective_op"]


@st.composite
def scenarios(draw):
    source, overrides = draw(st.sampled_from(CASES))
    layout = {
        "tp": draw(st.sampled_from([1, 2, 4, 8])),
        "pp": draw(st.sampled_from([1, 2, 3, 4, 8, 16, 32])),
        "dp": "auto",
        "cp": draw(st.sampled_from([1, 1, 1, 2])),
        "virtual_stages": draw(st.sampled_from([1, 2, 3])),
        "micro_batch_size": draw(st.sampled_from([1, 2, 4])),
        "zero_stage": draw(st.integers(0, 3)),
        "recompute": draw(st.sampled_from(RECOMPUTE)),
        "sequence_parallel": draw(st.booleans()),
        "schedule": draw(st.sampled_from(["gpipe", "1f1b", "zb-h1"])),
    }
    if layout["virtual_stages"] > 1:
        layout["schedule"] = "interleaved"
    if layout["tp"] == 1:
        layout["sequence_parallel"] = False
    extra = []
    if draw(st.booleans()):
        layout["ep"] = draw(st.sampled_from([1, 2, 4, 8]))
    if draw(st.integers(0, 5)) == 0:
        extra.append("training.param_dtype=fp32")
    if draw(st.integers(0, 5)) == 0:
        extra.append(f"training.grad_dtype={draw(st.sampled_from(['fp32', 'bf16']))}")
    if draw(st.integers(0, 5)) == 0 and layout["pp"] > 1 and layout["virtual_stages"] == 1:
        layout["first_stage_layers"] = draw(st.integers(0, 3))
    if draw(st.integers(0, 5)) == 0:
        layout["zero_shard_size"] = draw(st.sampled_from([2, 4]))
    if draw(st.integers(0, 5)) == 0:
        extra.append("training.optimizer_fusion=backward")
    sets = [f"parallelism.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in layout.items()]
    try:
        scenario = load_scenario(str(source) if source else None, overrides + extra + sets)
        rank_memory(scenario, 0)
    except ConfigError:
        assume(False)
    return scenario


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-12 * max(abs(a), abs(b))


@pytest.mark.slow
@settings(max_examples=100, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(scenarios())
def test_every_stage_equals_the_analytic_model(scenario):
    vectorised = stage_memories(scenario)
    assert len(vectorised) == scenario.parallelism.pp
    for stage, got in enumerate(vectorised):
        want = rank_memory(scenario, stage)
        assert got.stage == want.stage == stage
        for field in ("weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes", "other_bytes"):
            assert _close(getattr(got, field), getattr(want, field)), (stage, field, getattr(got, field),
                                                                       getattr(want, field))
    stage, peak, _ = peak_memory(scenario)
    want_stage, want_peak, per_stage = peak_rank_memory(scenario)
    assert _close(peak.total_bytes, want_peak.total_bytes)
    totals = sorted((b.total_bytes for b in per_stage), reverse=True)
    if len(totals) == 1 or totals[0] > totals[1] * (1 + 1e-9):  # a clear peak: the same stage
        assert stage == want_stage
    assert fits(scenario, peak, vectorised) == fits(scenario, want_peak, per_stage)


def test_every_stage_of_the_default_layout_bit_for_bit():
    """GPT-3 175B, tp 8 pp 8 interleaved, full recompute: the same floats, not only close ones."""
    scenario = load_scenario(None, [])
    assert stage_memories(scenario) == [rank_memory(scenario, s) for s in range(scenario.parallelism.pp)]
