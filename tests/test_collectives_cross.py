"""Collectives across nodes fitted on the multi-node rows of collectives_bandwidth.csv
(validation/calibrate_collectives_cross.py): AWS p6-b200 (EFA v4, 4 nodes), AWS p5en (EFA v3, 4 nodes,
ring vs NVLS-tree) and GCP A3 Mega (GPUDirect-TCPXO, 2 nodes), held-out half per size and system.

Tolerances (the intra-node ones, tests/test_collectives_calibration.py): median |error| 8%, worst 30%,
15% on rows of 64 MiB or more. Why these: the data's own repeat spread is small -- A3 Mega out-of-place
vs in-place time: median 1.0%, 2.7% at most from 2 KiB up, 16.3% at 1 KiB; p5en NCCL default vs forced
ring 0.06% -- so any miss past them is the model's (two alpha-beta lines per algorithm cannot follow
NCCL's channel and protocol switches between them), not noise in the rows. Above 64 MiB the law is a
bandwidth line, which the data pins down to about 1%, hence the tighter bound there.
"""

from __future__ import annotations

import pytest

from hardware_specs.catalog import NODES
from simulator.cost.provenance import CALIBRATED, DERIVED, efficiency_provenance, provenance_state
from simulator.scenario import load_scenario
from validation import calibrate_collectives as cc
from validation import calibrate_collectives_cross as cx

MEDIAN, WORST, LARGE = cx.CROSS_MEDIAN, cx.CROSS_WORST, cx.CROSS_LARGE


def _kept():
    table = cx.cross_heldout_table()
    return table[table.set_aside == ""]


def test_cross_node_heldout_rows_within_median_and_worst_tolerance():
    table = _kept()
    assert len(table) >= 15
    assert set(table.node) == {"p6-b200", "p5en-h200", "a3-mega-h100"}
    errors = table.error.abs()
    assert errors.median() <= MEDIAN, table.to_string()
    assert errors.max() <= WORST, table.to_string()
    for node, group in table.groupby("node"):  # each swept system on its own, not only pooled (p5en: 2 rows,
        if len(group) >= 5:                      # both in the strict xfail below)
            assert group.error.abs().median() <= MEDIAN, (node, group.to_string())


@pytest.mark.xfail(strict=True, reason="unmet (issue 23, across nodes): held-out rows of >= 64 MiB within 15%: "
                                       "p5en forced NVLSTree 4 GiB +17.4% (310 GB/s measured; NVLS in the node and "
                                       "the tree's 2·S through the NICs at the ring's fitted efficiency give 364: "
                                       "the one NVLSTree row, held out; no fit row prices a tree apart from a ring) "
                                       "and p6-b200 256 MiB +16.1% (229 GB/s: on the alpha-beta line of its sweep's "
                                       "fit rows 65/67 at 64-128 MiB, 227.9, -0.5%; the line of fit rows 71/73 at "
                                       "512 MiB-1 GiB gives 273.8, +19.5%, and is the faster: the AWS ofi tuner "
                                       "held the slower line, 139 GB/s of payload where the fitted low-latency "
                                       "protocol gives 142, to 256 MiB, which a fastest-line choice cannot "
                                       "follow and the fit half, with no row between 128 and 512 MiB, cannot place)")
def test_cross_node_large_messages_within_tolerance():
    table = _kept()
    large = table[table.message_bytes >= 2**26]
    assert len(large) >= 6
    assert large.error.abs().max() <= LARGE, large.to_string()


def test_the_256_mib_p6_row_lies_on_its_smaller_sizes_line_not_the_faster_one():
    """p6-b200's 4-node sweep, row 69 (256 MiB, held out): the alpha-beta line through the fit rows just below
    it (65, 67) meets it within 1%; the line through the fit rows just above it (71, 73) is faster there by
    more than the 15% tolerance, so a choice of the fastest algorithm/protocol (the model's, NCCL's tuner
    model's) misses it by that much whatever its constants, while the rows either side fit."""
    (row,) = [r for r in cx.cross_rows() if r.row == 69]
    lines = cx.sweep_lines(row)
    assert lines["below"][0] == (65, 67) and lines["above"][0] == (71, 73)
    assert abs(lines["below"][1] / row.busbw_gb_per_s - 1) < 0.01
    assert lines["above"][1] / row.busbw_gb_per_s - 1 > LARGE
    (nvls_tree,) = [r for r in cx.cross_rows() if r.row == 108]
    assert nvls_tree.heldout and cx.sweep_lines(nvls_tree) == {}   # the only NVLSTree row: nothing to fit it on


