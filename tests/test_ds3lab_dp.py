"""DS3Lab's Megatron-LM data-parallel (all-reduce) runs of GPT-3 XL (validation/ds3lab_dp.py): 6-8 replicas
of TP x PP = 8. Issue 20's check: the runs on p3.2xlarge (a replica on 8 single-V100 instances) at the md's
link settings (default network, tc), held-out median |error| <= 15%. The runs on p3.16xlarge (no tc) are a
set apart with the same target. Fit half: the single-instance runs (DP 1), on which Megatron-LM's own V100
GEMM factors (its PP 8 rows) and then the p3.16xlarge's NVLink collective efficiency are fitted (NCCL
transport of the p2p set)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from simulator.scenario import load_scenario
from validation import ds3lab, ds3lab_dp

ROOT = Path(__file__).resolve().parents[1]


def test_the_rows_are_the_data_parallel_megatron_cells_and_each_set_aside_row_says_why():
    rows = ds3lab_dp.megatron_rows()
    assert (rows["dp"] > 1).all() and rows["value"].notna().all()
    assert set(rows["half"]) == {"held-out", "set-aside"}
    aside = rows[rows["half"] == "set-aside"]
    assert (aside["aside"] != "").all() and (rows.loc[rows["half"] == "held-out", "aside"] == "").all()
    assert len(rows) == 105 and len(aside) == 14
    # the one repeat whose numbers differ stays twice: two measurements of one setting
    pp8 = rows[(rows["md_file"] == "gpt3_xl_fp16.md") & (rows["pp"] == 8) & (rows["n_layers"] == 24)
               & (rows["gpus_per_instance"] == 8) & (rows["micro_batch"] == 1)]
    assert sorted(pp8["value"]) == [16.91, 24.34] and set(pp8["half"]) == {"held-out"}


def test_the_issue_set_is_gpt3_xl_on_8_v100_instances_per_replica_under_the_md_link_settings():
    """Issue 20: "GPT-3 XL ... with data-parallel all-reduce, on 8 V100 instances under the link settings they
    list": p3.2xlarge (one V100 each), TP x PP = 8 instances per replica, the AWS default network or a tc row;
    the p3.16xlarge runs (never tc-shaped) are the other set, and every data-parallel row is in one of them."""
    rows = ds3lab_dp.megatron_rows()
    issue = rows[rows["case_set"] == ds3lab_dp.ISSUE_SET]
    other = rows[rows["case_set"] == ds3lab_dp.P3_16XLARGE_SET]
    assert len(issue) + len(other) == len(rows)
    assert (issue["gpus_per_instance"] == 1).all() and (issue["tp"] * issue["pp"] == 8).all()
    assert (issue["hidden_dim"] == 2048).all() and set(issue["md_file"]) == {"gpt3_xl.md", "gpt3_xl_fp16.md"}
    assert set(issue["instances"]) == {48, 64} and (issue["half"] == "held-out").all() and len(issue) == 24
    shaped = issue.dropna(subset=["tc_delay_ms"])
    assert sorted(set(zip(shaped["tc_delay_ms"], shaped["tc_bandwidth_gbps"], strict=True))) == [
        (1.0, 5.0), (5.0, 2.0), (10.0, 1.0), (50.0, 1.0)]
    assert (other["gpus_per_instance"] == 8).all() and other["tc_delay_ms"].isna().all()
    assert len(other) == 81 and (other["half"] == "set-aside").sum() == 14


def test_the_fit_half_is_the_single_instance_runs_at_the_md_batch():
    fit = ds3lab_dp.single_instance_rows()
    assert (fit["dp"] == 1).all() and (fit["instances"] == 1).all() and (fit["global_batch"] == 64).all()
    assert (fit["half"] == "fit").sum() == 35 and (fit["half"] == "set-aside").sum() == 3


def test_megatron_pads_the_bert_vocabulary_to_128_x_tp():
    assert [ds3lab_dp.megatron_padded_vocab(tp) for tp in (1, 2, 4, 8)] == [29056, 29184, 29184, 29696]


def test_the_scenario_follows_the_launch_scripts():
    row = ds3lab_dp.megatron_rows().iloc[0]
    scenario = ds3lab_dp.megatron_scenario(row, nvlink_efficiency=0.5, compute_factor=1.0)
    par = scenario["parallelism"]
    assert par["schedule"] == "1f1b" and par["overlap_grad_reduce"] is False  # --DDP-impl local
    assert scenario["training"]["optimizer"] == "sgd"
    assert par["tp"] * par["pp"] * par["dp"] == scenario["cluster"]["num_gpus"]
    # the tokenizer's vocabulary, padded by the model to 128 x tp as Megatron-LM pads it
    assert scenario["model"]["vocab_size"] == ds3lab_dp.BERT_LARGE_CASED_VOCAB
    spec = load_scenario(scenario).model
    assert spec.padded_vocab_size(par["tp"]) == ds3lab_dp.megatron_padded_vocab(par["tp"])
    assert scenario["model"]["tied_embeddings"] is True  # Megatron-LM's GPT output layer = word embeddings
    assert scenario["cluster"]["node"]["intra_node"]["collective_efficiency"] == 0.5
    curve = scenario["cluster"]["node"]["accelerator"]["efficiency"]["gemm_curves"][scenario["training"]["precision"]]
    assert "Megatron-LM" in curve["source"] and "fit_megatron_compute_factor" in curve["fitted_on"]


@pytest.mark.slow
def test_megatrons_own_compute_factor_reproduces_its_single_instance_pipelines():
    """Fitted on the fit half's PP 8 rows (TP 1, DP 1 on one p3.16xlarge); with the fitted NVLink efficiency each
    is within 15% (fp16 +4.1, -2.4, +0.5, -1.1, no-recompute +13.6%; fp32 +3.2, +1.2, -1.0%). DT-FM's factor (its own code) leaves the fp16 ones
    +41..+50%: Megatron-LM's fp16 kernels run about 1.6x DT-FM's on the same V100."""
    import math

    fit = ds3lab_dp.single_instance_rows()
    pp8 = fit[(fit["half"] == "fit") & (fit["tp"] == 1) & (fit["pp"] == 8)]
    assert len(pp8) == 8
    errors = [ds3lab_dp._simulate(row).step_time_s / row["value"] - 1 for _, row in pp8.iterrows()]
    assert all(abs(e) <= 0.15 for e in errors), errors
    # fitted at the catalog's NVLink efficiency (the tied embeddings' two-rank all-reduce): mean log error zeroed
    catalog = ds3lab_dp._catalog_nvlink_efficiency()
    for precision in ("fp16", "fp32"):
        rows = pp8[pp8["precision"] == precision]
        logs = [math.log(ds3lab_dp._simulate(row, catalog).step_time_s / row["value"]) for _, row in rows.iterrows()]
        assert abs(sum(logs) / len(logs)) < 0.005, (precision, logs)
    ratio = ds3lab_dp.fit_megatron_compute_factor("fp16") / ds3lab.fit_compute_factor("fp16")
    assert 1.4 < ratio < 1.8, ratio


def test_missing_seconds_are_measured_minus_simulated_by_layout_layer_count_and_network(monkeypatch):
    rows = ds3lab_dp.megatron_rows()
    issue = rows[rows["case_set"] == ds3lab_dp.ISSUE_SET]
    fake = tuple(ds3lab.CheckedRow(f"row {i}", float(r["value"]), float(r["value"]) - i, r["half"])
                 for i, (_, r) in enumerate(issue.iterrows()))
    monkeypatch.setattr(ds3lab_dp, "megatron_check", lambda: {ds3lab_dp.ISSUE_SET: fake})
    missing = ds3lab_dp.missing_seconds_by_layout()
    assert sum(len(by) for by in missing.values()) == len(issue) == 24
    pp8 = missing["TP1 PP8 DP8 x64"]
    assert list(pp8) == ["L24 mb1 fp16 default", "L24 mb1 fp16 10/1", "L24 mb1 fp16 50/1", "L32 mb1 fp16 default",
                         "L32 mb1 fp16 10/1", "L32 mb1 fp16 50/1", "L40 mb1 fp16 default", "L40 mb1 fp16 10/1",
                         "L40 mb1 fp16 50/1"]
    first = issue.index.get_loc(issue[(issue["pp"] == 8) & issue["tc_delay_ms"].isna()].index[0])
    assert pp8["L24 mb1 fp16 default"] == first  # measured - simulated of that row
    assert missing["TP4 PP2 DP6 x48"]["L24 mb1 fp16 no-re 10/1"] == 5


@pytest.mark.slow
def test_the_fitted_nvlink_efficiency_is_inside_the_grid_and_below_the_assumed_080():
    """Given Megatron-LM's own compute factors, the single-instance rows put its TP all-reduce on the hybrid cube
    mesh at about 0.2 of the link rate, not the catalog's assumed 0.8."""
    efficiency = ds3lab_dp.fit_nvlink_efficiency()
    grid = ds3lab_dp.NVLINK_EFFICIENCY_GRID
    assert grid[0] < efficiency < grid[-1]


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="unmet: issue 20's data-parallel set, held-out median |error| 15.02% over 24 rows "
                                       "(target 15%), max 70.3%; every row under-predicted: PP 8 at the default network "
                                       "-53..-62% (about 16.5 s a step missing whatever the layer count; the DT-FM "
                                       "PP 8 x DP 8 rows beside them, system unstated, are 13 s faster and simulated "
                                       "-5..-8%), "
                                       "under tc -6..-27%, TP-bound rows -9..-19%; with DT-FM's compute factors instead "
                                       "12.9% (not used: they leave Megatron-LM's own PP 8 fit rows +41..+50%)")
