"""DeepEP-style expert dispatch (simulator/cost/moe_dispatch.py): each token crosses a node's
InfiniBand once, then NVLink to its experts there (DeepSeek-V3 arXiv:2412.19437 Sec. 3.2.2)."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

from simulator.cost.collectives import collective_cost
from simulator.cost.moe_dispatch import expected_remote_nodes, node_dedup_all_to_all
from simulator.cost.topology import LinkCapacities, Placement
from simulator.errors import ConfigError
from simulator.scenario import load_scenario
from simulator.strategies.spmd.plan import Planner

sys.path.insert(0, str(Path(__file__).parent))
from test_simulate import toy_raw  # noqa: E402

LINKS = LinkCapacities(intra_bytes_per_s=400e9, inter_bytes_per_s=50e9, uplink_bytes_per_s=50e9,
                       intra_latency_s=1e-6, inter_latency_s=5e-6)


def _placement(nodes: int, per_node: int) -> Placement:
    return Placement(tuple(range(nodes * per_node)), per_node, nodes, 1)


def test_expected_remote_nodes_by_hand():
    assert expected_remote_nodes(1, 8) == 0.0
    assert expected_remote_nodes(2, 1) == pytest.approx(0.5)           # the other node with probability 1/2
    assert expected_remote_nodes(2, 2) == pytest.approx(0.75)          # 1 - (1/2)^2
    assert expected_remote_nodes(16, 8) == pytest.approx(15 * (1 - (15 / 16) ** 8))  # 6.05 of 7.5 copies


def test_dedup_sends_fewer_ib_bytes_than_one_copy_per_expert_and_as_many_with_top_1():
    payload = 8e6
    for nodes, per_node in ((2, 4), (4, 4), (16, 4)):
        plain = collective_cost("all_to_all", payload, _placement(nodes, per_node), LINKS)
        one = node_dedup_all_to_all(payload, 1, _placement(nodes, per_node), LINKS)
        eight = node_dedup_all_to_all(payload, 8, _placement(nodes, per_node), LINKS)
        assert one.bytes_by_link["nic"] == pytest.approx(plain.bytes_by_link["nic"])  # top-1: nothing to merge
        assert eight.bytes_by_link["nic"] < plain.bytes_by_link["nic"]
        assert eight.bytes_by_link["nvl"] == pytest.approx(payload * (per_node - 1) / per_node)
    # 16 nodes, top-8: 6.05 / 8 of the copies cross IB instead of 60 / 64
    cost = node_dedup_all_to_all(payload, 8, _placement(16, 4), LINKS)
    assert cost.bytes_by_link["nic"] == pytest.approx(payload * 15 * (1 - (15 / 16) ** 8) / 8)


def _moe_toy(dispatch: str | None) -> dict:
    raw = toy_raw(16, tp=1, pp=1, dp=16, ep=8, micro_batch_size=1, global_batch_size=16)
    raw = copy.deepcopy(raw)
    raw["model"]["moe"] = {"num_experts": 8, "top_k": 4}
    node = raw["cluster"]["node"]
    node["gpus_per_node"] = 4  # ep 8 spans 2 nodes of 4
    node["nic_bandwidth_gbit_per_s"] = 8.0  # slow IB: the dispatch shows
    node["nics_per_node"] = 4
    if dispatch:
        raw["parallelism"]["moe_dispatch"] = dispatch
    return raw


def test_planner_prices_ep_all_to_all_by_the_dispatch():
    def ep_nic_bytes(dispatch):
        cost, ranks, _ = Planner(load_scenario(_moe_toy(dispatch)))._collective(0, "ep", "all_to_all", 1e6)
        assert len(ranks) == 8
        return cost.bytes_by_link["nic"]

    plain, deepep = ep_nic_bytes(None), ep_nic_bytes("deepep")
    assert plain == ep_nic_bytes("all_to_all") == pytest.approx(1e6 * 4 / 8)
    # 2 nodes, top-4: a token reaches the other node with probability 1 - (1/2)^4 = 15/16, once;
    # the plain all-to-all sends (8 - 4) / 8 of its 4 copies there: 2 per token.
    assert deepep == pytest.approx(1e6 / 4 * 15 / 16)


def test_deepep_is_faster_where_ib_is_the_bottleneck():
    from simulator.simulate import simulate

    assert simulate(load_scenario(_moe_toy("deepep"))).step_time_s < simulate(load_scenario(_moe_toy(None))).step_time_s


def test_unknown_dispatch_is_a_config_error():
    with pytest.raises(ConfigError, match="moe_dispatch"):
        load_scenario(_moe_toy("nccl"))