def test_fit_uses_only_fit_rows_and_the_catalog_holds_it():
    heldout = {r.row for r in cx.cross_rows() if r.heldout}
    aside = {r.row for r in cx.cross_rows() if r.set_aside}
    for name in cx.CROSS_NODES:
        f = cx.cross_fit(name)
        assert f.rows and not set(f.rows) & (heldout | aside)
        node = NODES.get(name)
        block = cx.cross_node_block(name)
        assert node.nic_efficiency == block["nic_efficiency"]
        assert node.nic_latency_us == block["nic_latency_us"]
        assert node.nic_low_latency_efficiency == block.get("nic_low_latency_efficiency")
        assert node.nic_low_latency_us == block.get("nic_low_latency_us")
        assert node.nic_fitted_on == block["nic_fitted_on"]
        assert "collectives_bandwidth.csv rows " in node.nic_fitted_on
        assert name in cc.calibrated_nodes()  # its NVLink laws are written too (carried from its sibling)


def test_rows_set_aside_are_counted_and_say_why():
    aside = [r for r in cx.cross_rows() if r.set_aside]
    # the p6-b200 sweep's 32, 64 and 128 KiB rows take 17.8x, 8.9x and 1.6x as long as its 512 KiB row
    assert [(r.node, int(r.message_bytes)) for r in aside] == [("p6-b200", 32768), ("p6-b200", 65536),
                                                               ("p6-b200", 131072)]
    assert all("not monotone in size" in r.set_aside for r in aside)
    # 48 multi-node rows: 47 measured on the three systems, 1 a maintainer's expected value (not used)
    assert len(cx.cross_rows()) == 47


def test_each_system_runs_the_algorithm_nccl_chose():
    table = cx.cross_table(heldout=False)
    mega = table[table.node == "a3-mega-h100"]
    # two nodes: the tree moves S through a node's NICs, the ring 2(n-1)/n·S, so the tree runs and the
    # predicted busbw passes the NICs' 200 GB/s, as measured (338.8 GB/s at 8 GiB)
    assert set(mega[mega.message_bytes >= 2**26].ran) == {"tree"}
    assert mega.predicted_busbw.max() > 200 * 1.5
    p5en = table[table.node == "p5en-h200"].set_index("forced")
    # NCCL_ALGO=allreduce:nvlstree runs NVLSTree (NVLS inside the node, a tree between nodes), not a plain tree
    assert p5en.loc["ring", "ran"] == "ring" and p5en.loc["nvls_tree", "ran"] == "nvls_tree"
    # NCCL's default (AWS's ofi tuner) ran the ring at 4 GiB (the row's note: forcing the ring reproduced it to
    # 0.06%); the model picks it too, now that a ring pays the network latency only on the steps that cross it
    assert p5en.loc["-", "ran"] == "ring"
    assert abs(p5en.loc["-", "error"]) < 0.01


def test_nccl_algo_column_read_per_algorithm():
    forced = {r.row: r.algorithm for r in cx.cross_rows() if r.node == "p5en-h200"}
    assert forced == {106: None, 107: "ring", 108: "nvls_tree"}
    assert cx._algorithm("Tree (NCCL_ALGO=allreduce:tree)") == "tree"


@pytest.mark.parametrize("node, gpus, gpus_per_node", [("p5en-h200", 32, 8), ("p6-b200", 32, 8), ("hgx-h200", 32, 8),
                                                      ("dgx-b200", 32, 8), ("gb200-nvl72", 144, 72)])
def test_simulate_prices_a_cross_node_all_reduce_as_the_calibration_does(node, gpus, gpus_per_node):
    # The planner's data-parallel all-reduce on an H200 / B200 / GB200 cluster runs the algorithm (and costs the
    # time) that validation/calibrate_collectives_cross.py predicts for the same group: one collective_cost, the
    # node's NVLS law passed to both, so NVLSTree is a candidate in both.
    from simulator.strategies.spmd.plan import Planner
    scenario = load_scenario({"model": "gpt-1.7b", "cluster": {"node": node, "num_gpus": gpus},
                              "parallelism": {"global_batch_size": 2 * gpus}})
    planner = Planner(scenario)
    chosen = set()
    for exponent in range(12, 34, 3):
        size = 2.0 ** exponent
        cost, ranks, _ = planner._collective(0, "dp", "all_reduce", size)
        assert len(ranks) == gpus
        row = cx.CrossRow("x", 0, node, "all_reduce", None, gpus // gpus_per_node, gpus_per_node, size, 1.0)
        seconds, algorithm = cx.predicted(NODES.get(node), row)
        assert cost.algorithm == algorithm, (node, size)
        assert cost.isolated_time_s(planner.topo.links_for(ranks)) == pytest.approx(seconds, rel=1e-9)
        chosen.add(algorithm)
    if node == "gb200-nvl72":  # 72 GPUs per NVLink domain, 4 NICs per 4 GPUs: NVLink bounds it, NVLSTree runs
        assert chosen == {"nvls_tree"}


def test_provenance_says_fitted_or_transferred():
    def state(node):
        scenario = load_scenario({"model": "gpt-1.7b", "cluster": {"node": node, "num_gpus": 32}})
        return provenance_state(efficiency_provenance(scenario)["inter_node_collectives"])
    assert state("a3-mega-h100")[0] == CALIBRATED
    assert state("p6-b200")[0] == CALIBRATED
    assert state("p5en-h200")[0] == DERIVED  # efficiency fitted, latency carried from p6-b200
