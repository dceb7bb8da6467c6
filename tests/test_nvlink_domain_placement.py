"""Rack-aware placement on NVLink domains larger than a node (GB200/GB300 NVL72): which TP/CP/EP groups
straddle two domains (simulator/cost/topology.py ``group_spans`` / ``straddling`` / ``placement_note``), and
``cluster.gpus_used_per_nvlink_domain`` (simulator/scenario.py), which uses that many GPUs of each domain."""

from __future__ import annotations

import copy

import pytest

from simulator.cost.topology import group_spans, placement_note, straddling
from simulator.errors import ConfigError
from simulator.report.messages import scenario_messages
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.strategies.spmd.layout import Parallelism
from tests.cli_run import refused_line

FIELD = "cluster.gpus_used_per_nvlink_domain"

# NeMo's DeepSeek-V3 row 69 (nemo_perf_summary.csv: 1,024 H100s, tp 2 pp 8 vp 4 ep 64, etp 1) on GB200 NVL72, as
# validation/blackwell_nemo.py runs it
DEEPSEEK_GB200 = {
    "name": "nemo-69", "model": "deepseek-v3",
    "cluster": {"node": "gb200-nvl72", "fabric": "fat-tree", "num_gpus": 1024},
    "parallelism": {"tp": 2, "pp": 8, "dp": "auto", "cp": 1, "ep": 64, "virtual_stages": 4,
                    "schedule": "interleaved", "sequence_parallel": True, "tp_comm_overlap": True, "zero_stage": 1,
                    "recompute": "none", "micro_batch_size": 1, "global_batch_size": 8192,
                    "overlap_grad_reduce": True, "overlap_param_gather": True, "overlap_p2p_comm": True,
                    "overlap_tp_grad_comm": True, "moe_load_imbalance": 1.0, "etp": 1, "moe_dispatch": "deepep"},
    "training": {"seq_length": 4096, "precision": "fp8", "attention": "flash", "grad_dtype": "bf16",
                 "fused_cross_entropy": True, "attention_kernel": "cudnn", "framework": "nemo"},
}

# Llama 3 70B on two GB200 NVL72 racks with TP 16: 9 TP groups of 16 consecutive ranks, the fifth (ranks 64-79)
# across the 72-GPU boundary
TP16 = ["cluster.num_gpus=144", "parallelism.tp=16", "parallelism.pp=1", "parallelism.virtual_stages=1",
        "parallelism.schedule=1f1b", "parallelism.global_batch_size=288"]


