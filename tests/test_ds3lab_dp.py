"""DS3Lab's Megatron-LM data-parallel (all-reduce) runs of GPT-3 XL (validation/ds3lab_dp.py): 6-8 replicas
of TP x PP = 8 on p3.16xlarge and p3.2xlarge instances, at the default network and under tc. Nothing is
fitted on these rows (V100 factors of the pipeline set, NCCL transport of the p2p set): every row is a
check, held-out median |error| <= 15% (issue 20)."""

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


def test_the_scenario_follows_the_launch_scripts():
    row = ds3lab_dp.megatron_rows().iloc[0]
    scenario = ds3lab_dp.megatron_scenario(row)
    par = scenario["parallelism"]
    assert par["schedule"] == "1f1b" and par["overlap_grad_reduce"] is False  # --DDP-impl local
    assert scenario["training"]["optimizer"] == "sgd"
    assert par["tp"] * par["pp"] * par["dp"] == scenario["cluster"]["num_gpus"]


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="unmet: held-out median |error| 19.2% over 91 rows (target 15%), max 75.6%; "
                                       "under-predicted on most rows (TP 8 on p3.16xlarge -27..-36%, PP 8 on 64 "
                                       "p3.2xlarge -30..-41%), nothing fitted")
def test_megatron_data_parallel_runs_within_15_percent_median():
    block = ds3lab_dp.megatron_report()
    assert block["heldout_rows"] == 91 and block["fit_rows"] == 0
    assert block["median_abs_error_heldout"] <= ds3lab_dp.TARGET, block["median_abs_error_heldout"]


@pytest.mark.slow
def test_validate_runs_the_megatron_set_and_exits_1_while_unmet():
    done = subprocess.run([sys.executable, "-m", "simulator.cli", "validate", "--set", "ds3lab_gpt3xl_megatron_dp"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "ds3lab_gpt3xl_megatron_dp" in done.stdout and "NOT MET" in done.stdout
    assert "[set aside: marked '??' by the authors]" in done.stdout
