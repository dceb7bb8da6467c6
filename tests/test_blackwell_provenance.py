"""What each Blackwell prediction rests on (issue 23: "its B200/GB200 predictions must come from specs and
microbenchmarks alone"): every efficiency a Llama step uses on B200 / B300 / GB200 / GB300 nodes, in one table,
calibrated (fitted on rows of that part), derived (from another part by a stated rule: which part) or assumed;
and the Blackwell fits reproduce from the CSV rows (validation/calibrate_microbench.py regenerates the specs'
blocks, compared here field by field)."""

from __future__ import annotations

import pytest

import validation.calibrate_microbench as cm
from hardware_specs.catalog import ACCELERATORS, NODES
from simulator.cost.provenance import ASSUMED, CALIBRATED, DERIVED, efficiency_provenance, provenance_state
from simulator.scenario import load_scenario

C, A = CALIBRATED, ASSUMED
B200 = (DERIVED, "b200")            # a sibling's level at the same fraction of this part's peak
RULE_A100 = (DERIVED, "a100-sxm-80g by rule")  # validation/calibrate_microbench.py IN_TRAINING_RULE
RULE_H100 = (DERIVED, "h100-sxm-80g by rule")  # validation/calibrate_microbench.py MEMORY_BOUND_RULE
LINKS_B200 = (DERIVED, "dgx-b200")  # DGX B200's fitted NVLink-5 collective laws, transferred
P2P_GB200 = (DERIVED, "gb200-nvl72")  # sends / all-to-alls: GB200's p2p copy (collectives_bandwidth.csv row 117)
SPEC = "stated in the spec"         # a datasheet / NIC figure written into the node spec (no fit)
FA4_PARTS_NOT_MEASURED = ("bwd_efficiency", "causal_half_seq_len", "half_seq_len", "head_dim_factor")

#: node -> component -> (state, the start of "from what") or SPEC. Components: the GEMM curves (bf16; fp8 per
#: tensor; the mxfp8 recipe's own kernel), the in-step GEMM factor, the fused attention kernel (FA4), memory-bound
#: kernels, the sustained clock (listed where the level came from a sibling at another power limit), collectives
#: inside the NVLink domain and across it (2 domains), and the link efficiency that prices sends and all-to-alls
#: inside it (``intra_node.collective_efficiency``: GB200's own p2p copy row, carried to the other NVLink5 nodes).
EXPECTED = {
    "dgx-b200": {"gemm_bf16": (C, ""), "gemm_fp8": (C, ""), "attention_kernel": (C, ""),
                 "intra_node_collectives": (C, ""), "inter_node_collectives": SPEC,
                 "intra_node_send_all_to_all": P2P_GB200},
    "p6-b200": {"gemm_bf16": (C, ""), "gemm_fp8": (C, ""), "attention_kernel": (C, ""),
                "intra_node_collectives": LINKS_B200, "inter_node_collectives": (C, ""),
                "intra_node_send_all_to_all": P2P_GB200},
    "hgx-b200": {"gemm_bf16": (C, ""), "gemm_fp8": (C, ""), "attention_kernel": (C, ""),
                 "intra_node_collectives": LINKS_B200, "inter_node_collectives": (A, ""),
                 "intra_node_send_all_to_all": P2P_GB200},
    "dgx-b300": {"gemm_bf16": B200, "gemm_fp8": B200, "attention_kernel": B200, "sustained_clock": (A, ""),
                 "intra_node_collectives": LINKS_B200, "inter_node_collectives": (A, ""),
                 "intra_node_send_all_to_all": P2P_GB200},
    "gb200-nvl72": {"gemm_bf16": B200, "gemm_fp8": B200, "attention_kernel": B200, "sustained_clock": (A, ""),
                    "intra_node_collectives": LINKS_B200, "inter_node_collectives": SPEC,
                    "intra_node_send_all_to_all": (C, "")},
    "gb300-nvl72": {"gemm_bf16": B200, "gemm_fp8": B200, "attention_kernel": B200, "sustained_clock": (A, ""),
                    "intra_node_collectives": LINKS_B200, "inter_node_collectives": (A, ""),
                    "intra_node_send_all_to_all": P2P_GB200},
}
PEAK_RULE = (DERIVED, "fp8 curve by rule")  # simulator/cost/compute.py BLOCK_SCALED_PEAK: fp8 curve on the recipe's peak
EVERY_BLACKWELL_NODE = {"in_training_gemm_factor": RULE_A100, "memory_bound": RULE_H100, "gemm_mxfp8": PEAK_RULE,
                        **{f"attention_kernel.{name}": (A, "") for name in FA4_PARTS_NOT_MEASURED},
                        "framework_factors": (A, "")}  # the step names no training.framework (default_framework.py)


