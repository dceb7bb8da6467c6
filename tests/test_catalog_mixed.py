"""The catalog of the GPUs that mixed, cloud and consumer clusters run (issue 21): datasheet figures,
the instance-style nodes around them, and the NVLink hybrid cube mesh's per-group ring bandwidth."""

from __future__ import annotations

import pytest

from hardware_specs.catalog import ACCELERATORS, NODES, node_accelerator
from hardware_specs.schema import IntraNodeFabric
from simulator.cost.intra_node import group_slowdown, ring_bandwidth_gb_per_s, ring_count
from simulator.errors import ConfigError

# name: (training precision, dense peak TFLOP/s, memory GiB, memory GB/s, TDP W) from the datasheets
DATASHEET = {
    "t4": ("fp16", 65, 16, 320, 70),
    "a10g": ("bf16", 70, 24, 600, 300),
    "l4": ("bf16", 121, 24, 300, 72),
    "a40": ("bf16", 149.7, 48, 696, 300),
    "rtx-3090": ("bf16", 71, 24, 936, 350),
    "rtx-4090": ("bf16", 165.2, 24, 1008, 450),
    "gtx-1080ti": ("fp32", 11.3, 11, 484, 250),
    "rtx-2080ti": ("fp16", 53.8, 11, 616, 250),
    "v100-pcie-16g": ("fp16", 112, 16, 900, 250),
    "v100-sxm2-16g": ("fp16", 125, 16, 900, 300),
}

# name: (accelerator, GPUs, intra kind, NICs, Gb/s per NIC)
NODES_EXPECTED = {
    "p3-2xlarge": ("v100-sxm2-16g", 1, "pcie", 1, 10),
    "p3-8xlarge": ("v100-sxm2-16g", 4, "nvlink", 1, 10),
    "p3-16xlarge": ("v100-sxm2-16g", 8, "nvlink", 1, 25),
    "g4dn-12xlarge": ("t4", 4, "pcie", 1, 50),
    "g5-12xlarge": ("a10g", 4, "pcie", 1, 40),
    "g6-12xlarge": ("l4", 4, "pcie", 1, 40),
    "a40-pcie-8": ("a40", 8, "pcie", 1, 100),
    "rtx3090-workstation": ("rtx-3090", 4, "pcie", 1, 10),
    "rtx3090-nvlink-workstation": ("rtx-3090", 4, "nvlink", 1, 10),
    "rtx4090-workstation": ("rtx-4090", 4, "pcie", 1, 10),
    "gtx1080ti-server-8": ("gtx-1080ti", 8, "pcie", 1, 100),
    "rtx2080ti-server-8": ("rtx-2080ti", 8, "pcie", 1, 100),
}


@pytest.mark.parametrize("name", sorted(DATASHEET))
def test_datasheet_figures(name):
    precision, peak, gib, gb_per_s, tdp = DATASHEET[name]
    acc = ACCELERATORS.get(name)
    assert acc.peak_tflops[precision] == peak
    assert (acc.hbm_gib, acc.hbm_bandwidth_gb_per_s, acc.tdp_watts) == (gib, gb_per_s, tdp)
    # no measurement of these GPUs is in the project: every curve says it is assumed
    assert acc.efficiency.fitted_on is None and "assumed" in acc.efficiency.source


@pytest.mark.parametrize("name", sorted(DATASHEET))
def test_assumed_curve_is_the_a100_shape_at_equal_duration(name):
    """The curve's gflop axis is the A100's scaled by the peak ratio: a GEMM that takes as long on
    both GPUs has the same efficiency (what the files say they assume)."""
    precision, peak, *_ = DATASHEET[name]
    a100 = ACCELERATORS.get("a100-sxm-80g").efficiency.gemm_curve
    curve = ACCELERATORS.get(name).efficiency.gemm_curve
    assert [p.efficiency for p in curve] == [p.efficiency for p in a100]
    for mine, ref in zip(curve, a100, strict=True):
        assert mine.gflop == pytest.approx(ref.gflop * peak / 312, rel=2e-3)


@pytest.mark.parametrize("name", sorted(NODES_EXPECTED))
def test_instance_nodes(name):
    accelerator, gpus, kind, nics, gbit = NODES_EXPECTED[name]
    node = NODES.get(name)
    assert node_accelerator(node).name == accelerator
    assert (node.gpus_per_node, node.intra_node.kind, node.nics_per_node, node.nic_bandwidth_gbit_per_s) == (
        gpus, kind, nics, gbit)
    assert not node.intra_node.supports_nvls


def test_hybrid_cube_mesh_is_six_links_per_gpu_and_not_every_pair():
    fabric = NODES.get("p3-16xlarge").intra_node
    links = fabric.link_counts
    assert all(sum(row) == 6 for row in links)                       # 6 NVLink2 ports per V100
    assert all(sum(1 for c in row if c) == 4 for row in links)       # to 4 of the 7 others
    assert sum(1 for i in range(8) for j in range(i + 1, 8) if not links[i][j]) == 12  # 3 unlinked per GPU
    assert fabric.bandwidth_per_gpu_gb_per_s == 6 * fabric.link_bandwidth_gb_per_s


@pytest.mark.parametrize(("members", "rings", "gb_per_s"), [
    ((0, 1, 2, 3, 4, 5, 6, 7), 6, 150),   # the whole mesh: 6 edge-disjoint directed rings
    ((0, 1, 2, 3), 4, 100),               # a quad: fully joined, 4 links per GPU inside it
    ((4, 5, 6, 7), 4, 100),
    ((0, 3), 2, 50),                      # a double-linked pair
    ((0, 1), 1, 25),                      # a single-linked pair
    ((0, 5), 0, 10),                      # no direct link: PCIe through the host
    ((0, 2, 4, 6), 2, 50),                # 0-2-6-4-0 (one link each): one ring per direction
])
def test_hybrid_cube_mesh_ring_bandwidth(members, rings, gb_per_s):
    fabric = NODES.get("p3-16xlarge").intra_node
    links = tuple(tuple(r) for r in fabric.link_counts)
    assert ring_count(members, links) == rings
    assert ring_bandwidth_gb_per_s(fabric, members) == gb_per_s
    assert group_slowdown(fabric, members) == pytest.approx(150 / gb_per_s)


