"""validation/modern/moe_audit.py: where NeMo's MoE rows put their expert groups (Megatron-Core's order) and
the InfiniBand floor of a plain all-to-all, checked without simulating."""

import pytest

from validation.modern.moe_audit import A2A_PER_MOE_LAYER_PASS, audit, expert_placement, moe_cases
from validation.modern.profiles import load_groups, resolved_scenario


@pytest.fixture(scope="module")
def rows():
    return {a.case.row: a for a in audit([35, 43, 52, 69], simulate=False)}


def test_every_moe_row_is_audited():
    assert {c.row for c in moe_cases()} == {35, 42, 43, 47, 48, 52, 53, 58, 59, 64, 65, 69, 70, 71, 72,
                                            41, 46, 51, 57, 63}  # GPT-OSS-120B BF16 (session 9)


def test_expert_groups_fold_as_megatron_core_orders_ranks(rows):
    # Qwen3-30B tp1 pp2 ep8 on 16 GPUs: a stage is one node, its 8 ranks one expert group (NVLink only); the
    # pipeline neighbour is the other node
    p52 = rows[52].placement
    assert (p52.ep, p52.nodes, p52.per_node, p52.link, p52.pipeline_crosses_nodes) == (8, 1, 8, "NVLink", True)
    # tp1 pp1 ep16: one group over both nodes, 8 per node
    p35 = rows[35].placement
    assert (p35.nodes, p35.per_node, p35.link, p35.pipeline_crosses_nodes) == (2, 8, "NVLink+IB", False)
    # Qwen3-235B tp2 pp8 ep32 (etp 1): the expert group folds over a stage's tp x dp ranks, 4 consecutive nodes
    assert (rows[43].placement.nodes, rows[43].placement.per_node) == (4, 8)
    # DeepSeek-V3 tp2 pp8 ep64: 64 consecutive ranks, 8 nodes, not every second rank of 16 nodes
    assert (rows[69].placement.nodes, rows[69].placement.per_node) == (8, 8)


def test_plain_all_to_all_floor_is_the_off_node_share_at_the_nic_line_rate(rows):
    from simulator.cost.topology import build_topology
    from simulator.scenario import load_scenario

    a = rows[35]  # 48 MoE layers x 64 micro-batches on every rank; half of each all-to-all leaves the node
    sc = load_scenario(resolved_scenario(a.case, load_groups("nemo")))
    nic = build_topology(sc.node, sc.fabric, sc.num_gpus).links.inter_bytes_per_s
    assert a.moe_passes == 48 * 64
    assert a.payload_mb == pytest.approx(4096 * 8 * 2048 * 2 / 1e6)  # tokens x top-k x hidden x bf16
    assert a.a2a_ib_floor_s == pytest.approx(48 * 64 * A2A_PER_MOE_LAYER_PASS * a.payload_mb * 1e6 * 0.5 / nic)
    assert rows[52].a2a_ib_floor_s == 0.0  # in-node expert group: nothing crosses InfiniBand


def test_residual_is_measured_minus_simulated_per_moe_layer_pass(rows):
    a = rows[52]
    assert a.measured_s == pytest.approx(1024 * 4096 / (9058 * 16))
    assert a.residual_ms(a.measured_s) == 0.0
    assert a.residual_ms(a.measured_s - 1.0) == pytest.approx(1e3 / a.moe_passes)
    assert a.residual_ms(None) is None


def test_placement_reads_the_scenario_not_the_row():
    raw = resolved_scenario(next(c for c in moe_cases() if c.row == 52), {})
    raw["parallelism"] = {**raw["parallelism"], "pp": 1, "virtual_stages": 1, "schedule": "1f1b", "ep": 16}
    p = expert_placement(raw)
    assert (p.ep, p.nodes, p.per_node, p.pipeline_crosses_nodes) == (16, 2, 8, False)