def _provenance(node: str) -> dict[str, str]:
    """A Llama 3 8B step on two NVLink domains of ``node``, FP8 with MXFP8 block scaling (every curve listed)."""
    domain = NODES.get(node).domain_gpus
    scenario = load_scenario({"model": "llama3-8b", "cluster": {"node": node, "num_gpus": 128 if domain > 8 else 16},
                              "training": {"precision": "fp8", "fp8_recipe": "mxfp8", "attention": "flash"}})
    return efficiency_provenance(scenario)


def test_the_table_covers_every_blackwell_node():
    blackwell = {name for name, node in NODES.all().items() if node.accelerator in cm.BLACKWELL}
    assert blackwell == set(EXPECTED)


@pytest.mark.parametrize("node", sorted(EXPECTED))
def test_each_blackwell_efficiency_is_in_its_stated_state(node):
    provenance = _provenance(node)
    expected = {**EVERY_BLACKWELL_NODE, **EXPECTED[node]}
    assert set(provenance) == set(expected), node
    for component, want in expected.items():
        where = provenance[component]
        if want == SPEC:
            assert where.startswith(SPEC), (node, component, where)
            continue
        state, source = provenance_state(where)
        assert (state, source[:len(want[1])]) == want, (node, component, where)
        if state == CALIBRATED:  # names the rows it was fitted on
            assert "validation/data/" in where, (node, component, where)


def test_attention_rests_on_the_one_b200_row_relative_to_the_h200_row():
    fa4 = ACCELERATORS.get("b200").efficiency.attention
    assert fa4.kernel == "FlashAttention-4"
    assert fa4.fitted_on.startswith("validation/data/microbench/attention_kernels.csv row 422 (one level, relative "
                                    "to row 421)")
    table = cm.in_step_table().set_index("accelerator")
    # by construction: B200's step attention is predicted as far above its row as FA3's H200 step is above its own
    assert table.loc["b200", "error"] == pytest.approx(table.loc["h200-sxm-141g", "error"], abs=1e-4)
    assert table.loc["b200", "role"] == "fitted (one level)" and table.loc["h200-sxm-141g", "role"] == "check"
    # FA3's kernel shape, one scale on both passes
    fa3 = cm.fit_fa3()
    scale = fa4.fwd_efficiency / fa3.fwd_efficiency
    assert fa4.bwd_efficiency == pytest.approx(fa3.bwd_efficiency * scale, abs=2e-4)
    assert (fa4.causal_half_seq_len, fa4.head_dim_factor) == (fa3.causal_half_seq_len, fa3.head_dim_factor)