def test_straddle_count_hand_built():
    """tp 2, cp 3, dp 4 (ep 2 inside dp), pp 2 = 48 ranks (24 a stage) in domains of 20, counted by hand:
    rank = tp + 2 cp + 6 dp + 24 pp. TP pairs start at even ranks: none crosses 20 or 40. A CP group is
    {b, b+2, b+4}, b = tp + 6 dp + 24 pp: it crosses for b in 16..19 or 36..39 -> b = 18, 19, 36, 37: 4 of 16.
    An EP group is {a, a+6}, a = tp + 2 cp + 12 k + 24 pp (k the dp block): it crosses for a in 14..19 or
    34..39 -> a = 14..17 (k 1, stage 0) and 36..39 (k 0, stage 1): 8 of 24."""
    par = Parallelism(tp=2, cp=3, dp=4, ep=2, pp=2, global_batch_size=8)
    assert not par.experts_folded
    tp, cp, ep = (group_spans(par, k) for k in ("tp", "cp", "ep"))
    assert (len(tp), len(cp), len(ep)) == (24, 16, 24)
    assert (straddling(tp, 20), straddling(cp, 20), straddling(ep, 20)) == (0, 4, 8)
    assert sorted(lo for lo, hi in cp if lo // 20 != hi // 20) == [18, 19, 36, 37]
    assert sorted(lo for lo, hi in ep if lo // 20 != hi // 20) == [14, 15, 16, 17, 36, 37, 38, 39]
    # domains of 24 (one stage each) hold every group
    assert (straddling(tp, 24), straddling(cp, 24), straddling(ep, 24)) == (0, 0, 0)


def test_folded_expert_groups_are_contiguous():
    """etp given: Megatron-Core's folded expert groups, ep consecutive ranks of the stage (tp-ep-dp-pp order)."""
    par = Parallelism(tp=2, dp=64, ep=64, etp=1, pp=2, global_batch_size=128)
    assert par.experts_folded
    assert group_spans(par, "ep") == [(0, 63), (64, 127), (128, 191), (192, 255)]
    assert straddling(group_spans(par, "ep"), 72) == 3  # 64-127 across 72, 128-191 across 144, 192-255 across 216


def test_note_names_the_count_and_the_value():
    sc = load_scenario("examples/llama3-70b-gb200-nvl72.yaml", TP16)
    note = placement_note(sc)
    assert note.startswith("1 of 9 TP-16 groups span more than one NVLink domain (ranks fill each 72-GPU NVLink "
                           "domain of gb200-nvl72 in order)")
    assert note.endswith("cluster.gpus_used_per_nvlink_domain: 64 (16 of each domain's 18 nodes) keeps every one "
                         "inside one domain")
    assert note in scenario_messages(sc)["notes"]
    # inside the value: no placement note, the field's own
    used = load_scenario("examples/llama3-70b-gb200-nvl72.yaml", [*TP16, f"{FIELD}=64"])
    notes = scenario_messages(used)["notes"]
    assert len(notes) == 1 and notes[0].startswith(f"{FIELD} 64: ranks fill 64 of each 72-GPU NVLink domain (16 of its "
                                                   "18 gb200-nvl72 nodes), then the next: 144 GPUs over 3 domains")
    # a group wider than the domain (DeepSeek-V3's EP 128 folded over a stage's 128 ranks): no value keeps it inside
    wide = placement_note(load_scenario(copy.deepcopy(DEEPSEEK_GB200), ["parallelism.ep=128"]))
    assert wide.startswith("8 of 8 EP-128 groups")  # one a stage, 8 stages
    assert wide.endswith("no value of cluster.gpus_used_per_nvlink_domain keeps them all inside one domain (a group "
                         "is wider)")


def test_no_note_inside_one_domain_or_on_one_node_domains():
    assert placement_note(load_scenario("examples/llama3-70b-gb200-nvl72.yaml")) is None  # 64 GPUs, one rack
    # TP 16 across two DGX H100 nodes: a one-node NVLink domain, nothing a placement can change
    h100 = load_scenario("examples/llama3-70b-gb200-nvl72.yaml", [*TP16, "cluster.node=dgx-h100"])
    assert placement_note(h100) is None


def test_deepseek_v3_gb200_groups_inside_one_rack_faster_ep():
    """blackwell15's finding 5: 13 of 16 EP-64 groups straddle two racks when ranks fill 72; with 64 used per
    rack none does, the exposed EP time falls and tokens/s rise (2,728 -> 3,187 per GPU when measured)."""
    filled = load_scenario(copy.deepcopy(DEEPSEEK_GB200))
    assert placement_note(filled).startswith("13 of 16 EP-64 groups span more than one NVLink domain")
    racked = load_scenario(copy.deepcopy(DEEPSEEK_GB200), [f"{FIELD}=64"])
    assert placement_note(racked, *racked.nvlink_domain_use) is None
    assert racked.nvlink_domain_use == (64, 72) and racked.node.domain_gpus == 64
    a, b = simulate(filled).to_dict(), simulate(racked).to_dict()
    assert b["time_breakdown_s"]["ep_comm"] < 0.8 * a["time_breakdown_s"]["ep_comm"]
    assert b["tokens_per_s"] > 1.1 * a["tokens_per_s"]
    assert b["time_breakdown_s"]["compute"] == pytest.approx(a["time_breakdown_s"]["compute"], rel=1e-12)


def test_default_equals_the_whole_domain():
    """The field at the domain's size places ranks as leaving it out does: the same figures."""
    base = ["cluster.num_gpus=144", "parallelism.pp=2", "parallelism.virtual_stages=5",
            "parallelism.global_batch_size=72", "simulation.steps=1"]
    filled = load_scenario("examples/llama3-70b-gb200-nvl72.yaml", base)
    whole = load_scenario("examples/llama3-70b-gb200-nvl72.yaml", [*base, f"{FIELD}=72"])
    a, b = simulate(filled).to_dict(), simulate(whole).to_dict()
    for key in ("step_time_s", "tokens_per_s", "time_breakdown_s", "peak_memory_gib"):
        assert a[key] == b[key], key
    assert scenario_messages(filled)["notes"] == [] and filled.nvlink_domain_use is None
    notes = scenario_messages(whole)["notes"]
    assert len(notes) == 1 and notes[0] == f"{FIELD} 72: ranks fill each 72-GPU NVLink domain whole, in order, as when the field is left out: 144 GPUs over 2 domains"


@pytest.mark.parametrize("value, node, reason", [
    ("66", "gb200-nvl72", "66 is not whole gb200-nvl72 nodes of 4 GPUs (a node's GPUs share one tray and its NICs): "
                          "use a multiple of 4, e.g. 64"),
    ("144", "gb200-nvl72", "144 is more than the 72 GPUs of one gb200-nvl72 NVLink domain"),
    ("8", "dgx-b200", "dgx-b200's NVLink domain is one node of 8 GPUs, so ranks already fill whole domains"),
    ("0", "gb300-nvl72", "greater than 0"),
])
def test_refused_with_the_reason(value, node, reason):
    line = refused_line("simulate", "examples/llama3-70b-gb200-nvl72.yaml", "--set", f"cluster.node={node}",
                        "--set", f"{FIELD}={value}")
    assert line.startswith(f"clustersim: error: {FIELD}: ") and reason in line


def test_refused_on_a_mixed_cluster():
    with pytest.raises(ConfigError) as exc:
        load_scenario({"model": "llama3-8b", "cluster": {"groups": [{"node": "gb200-nvl72", "nodes": 18},
                                                                    {"node": "dgx-b200", "nodes": 2}],
                                                         FIELD.split(".")[1]: 64}})
    assert exc.value.field == FIELD and "not to cluster.groups" in exc.value.reason
