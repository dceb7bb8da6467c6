"""Sweeps on a real Dask distributed cluster on loopback (127.0.0.1): a scheduler with an
in-process worker reached by its tcp:// address, and `--dask local` (a LocalCluster of worker
processes) through the command line."""

from __future__ import annotations

import json

import pandas as pd
import pytest

distributed = pytest.importorskip("distributed")

from simulator.cli import main  # noqa: E402
from simulator.errors import ConfigError  # noqa: E402
from simulator.explore.sweep import load_sweep, parallel_map, run_sweep  # noqa: E402

BASE = {
    "model": "llama-1b",
    "cluster": {"node": "dgx-h100", "fabric": "fat-tree", "num_gpus": 8},
    "parallelism": {"tp": 1, "pp": 1, "dp": "auto", "global_batch_size": 32},
    "training": {"seq_length": 1024, "tokens": 1e9},
}


def _explode(x):
    if x == 2:
        raise ValueError("bad point")
    return x * 10


@pytest.fixture(scope="module")
def scheduler_address():
    cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, protocol="tcp", host="127.0.0.1",
                                       dashboard_address="127.0.0.1:0", silence_logs=40)
    try:
        yield cluster.scheduler_address
    finally:
        cluster.close()


def test_tcp_scheduler_runs_the_real_simulator(scheduler_address, tmp_path):
    assert scheduler_address.startswith("tcp://127.0.0.1:")
    sweep = load_sweep({"name": "dask", "base": BASE,
                        "grid": {"cluster.num_gpus": [8, 16], "parallelism.tp": [1, 2, 3]}})
    out = tmp_path / "dask.parquet"
    counts = run_sweep(sweep, out, dask=scheduler_address, progress=False)
    frame = pd.read_parquet(out)
    assert len(frame) == 6 and counts["error"] == 0
    assert (frame[frame["parallelism.tp"] != 3].status == "ok").all()
    # tp 3 does not divide the GPUs: recorded as infeasible with the reason
    assert frame[frame["parallelism.tp"] == 3].infeasible_reason.str.contains("does not divide").all()


def test_failing_task_is_recorded_and_the_rest_go_on(scheduler_address):
    got = sorted(parallel_map(_explode, [1, 2, 3], dask=scheduler_address))
    assert got[0] == (0, True, 10) and got[2] == (2, True, 30)
    assert got[1][:2] == (1, False) and "bad point" in got[1][2]


def test_dask_local_from_the_cli(tmp_path):
    sweep_file = tmp_path / "s.yaml"
    sweep_file.write_text(json.dumps({"name": "l", "base": BASE, "grid": {"cluster.num_gpus": [8, 16]}}))
    out = tmp_path / "o.csv"
    assert main(["sweep", str(sweep_file), "--out", str(out), "--dask", "local", "--workers", "1",
                 "--no-progress"]) == 0
    frame = pd.read_csv(out)
    assert len(frame) == 2 and (frame.status == "ok").all()


def test_bad_dask_address():
    with pytest.raises(ConfigError) as info:
        list(parallel_map(_explode, [1], dask="nonsense"))
    assert info.value.field == "--dask"