@pytest.mark.parametrize("name", cm.BLACKWELL)
def test_blackwell_blocks_reproduce_from_the_csv_rows(name):
    """Regenerate each Blackwell efficiency block from the CSVs and compare it with the catalog spec."""
    block = cm.efficiency_block(name)
    spec = ACCELERATORS.get(name).efficiency
    assert spec.attention.model_dump() == block["attention"], name
    for key in ("in_training_gemm_factor", "in_training_gemm_factor_source", "in_training_gemm_factor_fitted_on",
                "memory_bound_efficiency", "memory_bound_efficiency_source", "memory_bound_efficiency_fitted_on",
                "fitted_on"):
        assert getattr(spec, key) == block[key], (name, key)
    assert [(p.gflop, p.efficiency) for p in spec.gemm_curve] == [(p["gflop"], p["efficiency"])
                                                                  for p in block["gemm_curve"]]
    assert [(p.gflop, p.efficiency) for p in spec.gemm_curves["fp8"].points] == [
        (p["gflop"], p["efficiency"]) for p in block["gemm_curves"]["fp8"]["points"]]


def test_fa3_is_still_refused_on_blackwell():
    from simulator.cost.attention_kernel import with_attention_kernel
    from simulator.errors import ConfigError

    with pytest.raises(ConfigError, match="Hopper"):
        with_attention_kernel(ACCELERATORS.get("b200"), "fa3", "flash")


def test_the_sanity_table_reads_the_named_microbenchmark_rows():
    """validation/blackwell_sanity.py: the part ratios it prints beside the predictions (rows named there)."""
    from validation.blackwell_sanity import mamf_efficiency, part_ratios

    b200 = part_ratios("B200")
    assert b200["gemm_bf16"] == pytest.approx(1745.0 / 794.5)        # MAMF rows 8 / 6
    assert b200["gemm_fp8"] == pytest.approx(3432.5 / 1402.6)        # rows 17 / 21
    assert b200["attention"] == pytest.approx(834.0 / 447.0)         # in-step FA4 B200 / FA3 H200
    assert b200["nvls_all_reduce"] == pytest.approx(838.0 / 473.1)   # 8-GPU NVLS at 8 GiB, rows 100 / 90
    assert part_ratios("GB200")["nvlink_p2p"] == pytest.approx(746.0 / 376.0)
    assert mamf_efficiency("B200", "bf16") == pytest.approx(1745.0 / 2250.0)


def test_the_simulated_kernel_ratios_follow_the_measured_ones():
    """The simulator's own B200 / H100 ratios at one Llama GEMM and at the measured step's attention: bf16 GEMM
    within 5% of the MAMF ratio; attention against FA3 equal to the measured ratio (that is how FA4 is fitted)."""
    from validation.blackwell_sanity import part_ratios, simulated_ratios

    measured, simulated = part_ratios("B200"), simulated_ratios("B200")
    assert simulated["gemm_bf16"] == pytest.approx(measured["gemm_bf16"], rel=0.05)
    assert simulated["attention_vs_fa3"] == pytest.approx(measured["attention"], rel=0.01)
    assert simulated["memory_bound"] == pytest.approx(measured["hbm"])  # same fraction of each part's HBM peak


@pytest.mark.parametrize("node", sorted(EXPECTED))
def test_the_nvfp4_gemm_is_derived_on_every_blackwell_node(node):
    """NVFP4 (no NVFP4 GEMM measured anywhere): the part's fp8 curve's fraction of peak on its datasheet fp4
    peak, derived by that rule on every Blackwell node; the fp4 peak itself stated (the spec's datasheet)."""
    domain = NODES.get(node).domain_gpus
    scenario = load_scenario({"model": "llama3-8b", "cluster": {"node": node, "num_gpus": 128 if domain > 8 else 16},
                              "training": {"precision": "fp8", "fp8_recipe": "nvfp4", "attention": "flash"}})
    provenance = efficiency_provenance(scenario)
    assert provenance_state(provenance["gemm_nvfp4"]) == (
        DERIVED, "fp8 curve by rule (its fraction of peak at the same shape, on the datasheet fp4 peak)")
    assert provenance["peak_fp4"].startswith(SPEC) and "datasheet" in provenance["peak_fp4"]
    assert "gemm_mxfp8" not in provenance