def test_p3_8xlarge_quad_and_bridged_pairs():
    quad = NODES.get("p3-8xlarge").intra_node
    assert ring_bandwidth_gb_per_s(quad, (0, 1, 2, 3)) == 100 and group_slowdown(quad, (0, 1, 2, 3)) == 1.0
    bridged = NODES.get("rtx3090-nvlink-workstation").intra_node
    assert ring_bandwidth_gb_per_s(bridged, (0, 1)) == 56.25
    assert ring_bandwidth_gb_per_s(bridged, (1, 2)) == 16          # no bridge: PCIe via host memory
    assert ring_bandwidth_gb_per_s(bridged, (0, 1, 2, 3)) == 16    # a 4-ring must cross PCIe
    switch = NODES.get("dgx-a100-80g").intra_node
    assert group_slowdown(switch, (0, 5)) == 1.0


BASE = dict(kind="nvlink", bandwidth_per_gpu_gb_per_s=50, latency_us=3, collective_efficiency=0.8, source="test")


@pytest.mark.parametrize(("extra", "message"), [
    (dict(link_counts=[[0, 1], [1, 0]]), "needs link_bandwidth"),
    (dict(link_bandwidth_gb_per_s=25), "need link_counts"),
    (dict(link_counts=[[0, 1], [2, 0]], link_bandwidth_gb_per_s=25, unlinked_pair_bandwidth_gb_per_s=10), "symmetric"),
    (dict(link_counts=[[1, 1], [1, 0]], link_bandwidth_gb_per_s=25, unlinked_pair_bandwidth_gb_per_s=10), "diagonal"),
    (dict(link_counts=[[0, 1, 0], [1, 0]], link_bandwidth_gb_per_s=25, unlinked_pair_bandwidth_gb_per_s=10), "square"),
])
def test_bad_link_counts_rejected(extra, message):
    with pytest.raises(ValueError, match=message):
        IntraNodeFabric(**BASE, **extra)


def test_link_counts_must_match_the_node_size():
    data = NODES.get("p3-8xlarge").model_dump()
    data["gpus_per_node"] = 8
    with pytest.raises(ConfigError) as exc:
        NODES.get(data, "cluster.node")
    assert "link_counts" in str(exc.value)


# --- the planner prices groups on the partial mesh ----------------------------------------

TINY_V100 = {
    "model": {"name": "tiny", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "num_kv_heads": 4,
              "vocab_size": 1024, "seq_length": 256},
    "cluster": {"node": "p3-16xlarge", "num_gpus": 8},
    "training": {"precision": "fp16"},
    "parallelism": {"tp": 2, "pp": 1, "micro_batch_size": 1, "global_batch_size": 8},
}


def test_planner_prices_a_tensor_parallel_pair_on_its_one_link():
    """tp=2 on p3.16xlarge pairs GPUs 0-1 (one NVLink: 25 of the port's 150 GB/s): the pair's
    all-reduce moves 6x the bytes through the port; the 4 dp groups of 4 (0,2,4,6) hold 2 rings."""
    from simulator.scenario import load_scenario
    from simulator.strategies.spmd.plan import Planner
    mesh = Planner(load_scenario(TINY_V100))
    switch_node = NODES.get("p3-16xlarge").model_dump()
    switch_node["intra_node"].update(link_counts=None, link_bandwidth_gb_per_s=None,
                                     unlinked_pair_bandwidth_gb_per_s=None)
    switch = Planner(load_scenario({**TINY_V100, "cluster": {"node": switch_node, "num_gpus": 8}}))
    tp_mesh, _, _ = mesh._collective(0, "tp", "all_reduce", 1e8)
    tp_switch, _, _ = switch._collective(0, "tp", "all_reduce", 1e8)
    assert tp_mesh.bytes_by_link["nvl"] == pytest.approx(6 * tp_switch.bytes_by_link["nvl"])
    dp_mesh, ranks, _ = mesh._collective(0, "dp", "all_reduce", 1e8)
    dp_switch, _, _ = switch._collective(0, "dp", "all_reduce", 1e8)
    assert ranks == (0, 2, 4, 6)
    assert dp_mesh.bytes_by_link["nvl"] == pytest.approx(3 * dp_switch.bytes_by_link["nvl"])


def test_pipeline_sends_on_the_mesh_use_the_pair_links():
    """pp=2 over p3.16xlarge (stages 0-3 and 4-7): rank r sends to r+4, over 2 NVLinks for 0-4 and
    1-5, one for 2-6 and 3-7 (the port is 6 links): 3x and 6x the bytes through the port."""
    from simulator.scenario import load_scenario
    from simulator.strategies.spmd.plan import Planner
    raw = {**TINY_V100, "parallelism": {"tp": 1, "pp": 2, "micro_batch_size": 1, "global_batch_size": 8},
           "simulation": {"mode": "full"}}
    planner = Planner(load_scenario(raw))
    for src, links in ((0, 2), (1, 2), (2, 1), (3, 1)):
        task = planner.send_task(f"rank{src}", src + 4, "probe", 1e6)
        assert task.demands[f"rank{src}:nvl_tx"] == pytest.approx(1e6 * 6 / links)
