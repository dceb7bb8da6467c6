"""Expert tensor parallelism (``parallelism.etp``, Megatron-Core ``expert_tensor_parallel_size``) and
expert groups folded over a stage's tp*cp*dp ranks: the groups, the ops and bytes of a MoE layer,
the parameters and optimizer state per rank, the refusals, and NeMo's Qwen3-235B rows that need it."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cost.topology import RankLayout
from simulator.errors import ConfigError
from simulator.memory.analytic import peak_rank_memory
from simulator.scenario import load_scenario
from simulator.strategies.spmd.layout import Parallelism
from validation.modern.registry import built
from workloads.catalog import resolve_model
from workloads.graph import ShardShape, layer_work


def _layout(**kw) -> RankLayout:
    return RankLayout(Parallelism(**kw))


def test_folded_groups_follow_megatron_order_etp_then_ep_then_edp():
    # one stage of tp 2 x dp 8 = 16 ranks, etp 2 x ep 4 x edp 2; the second stage is offset by 16
    layout = _layout(tp=2, dp=8, pp=2, ep=4, etp=2)
    assert layout.group(0, "etp") == (0, 1)
    assert layout.group(0, "ep") == (0, 2, 4, 6)
    assert layout.group(0, "edp") == (0, 8)
    assert layout.group(21, "etp") == (20, 21) and layout.group(21, "ep") == (17, 19, 21, 23)
    assert layout.group(21, "edp") == (21, 29)
    # ep 32 over tp 2 x dp 16 (NeMo's Qwen3-235B): the whole stage is one expert group
    qwen = _layout(tp=2, dp=16, pp=8, ep=32, etp=1)
    assert qwen.group(33, "ep") == tuple(range(32, 64)) and qwen.group(33, "edp") == (33,)
    assert qwen.group(33, "etp") == (33,)


def test_without_etp_an_ep_inside_dp_keeps_the_layout_before_etp():
    layout = _layout(tp=2, dp=8, ep=4)  # etp unset
    assert not layout.par.experts_folded
    assert layout.group(0, "ep") == (0, 2, 4, 6)      # ep dp-ranks at equal tp coordinate
    assert layout.group(0, "edp") == (0, 8)
    assert layout.group(0, "etp") == (0,)
    assert layout.par.expert_data_parallel_size == 2


def test_an_explicit_etp_1_folds_the_groups_as_megatron_core_does():
    # tp 2 x dp 8, ep 4, etp 1: expert groups of 4 consecutive ranks (one node half), edp 4 -- where the
    # layout without etp puts ep at stride tp (ranks 0, 2, 4, 6)
    layout = _layout(tp=2, dp=8, ep=4, etp=1)
    assert layout.par.experts_folded
    assert layout.group(0, "ep") == (0, 1, 2, 3) and layout.group(0, "edp") == (0, 4, 8, 12)
    assert layout.par.expert_data_parallel_size == 4
    # NeMo's DeepSeek-V3 (tp 2, ep 64 over dp 64 x tp 2): 64 consecutive ranks, 8 nodes instead of 16
    ds = _layout(tp=2, dp=64, pp=8, ep=64, etp=1)
    assert ds.group(0, "ep") == tuple(range(64))
    assert _layout(tp=2, dp=64, pp=8, ep=64).group(0, "ep") == tuple(range(0, 128, 2))


def test_a_moe_layer_splits_each_expert_over_etp_and_gathers_its_tokens():
    model = resolve_model("mixtral-8x7b")  # 8 experts of FFN 14336, top 2, h 4096
    base = dict(micro_batch=1, seq_length=2048, tp=2, sequence_parallel=True, ep=4)
    one, two = (layer_work(model, ShardShape(**base, etp=etp)) for etp in (1, 2))
    by_name = {etp: {op.name: op for op in w.forward} for etp, w in ((1, one), (2, two))}
    fc1_1, fc1_2 = by_name[1]["expert_fc1"], by_name[2]["expert_fc1"]
    assert (fc1_2.m, fc1_2.n, fc1_2.batch) == (2 * fc1_1.m, fc1_1.n // 2, fc1_1.batch)  # 2x tokens, half the FFN
    assert by_name[2]["expert_fc2"].k == 14336 // 2
    routed = 2048 // 2 * 2  # the rank's sequence-parallel share x top 2
    gather = by_name[2]["moe_etp.all_gather"]
    assert (gather.group, gather.comm_bytes) == ("etp", 2 * routed * 4096 * 2)   # the gathered size
    assert by_name[2]["moe_etp.reduce_scatter"].comm_bytes == gather.comm_bytes
    assert "moe_etp.all_gather" not in by_name[1]
    names = [op.name for op in two.backward]
    # backward: the reduce-scatter's gradient is an all-gather before fc2's, the gather's a reduce-scatter after fc1's
    assert names.index("moe_etp.reduce_scatter.grad") < names.index("expert_fc2.dgrad")
    assert names.index("expert_fc1.wgrad") < names.index("moe_etp.all_gather.grad_reduce_scatter")
    flops = {etp: sum(op.flops for op in w.forward + w.backward if op.name.startswith("expert_"))
             for etp, w in ((1, one), (2, two))}
    assert flops[1] == pytest.approx(flops[2])  # the same expert work per rank


def _scenario(**par) -> dict:
    parallelism = {"tp": 2, "pp": 1, "ep": 4, "etp": 2, "sequence_parallel": True, "micro_batch_size": 1,
                   "global_batch_size": 32, "zero_stage": 1, **par}
    return {"name": "etp", "model": "mixtral-8x7b", "cluster": {"node": "dgx-h100", "num_gpus": 16},
            "parallelism": parallelism, "training": {"seq_length": 2048, "precision": "bf16"}}


def test_expert_parameters_and_optimizer_state_per_rank():
    model = resolve_model("mixtral-8x7b")
    experts = model.num_layers * 8 * 3 * 4096 * 14336
    _, one, _ = peak_rank_memory(load_scenario(_scenario(etp=None, ep=8)))  # inside dp 8: 1 expert each, edp 1
    _, two, _ = peak_rank_memory(load_scenario(_scenario(etp=2, ep=4)))  # folded: 2 experts x 1/2 each, edp 2
    assert two.weights_bytes == pytest.approx(one.weights_bytes)  # E/ep/etp experts' weights: the same
    # the distributed optimizer shards the expert state over edp: 1 rank vs 16 / (2 x 4) = 2 ranks
    assert one.optimizer_bytes - two.optimizer_bytes == pytest.approx(12 * experts / 8 / 2, rel=1e-9)


@pytest.mark.parametrize(("par", "field"), [
    ({"etp": 3}, "parallelism.ep"),                               # etp*ep = 12 does not divide 16 ranks
    ({"etp": 2, "sequence_parallel": False}, "parallelism.sequence_parallel"),
    ({"etp": 2, "zero_shard_size": 2}, "parallelism.zero_shard_size"),
])
def test_expert_layouts_that_cannot_run_are_refused(par, field):
    with pytest.raises(ConfigError) as err:
        load_scenario(_scenario(**par))
    assert err.value.field == field


def test_etp_on_a_dense_model_or_an_expert_width_it_does_not_divide_is_refused():
    raw = _scenario()
    raw["model"] = "llama3-8b"
    raw["parallelism"]["ep"] = 1
    with pytest.raises(ConfigError, match="mixture-of-experts"):
        load_scenario(raw)
    odd = _scenario(tp=1, etp=5, ep=2, sequence_parallel=False, global_batch_size=20)
    odd["model"], odd["cluster"]["num_gpus"] = "qwen3-30b-a3b", 10  # 10 ranks = etp 5 x ep 2; 768 is not 5 x n
    with pytest.raises(ConfigError, match="expert FFN width") as err:
        load_scenario(odd)
    assert err.value.field == "parallelism.etp"


def test_cli_refuses_an_impossible_expert_layout_with_exit_2():
    out = subprocess.run([sys.executable, "-m", "simulator", "simulate", "examples/mixtral-8x7b-ep8-h100.yaml",
                          "--set", "parallelism.etp=3"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "parallelism." in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_etp_runs_end_to_end_and_the_engines_agree():
    from simulator.simulate import simulate_point

    full = simulate_point(_scenario(), run_if_oom=True)
    fast = simulate_point(_scenario(), run_if_oom=True, engine="fast")
    assert full["step_time_s"] == pytest.approx(fast["step_time_s"], rel=1e-9)
    assert full["time_breakdown_s"]["ep_comm"] > 0  # the etp gather / scatter count with the expert all-to-alls


def test_nemo_qwen3_235b_rows_are_cases_with_folded_expert_groups():
    cases = {c.row: c for c in built("nemo")[0] if c.scenario["model"] == "qwen3-235b-a22b"}
    assert set(cases) == {43, 48, 53, 59, 65, 72}
    par = cases[43].scenario["parallelism"]
    assert (par["tp"], par["pp"], par["virtual_stages"], par["ep"], par["etp"]) == (2, 8, 4, 32, 1)
    sc = load_scenario(cases[43].scenario)
    assert sc.parallelism.experts_folded and sc.parallelism.expert_data_parallel_size == 1


# --------------------------------------------------------------------------- invariants of the folded groups


@settings(max_examples=60, deadline=None, derandomize=True)
@given(tp=st.sampled_from([1, 2, 4]), cp=st.sampled_from([1, 2]), dp=st.sampled_from([1, 2, 3, 4, 8]),
       pp=st.sampled_from([1, 2]), etp=st.sampled_from([None, 1, 2, 4]), ep=st.sampled_from([1, 2, 4, 8, 16]))
def test_folded_expert_groups_partition_every_stage(tp, cp, dp, pp, etp, ep):
    stage = tp * cp * dp
    if stage % ((etp or 1) * ep):
        return
    layout = _layout(tp=tp, cp=cp, dp=dp, pp=pp, ep=ep, etp=etp)
    etp = layout.par.etp_degree
    edp = layout.par.expert_data_parallel_size
    # inside data parallelism (etp 1, ep | dp) the groups are the layout's before etp: dp sub-groups
    sizes = {"etp": etp, "ep": ep, "edp": edp} if layout.par.experts_folded else {"ep": ep, "edp": dp // ep}
    if layout.par.experts_folded:
        assert etp * ep * edp == stage
    for kind, size in sizes.items():
        for s in range(pp):
            ranks = range(s * stage, (s + 1) * stage)
            groups = {layout.group(r, kind) for r in ranks}
            assert all(len(g) == size and r in ranks and layout.group(r, kind) == g for g in groups for r in g)
            assert sorted(r for g in groups for r in g) == list(ranks)  # disjoint, covering the stage
    if layout.par.experts_folded:  # a rank's etp, ep and edp groups meet in the rank alone
        for r in range(layout.world):
            assert set(layout.group(r, "etp")) & set(layout.group(r, "ep")) & set(layout.group(r, "edp")) == {r}


@pytest.mark.parametrize(("etp", "ep", "pp"), [(2, 4, 1), (2, 2, 2), (1, 4, 2)])
def test_symmetric_mode_equals_every_rank_simulated_with_folded_expert_groups(etp, ep, pp):
    from simulator.simulate import simulate_point

    raw = _scenario(etp=etp, ep=ep, pp=pp, global_batch_size=16)
    raw["training"]["seq_length"] = 1024
    steps = {mode: simulate_point({**raw, "simulation": {"mode": mode}}, run_if_oom=True)["step_time_s"]
             for mode in ("symmetric", "full")}
    assert steps["full"] == pytest.approx(steps["symmetric"], rel=1e-9)
