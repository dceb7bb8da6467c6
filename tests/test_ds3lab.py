"""DS3Lab Decentralized_FM_alpha under tc-shaped links (validation/ds3lab.py): the point-to-point transfers
(transport fitted on the 64 MB rows, checked on the 128 MB rows: held-out median |error| <= 10%), the
GPT-3 XL GPipe pipelines (V100 GEMM factor fitted on the default-network rows, checked on every shaped
row: held-out median |error| <= 15%) and their parameter-server variants (nothing fitted: median <= 15%).
Each fails past its target."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from validation import ds3lab

ROOT = Path(__file__).resolve().parents[1]


def test_p2p_transfers_under_tc_within_10_percent_on_the_held_out_128mb_rows():
    block = ds3lab.p2p_report()
    assert block["heldout_rows"] == 20 and block["fit_rows"] == 20
    assert all(c["half"] == ("fit" if " 64 MB" in c["name"] else "held-out") for c in block["cases"])
    assert block["median_abs_error_heldout"] <= ds3lab.P2P_TARGET, block["median_abs_error_heldout"]


def test_the_simulator_path_gives_the_closed_form_the_transport_was_fitted_on():
    rows = ds3lab.p2p_rows()
    for library, transport in ds3lab.fitted_transports().items():
        part = rows[rows["library"] == library]
        inf = float("inf")
        closed = ds3lab._closed_form(part, transport["bandwidth_efficiency"],
                                     transport.get("max_flow_gbit_per_s", inf) * 1e9 / 8,
                                     transport.get("window_bytes", inf), transport.get("initial_window_bytes", inf))
        simulated = [ds3lab.simulate_p2p(*ds3lab._setting(row), row["bytes"], transport) for _, row in part.iterrows()]
        np.testing.assert_allclose(simulated, closed, rtol=1e-9)


def test_gloo_is_one_window_limited_connection_and_nccl_is_not():
    """What the fit finds, in the terms of the mechanism: Gloo moves one TCP stream (AWS caps a single flow
    outside a placement group at 5 Gb/s; its window bounds it at long delays), NCCL's several sockets reach
    the link rate and only pay slow start."""
    nccl, gloo = ds3lab.fitted_transports()["NCCL"], ds3lab.fitted_transports()["Gloo"]
    assert gloo["max_flow_gbit_per_s"] == pytest.approx(5.0, abs=0.25) and "window_bytes" in gloo
    assert "window_bytes" not in nccl and nccl.get("max_flow_gbit_per_s", 10) >= 9


@pytest.mark.slow
def test_gpt3_xl_pipelines_under_shaped_links_within_15_percent_on_the_held_out_rows():
    block = ds3lab.pipeline_report()
    assert block["fit_rows"] == 6 and block["heldout_rows"] == 24
    assert block["median_abs_error_heldout"] <= ds3lab.PIPELINE_TARGET, block["median_abs_error_heldout"]


@pytest.mark.slow
def test_gpt3_xl_parameter_servers_under_shaped_links_within_15_percent():
    """Issue 20's open item: DT-FM's central and sharded parameter servers (dp 2/4/8 and dp 4 of the
    12-stage pipeline) under every tc setting; nothing fitted on these rows."""
    rows = ds3lab.parameter_server_check("collective")
    assert len(rows) == 40
    assert sorted(abs(r.error) for r in rows)[len(rows) // 2] <= ds3lab.PIPELINE_TARGET


def test_validate_runs_the_ds3lab_p2p_set_and_exits_0_when_met():
    done = subprocess.run([sys.executable, "-m", "simulator.cli", "validate", "--case-set", "ds3lab_p2p"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "held-out median |error|" in done.stdout and "MET" in done.stdout
