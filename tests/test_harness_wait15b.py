"""The wait for the group's last rank, kept apart from the collective law and charged once per compute segment
(harness15b): the cadence rows of ``skew.csv`` time a collective after a GEMM segment, the harness's local_sgd
averages 52 parameter tensors back to back (its traces: 0.6-3.7 ms waited at the first, 0.04-0.09 ms at each
later one). On the saved 13:47 loop (tests/data/harness/loop_1347) the wait is 379 us; local_sgd's 52
all-reduces paid it 52 times a period, now once."""

from __future__ import annotations

import json

import pytest
import yaml

from hardware_specs.schema import AlphaBeta
from simulator.cli import main
from simulator.cost.collectives import collective_cost
from simulator.cost.topology import LinkCapacities, Placement
from tests.test_harness_fit15 import LOOP, _errors, _profile, loop_with_traces

WAIT_US = 379.0  # median of the loop's four cadence rows: 0.368, 0.537, 0.236, 0.390 ms


def _links() -> LinkCapacities:
    return LinkCapacities(intra_bytes_per_s=10e9, inter_bytes_per_s=1e9, uplink_bytes_per_s=1e9,
                          intra_latency_s=1e-6, inter_latency_s=5e-6)


def test_a_law_keeps_its_arrival_wait_apart_from_its_line():
    """latency_s is the line's latency plus the wait (a collective after compute, as every caller read it);
    arrival_wait_s names the wait; a law without one prices bit for bit as before."""
    placement = Placement(ranks=(0, 1), members_per_node=2, num_nodes=1, num_pods=1)
    bare = AlphaBeta(latency_us=100, bus_bandwidth_gb_per_s=1.0)
    waited = AlphaBeta(latency_us=100, bus_bandwidth_gb_per_s=1.0, arrival_wait_us=400)
    zero = AlphaBeta(latency_us=100, bus_bandwidth_gb_per_s=1.0, arrival_wait_us=0)
    c0 = collective_cost("all_reduce", 1e6, placement, _links(), {"all_reduce": bare})
    c1 = collective_cost("all_reduce", 1e6, placement, _links(), {"all_reduce": waited})
    cz = collective_cost("all_reduce", 1e6, placement, _links(), {"all_reduce": zero})
    assert c0.arrival_wait_s == 0.0 and c0 == cz
    assert c1.arrival_wait_s == pytest.approx(400e-6)
    assert c1.latency_s == pytest.approx(c0.latency_s + 400e-6, abs=1e-12)
    assert c1.bytes_by_link == c0.bytes_by_link
    # measured points (gloo): the table's time, then the wait on top
    points = {"measured_points": [(1e5, 900.0), (2e6, 3000.0)], "measured_world_size": 2}
    t0 = collective_cost("all_reduce", 1e6, placement, _links(), {"all_reduce": AlphaBeta(**{**bare.model_dump(),
                                                                                           **points})})
    t1 = collective_cost("all_reduce", 1e6, placement, _links(), {"all_reduce": AlphaBeta(**{**waited.model_dump(),
                                                                                           **points})})
    assert t1.latency_s - t0.latency_s == pytest.approx(400e-6, abs=1e-12)
    assert t1.arrival_wait_s == pytest.approx(t0.arrival_wait_s + 400e-6)
    with pytest.raises(ValueError):
        AlphaBeta(latency_us=1, bus_bandwidth_gb_per_s=1, arrival_wait_us=-1)


