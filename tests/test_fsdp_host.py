"""FSDP's host work per gather / per reduce (``fsdp.csv``, validation/harness/fsdp_host.py): fitted by ``clustersim
calibrate`` (simulator/cost/calibration.py ``fit_fsdp_host``) net of the copies the simulator prices beside the
collectives (the row's dispatch gauge reported, not applied), and added by the spmd planner to ZeRO-3
gathers and reduces only where a profile carries it."""

from __future__ import annotations

import csv
import json

import pytest
import yaml

from simulator.cost.calibration import build_profile, read_microbench, scenario_for_run
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from tests.test_calibration import synthetic_microbench
from tests.test_eager_dispatch import HARNESS, TINY, _with_dispatch

PARAMS = 1_000_000  # toy block: 4 MB of fp32 parameters
GATHER_S, REDUCE_S = 2.0e-3, 3.0e-3  # the derived rows' medians: FSDP's round trip over the bare collective


def _with_fsdp(folder, gather_s=GATHER_S, reduce_s=REDUCE_S, gauge_s: float | None = None, gauge_model=TINY):
    rows = []
    shape = {"world_size": 2, "layers": 4, "hidden_size": 256, "tokens": 8, "block_params": PARAMS,
             "block_param_tensors": 12, "padded_elements": PARAMS, "bytes": 4 * PARAMS, "dtype": "fp32"}
    for op, t in (("fsdp_gather_round_trip", 5e-3), ("bare_all_gather", 3e-3), ("fsdp_fwd_bwd", 80e-3),
                  ("plain_fwd_bwd", 9e-3), ("bare_reduce_scatter", 4e-3), ("bare_all_reduce", 3e-3),
                  ("dispatch_gauge", gauge_s), ("fsdp_gather_host", gather_s), ("fsdp_reduce_host", reduce_s)):
        if t is None:
            continue
        rows.append({"op": op, **shape, "inner": 1, "median_s": t, "p10_s": t, "p90_s": t, "reps": 45,
                     "model": json.dumps(gauge_model) if op == "dispatch_gauge" else ""})
    with (folder / "microbench" / "fsdp.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return folder


def _priced_copies_s(profile) -> tuple[float, float]:
    """(copy-in + copy-out of a gather, the gradients' copy-in of a reduce) at the profile's rates."""
    eff = profile["node"]["accelerator"]["efficiency"]
    mem_bw = profile["node"]["accelerator"]["hbm_bandwidth_gb_per_s"] * 1e9 * eff["memory_bound_efficiency"]
    launch = eff["kernel_launch_overhead_us"] * 1e-6

    def copy_s(nbytes):
        return 2 * nbytes / mem_bw + launch

    return copy_s(4 * PARAMS / 2) + copy_s(4 * PARAMS), copy_s(4 * PARAMS)


def test_the_host_work_is_the_rows_less_the_copies_the_simulator_prices(tmp_path):
    profile = build_profile(read_microbench(_with_fsdp(synthetic_microbench(tmp_path / "a"))))
    eff = profile["node"]["accelerator"]["efficiency"]
    gather_copies, reduce_copies = _priced_copies_s(profile)
    assert eff["zero3_gather_host_us"] == pytest.approx((GATHER_S - gather_copies) * 1e6, abs=1e-3)
    assert eff["zero3_reduce_host_us"] == pytest.approx((REDUCE_S - reduce_copies) * 1e6, abs=1e-3)
    assert "fsdp.csv" in eff["zero3_host_fitted_on"] and "not scaled" in eff["zero3_host_fitted_on"]
    # host work below the priced copies: none, never negative
    low = build_profile(read_microbench(_with_fsdp(synthetic_microbench(tmp_path / "b"), gather_s=1e-9,
                                                   reduce_s=-1e-3)))
    assert low["node"]["accelerator"]["efficiency"]["zero3_gather_host_us"] == 0.0
    assert low["node"]["accelerator"]["efficiency"]["zero3_reduce_host_us"] == 0.0


def test_the_dispatch_gauge_is_reported_not_applied(tmp_path):
    """The dispatch_gauge (dispatch.csv's step, timed between fsdp.csv's samples) at twice the dispatch row's time:
    the rows count as measured (the gauge reads the FSDP job's own state, which the training's FSDP runs in: the
    2026-12-06 loops' traces put its host work at the unscaled rows' size, not at half of it), and the fit says
    what the gauge read; another model in the gauge: as measured, and says so."""
    def fitted(folder):
        eff = build_profile(read_microbench(folder))["node"]["accelerator"]["efficiency"]
        return eff["zero3_gather_host_us"], eff["zero3_reduce_host_us"], eff["zero3_host_fitted_on"]

    ref = _with_dispatch(synthetic_microbench(tmp_path / "ref"), [2.0e-3, 3.0e-3])  # median 2.5 ms
    profile = build_profile(read_microbench(_with_fsdp(ref, 2 * GATHER_S, 2 * REDUCE_S, gauge_s=5.0e-3)))
    gather_copies, reduce_copies = _priced_copies_s(profile)
    gather_us, reduce_us, note = fitted(ref)
    assert gather_us == pytest.approx((2 * GATHER_S - gather_copies) * 1e6, abs=1e-3)
    assert reduce_us == pytest.approx((2 * REDUCE_S - reduce_copies) * 1e6, abs=1e-3)
    assert "x0.500" in note and "not applied" in note
    other = _with_dispatch(synthetic_microbench(tmp_path / "other"), [2.5e-3])
    _with_fsdp(other, 2 * GATHER_S, 2 * REDUCE_S, gauge_s=5.0e-3, gauge_model=HARNESS)
    assert fitted(other)[0] == pytest.approx((2 * GATHER_S - gather_copies) * 1e6, abs=1e-3)
    assert "another model" in fitted(other)[2]


def test_without_the_rows_or_on_a_gpu_nothing_is_fitted(tmp_path):
    plain = build_profile(read_microbench(synthetic_microbench(tmp_path / "a")))
    assert "zero3_gather_host_us" not in plain["node"]["accelerator"]["efficiency"]
    gpu = _with_fsdp(synthetic_microbench(tmp_path / "g"))
    meta = json.loads((gpu / "microbench" / "microbench.json").read_text())
    meta["settings"]["device_type"] = "cuda"
    (gpu / "microbench" / "microbench.json").write_text(json.dumps(meta))
    assert "zero3_gather_host_us" not in build_profile(read_microbench(gpu))["node"]["accelerator"]["efficiency"]


def _harness_run(strategy: str, zero: int) -> dict:
    return {"strategy": strategy, "model": HARNESS, "precision": "fp32", "optimizer": "adam", "device_type": "cpu",
            "step_time_s": 0.2, "layout": {"num_gpus": 2, "tp": 1, "pp": 1, "dp": 2, "zero_stage": zero,
                                           "schedule": "1f1b", "micro_batch_size": 4, "global_batch_size": 8}}


def _step_s(profile: dict, run: dict, tmp_path, name: str) -> tuple[float, dict]:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    result = simulate(load_scenario(scenario_for_run(run, path)))
    return float(result.step_time_s), dict(result.time_breakdown_s)


def test_the_planner_adds_it_to_each_zero3_gather_and_reduce_only(tmp_path):
    """The harness's fsdp run (4 blocks + the root: 9 gathers and 5 reduce-scatters per step, on the host's critical
    path under gloo) gets 9 gathers' and 5 reduces' host work on its compute stream; ddp (zero 0) and a profile
    without the fields: unchanged."""
    without = build_profile(read_microbench(synthetic_microbench(tmp_path / "a")))
    carrying = build_profile(read_microbench(synthetic_microbench(tmp_path / "b")))
    eff = carrying["node"]["accelerator"]["efficiency"]
    eff["zero3_gather_host_us"], eff["zero3_reduce_host_us"] = 1000.0, 2000.0
    base_s, base_parts = _step_s(without, _harness_run("fsdp", 3), tmp_path, "without")
    with_s, with_parts = _step_s(carrying, _harness_run("fsdp", 3), tmp_path, "with")
    # each on the compute stream (the host runs it); a reduce's host work can hide some of a reduce-scatter that
    # was exposed before (the engine's overlap of the dp stream), a gather's cannot: the gathers block (gloo)
    assert with_parts["compute"] - base_parts["compute"] == pytest.approx(9 * 1e-3 + 5 * 2e-3, rel=1e-6)
    assert 9 * 1e-3 < with_s - base_s <= 9 * 1e-3 + 5 * 2e-3 + 1e-9
    eff["zero3_reduce_host_us"] = 0.0
    assert _step_s(carrying, _harness_run("fsdp", 3), tmp_path, "gathers")[0] - base_s == pytest.approx(9e-3, rel=1e-6)
    assert _step_s(carrying, _harness_run("ddp", 0), tmp_path, "ddp_with")[0] == \
        _step_s(without, _harness_run("ddp", 0), tmp_path, "ddp_without")[0]
