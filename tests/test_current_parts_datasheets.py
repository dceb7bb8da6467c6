"""Datasheet figures of the current parts that issue 23's unseen H100 / Blackwell check rests on (specs and
microbenchmarks alone), each against its source or the catalog's own reading of a sibling's datasheet
(session 13 audit, hardware_specs/accelerators/*.yaml and nodes/*.yaml say why):

- GB200's fp64 is the same spec table's as its fp32 and HBM (GB200 NVL72: FP32 5,760 / FP64 2,880 TF per rack;
  45 TF per GPU had come from the preliminary 3,240 TF table whose fp32 was 6,480);
- GB200's 186 GB (GB200 NVL72 datasheet) is read in the unit B200's 180 GB is (its nvidia-smi total in GiB),
  so GB200 holds more than B200 as the datasheets say (a 186e9 B reading had put it below);
- AMD prints HBM in GiB of its stacks (MI300X: 192 GB = 8 x 24 GiB, the catalog's 192): MI325X 256, MI355X 288;
- NVLink5 nodes price sends and all-to-alls at the measured NVLink5 p2p copy (collectives_bandwidth.csv row 117),
  one value for one baseboard (DGX B200 had H100's 0.82 with "no B200 row", HGX B200 / p6 the ring's 0.75);
- MI300X's 8-GPU node at its own RCCL all-reduce row (row 110), as MI325X / MI355X already state.
"""

from __future__ import annotations

import pandas as pd
import pytest

from hardware_specs.catalog import ACCELERATORS, NODES

COLLECTIVES = "validation/data/microbench/collectives_bandwidth.csv"


def _busbw(line: int) -> float:
    """busbw of ``line`` of the collectives file (header = line 1), with the part it was measured on."""
    row = pd.read_csv(COLLECTIVES).iloc[line - 2]
    return row["gpu"], float(row["busbw_gb_per_s"])


def test_gb200_fp64_is_half_its_fp32_as_on_b200():
    b200, gb200 = ACCELERATORS.get("b200").peak_tflops, ACCELERATORS.get("gb200").peak_tflops
    assert (gb200["fp32"], gb200["fp64"]) == (5760 / 72, 2880 / 72)
    assert gb200["fp64"] / gb200["fp32"] == pytest.approx(b200["fp64"] / b200["fp32"], abs=0.01)  # 296 / 600 per 8


def test_gb200_holds_more_hbm_than_b200_as_the_datasheets_say():
    b200, gb200 = ACCELERATORS.get("b200"), ACCELERATORS.get("gb200")
    # datasheets: DGX B200 1,440 GB / 8 = 180 GB; GB200 NVL72 13.4 TB / 72 = 186 GB. B200's entry reads its 180
    # as 179 GiB: GB200's 186 in the same unit is 185, not 186e9 B = 173.2 GiB
    assert gb200.hbm_gib - b200.hbm_gib == pytest.approx(186 - 180, abs=0.1)
    assert gb200.hbm_gib == 185.0


@pytest.mark.parametrize(("name", "datasheet_gb"), [("mi300x", 192), ("mi325x", 256), ("mi355x", 288)])
def test_amd_hbm_is_the_datasheet_figure_in_gib(name, datasheet_gb):
    # MI300X: 8 stacks x 24 GiB, torch ~191.7 GiB; MI355X: 8 stacks x 12 dies x 24 Gbit = 288 GiB
    assert ACCELERATORS.get(name).hbm_gib == datasheet_gb


NVLINK5 = ["dgx-b200", "hgx-b200", "p6-b200", "dgx-b300", "gb200-nvl72", "gb300-nvl72"]


@pytest.mark.parametrize("name", NVLINK5)
def test_nvlink5_nodes_price_point_to_point_at_the_measured_copy(name):
    gpu, p2p = _busbw(117)
    assert gpu == "GB200"
    node = NODES.get(name)
    assert node.intra_node.bandwidth_per_gpu_gb_per_s == 900
    assert node.intra_node.collective_efficiency == round(p2p / 900, 2) == 0.83
    assert "row 117" in node.intra_node.source


def test_h100_reads_its_own_copy_the_same_way():
    # the rule the NVLink5 nodes follow: H100's 0.82 is its copy (row 116: 376 of 450 GB/s), within 0.02
    gpu, p2p = _busbw(116)
    assert gpu == "H100 SXM"
    assert NODES.get("dgx-h100").intra_node.collective_efficiency == pytest.approx(p2p / 450, abs=0.02)


@pytest.mark.parametrize("name", ["mi300x-8", "mi325x-8", "mi355x-8"])
def test_infinity_fabric_nodes_at_mi300x_all_reduce_row(name):
    gpu, busbw = _busbw(110)
    assert gpu == "MI300X"
    assert NODES.get(name).intra_node.collective_efficiency == round(busbw / 448, 2) == 0.70


@pytest.mark.parametrize(("name", "nic_gbit"), [("gb200-nvl72", 400), ("gb300-nvl72", 800)])
def test_nvl72_racks_are_18_trays_of_4_in_one_72_gpu_nvlink_domain(name, nic_gbit):
    # GB200 / GB300 NVL72 datasheets: 36 Grace : 72 Blackwell GPUs, 18 compute trays of 4 GPUs behind the NVLink
    # switch trays (1.8 TB/s bidirectional per GPU); 4 ConnectX-7 (GB200) / ConnectX-8 (GB300) NICs per tray
    node = NODES.get(name)
    assert (node.gpus_per_node, node.domain_gpus, node.domain_gpus // node.gpus_per_node) == (4, 72, 18)
    assert node.intra_node.bandwidth_per_gpu_gb_per_s * 2 == 1800
    assert (node.nics_per_node, node.nic_bandwidth_gbit_per_s) == (4, nic_gbit)


@pytest.mark.parametrize(("name", "per_link_bidir_gb_per_s"), [("mi300x-8", 128), ("mi325x-8", 128), ("mi355x-8", 153.6)])
def test_infinity_fabric_is_seven_links_per_gpu(name, per_link_bidir_gb_per_s):
    # AMD datasheets: 896 GB/s (MI300X, MI325X) and 1,075 GB/s (MI355X) aggregate bidirectional over 7 links
    assert NODES.get(name).intra_node.bandwidth_per_gpu_gb_per_s == pytest.approx(7 * per_link_bidir_gb_per_s / 2)