def _wait_folded_in(profile, out):
    """The profile as calibrated before: the wait added to every law's latency and measured points."""
    doc = yaml.safe_load(profile.read_text())
    for law in doc["node"]["intra_node"]["collectives"].values():
        wait = law.pop("arrival_wait_us", 0.0)
        law["latency_us"] += wait
        if law.get("measured_points"):
            law["measured_points"] = [[b, t + wait] for b, t in law["measured_points"]]
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def test_the_saved_loop_keeps_the_cadence_wait_apart_and_a_collective_after_compute_pays_it(tmp_path):
    """The cadence rows' median is each group collective's arrival_wait_us, not send_recv's; every run whose
    collectives each follow compute is predicted as with the wait folded into the law (to rounding), local_sgd's
    per-tensor averaging 51 waits a period (4 steps) shorter."""
    profile = _profile(LOOP, tmp_path / "p.yaml")
    laws = yaml.safe_load(profile.read_text())["node"]["intra_node"]["collectives"]
    for name in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
        assert laws[name]["arrival_wait_us"] == pytest.approx(WAIT_US, abs=0.1), name
    assert "arrival_wait_us" not in laws["send_recv"]
    strategies = ["ddp", "fsdp", "tp", "local_sgd", "pp_1f1b"]
    now = _errors(profile, strategies)
    folded = _errors(_wait_folded_in(profile, tmp_path / "folded.yaml"), strategies)
    for strategy in ("ddp", "fsdp", "tp", "pp_1f1b"):
        assert now[strategy] == pytest.approx(folded[strategy], abs=1e-6), strategy
    measured = next(r for r in json.loads((LOOP / "training" / "runs.json").read_text())["runs"]
                    if r["strategy"] == "local_sgd")["step_time_s"]
    assert (folded["local_sgd"] - now["local_sgd"]) * measured == pytest.approx(51 * WAIT_US * 1e-6 / 4, rel=1e-3)


def _outer_all_reduce_s(raw: dict) -> float:
    from simulator.scenario import load_scenario
    from simulator.simulate import simulate

    result = simulate(load_scenario(raw), detail=True)
    first = sorted({x.rank_class for x in result.timeline})[0]
    return sum(e.end_s - e.start_s for e in result.timeline if "outer_all_reduce" in e.name and e.rank_class == first)


def test_back_to_back_all_reduces_pay_the_wait_once(tmp_path):
    """The outer all-reduce of local_sgd: per tensor (52 back to back) and flat (one) both pay the wait once:
    raising every law's arrival_wait_us by 1 ms lengthens either by 1 ms, not 52."""
    from simulator.cost.calibration import scenario_for_run

    profile = _profile(LOOP, tmp_path / "p.yaml")
    doc = yaml.safe_load(profile.read_text())
    for law in doc["node"]["intra_node"]["collectives"].values():
        if "arrival_wait_us" in law:
            law["arrival_wait_us"] += 1000.0
    more = tmp_path / "more.yaml"
    more.write_text(yaml.safe_dump(doc, sort_keys=False))
    run = next(r for r in json.loads((LOOP / "training" / "runs.json").read_text())["runs"]
               if r["strategy"] == "local_sgd")
    for how in ("per_tensor", "flat"):
        raw, raw_more = scenario_for_run(run, profile), scenario_for_run(run, more)
        for r in (raw, raw_more):
            r["strategy"] = {**r["strategy"], "outer_all_reduce": how}
        assert _outer_all_reduce_s(raw_more) - _outer_all_reduce_s(raw) == pytest.approx(1e-3, rel=1e-6), how


def test_validate_runs_counts_each_collective_a_task_stands_for(tmp_path, capsys):
    """local_sgd's per-tensor averaging is one task of 52 all-reduces: the priced count is 52 (was 1), against
    the trace's 53 (the harness also all-reduces the loss)."""
    loop = loop_with_traces(tmp_path, "local_sgd", [(0.0, 600_000.0)],
                            [("gloo:all_reduce", 500_000.0 + 1_000 * k, 800.0) for k in range(53)])
    profile = _profile(loop, tmp_path / "p.yaml")
    assert main(["validate-runs", "--profile", str(profile), "--runs", str(loop), "--strategy", "local_sgd",
                 "--json"]) == 0
    got = json.loads(capsys.readouterr().out)[0]["traced_collectives"]
    assert got["collectives_per_step"] == 53 and got["predicted_collectives_per_step"] == 52
    assert main(["validate-runs", "--profile", str(profile), "--runs", str(loop), "--strategy", "local_sgd"]) == 0
    assert any(x.startswith("local_sgd ") and "53.0 / 52" in x for x in capsys.readouterr().out.splitlines())
