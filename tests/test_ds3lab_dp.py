"""DS3Lab's Megatron-LM data-parallel (all-reduce) runs of GPT-3 XL (validation/ds3lab_dp.py): 6-8 replicas
of TP x PP = 8 on p3.16xlarge and p3.2xlarge instances, at the default network and under tc. Fit half: the
single-instance runs (DP 1), on which the p3.16xlarge's NVLink collective efficiency is fitted (the one
parameter without another source; V100 factors of the pipeline set, NCCL transport of the p2p set). Check:
every data-parallel row, held-out median |error| <= 15% (issue 20)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from validation import ds3lab_dp

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


def test_the_fit_half_is_the_single_instance_runs_at_the_md_batch():
    fit = ds3lab_dp.single_instance_rows()
    assert (fit["dp"] == 1).all() and (fit["instances"] == 1).all() and (fit["global_batch"] == 64).all()
    assert (fit["half"] == "fit").sum() == 35 and (fit["half"] == "set-aside").sum() == 3


def test_megatron_pads_the_bert_vocabulary_to_128_x_tp():
    assert [ds3lab_dp.megatron_padded_vocab(tp) for tp in (1, 2, 4, 8)] == [29056, 29184, 29184, 29696]


def test_the_scenario_follows_the_launch_scripts():
    row = ds3lab_dp.megatron_rows().iloc[0]
    scenario = ds3lab_dp.megatron_scenario(row, nvlink_efficiency=0.5)
    par = scenario["parallelism"]
    assert par["schedule"] == "1f1b" and par["overlap_grad_reduce"] is False  # --DDP-impl local
    assert scenario["training"]["optimizer"] == "sgd"
    assert par["tp"] * par["pp"] * par["dp"] == scenario["cluster"]["num_gpus"]
    assert scenario["model"]["vocab_size"] == ds3lab_dp.megatron_padded_vocab(par["tp"])
    assert scenario["model"]["tied_embeddings"] is True  # Megatron-LM's GPT output layer = word embeddings
    assert scenario["cluster"]["node"]["intra_node"]["collective_efficiency"] == 0.5


@pytest.mark.slow
def test_the_fitted_nvlink_efficiency_is_inside_the_grid_and_below_the_assumed_080():
    """The single-instance rows (fp32 alone and fp16 alone agree) put Megatron's TP all-reduce on the
    hybrid cube mesh at about 0.3 of the 150 GB/s link rate, not the catalog's assumed 0.8."""
    efficiency = ds3lab_dp.fit_nvlink_efficiency()
    grid = ds3lab_dp.NVLINK_EFFICIENCY_GRID
    assert grid[0] < efficiency < grid[-1]


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="unmet: held-out median |error| 17.1% over 91 rows (target 15%), max 70.0%; "
                                       "mostly under-predicted (PP 8 on 64 p3.2xlarge -34..-47%, under tc -5..-26%, "
                                       "TP 8 on p3.16xlarge -7..-70%), TP 2 PP 4 on p3.16xlarge -49..+51%")
def test_megatron_data_parallel_runs_within_15_percent_median():
    block = ds3lab_dp.megatron_report()
    assert block["heldout_rows"] == 91 and block["fit_rows"] == 35
    assert block["median_abs_error_heldout"] <= ds3lab_dp.TARGET, block["median_abs_error_heldout"]


def test_validate_offers_the_megatron_set():
    done = subprocess.run([sys.executable, "-m", "simulator.cli", "validate", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0 and "ds3lab_gpt3xl_megatron_dp" in done.stdout, done.stdout + done.stderr