def test_megatron_data_parallel_runs_on_p3_2xlarge_under_the_md_link_settings_within_15_percent_median():
    """Issue 20's check: nothing fitted on these rows (Megatron-LM's V100 factors from the single-instance fit
    half, NCCL transport of the point-to-point rows)."""
    block = ds3lab_dp.megatron_report(ds3lab_dp.ISSUE_SET)
    assert block["heldout_rows"] == 24 and block["fit_rows"] == 0
    assert block["median_abs_error_heldout"] <= ds3lab_dp.TARGET, block["median_abs_error_heldout"]


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="unmet: p3.16xlarge set (not issue 20's check), held-out median |error| 20.5% "
                                       "over 67 rows (target 15%), max 69.7%; mostly under-predicted (PP 8 -45..+8%, "
                                       "TP 8 -70..+2%, TP 4 PP 2 -56..+6%), TP 2 PP 4 -50..+49%")
def test_megatron_data_parallel_runs_on_p3_16xlarge_within_15_percent_median():
    block = ds3lab_dp.megatron_report(ds3lab_dp.P3_16XLARGE_SET)
    assert block["heldout_rows"] == 67 and block["fit_rows"] == 35
    assert block["median_abs_error_heldout"] <= ds3lab_dp.TARGET, block["median_abs_error_heldout"]


def test_validate_offers_the_megatron_set():
    done = subprocess.run([sys.executable, "-m", "simulator.cli", "validate", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ds3lab_gpt3xl_megatron_dp," in done.stdout and "ds3lab_gpt3xl_megatron_dp_p3_16xlarge" in done.stdout
