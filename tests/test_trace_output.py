"""The Chrome trace: a named track per stream (ep and cp included), args, pipeline flow arrows, rank filter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.cli import main

MIXTRAL = str(Path(__file__).resolve().parents[1] / "examples" / "mixtral-8x7b-ep8-h100.yaml")


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    folder = tmp_path_factory.mktemp("trace")
    common = ["simulate", MIXTRAL, "--set", "parallelism.pp=2", "--set", "parallelism.ep=4", "--set",
              "parallelism.global_batch_size=64"]
    assert main([*common, "--trace", str(folder / "all.json")]) == 0
    assert main([*common, "--trace", str(folder / "stage1.json"), "--trace-ranks", "1"]) == 0
    return {name: json.loads((folder / f"{name}.json").read_text())["traceEvents"] for name in ("all", "stage1")}


def test_every_stream_has_a_named_track(traces):
    events = traces["all"]
    named = {(e["pid"], e["tid"]) for e in events if e.get("name") == "thread_name"}
    used = {(e["pid"], e["tid"]) for e in events if e["ph"] == "X"}
    assert used <= named
    names = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert {"compute", "ep", "pp", "dp"} <= names


def test_events_carry_args_and_pipeline_sends_carry_flows(traces):
    events = traces["all"]
    comm = [e for e in events if e["ph"] == "X" and e["cat"] in ("ep_comm", "dp_comm", "pp_comm")]
    assert comm and all(e["args"]["bytes"] > 0 for e in comm)
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts and starts.keys() == ends.keys()
    assert all(starts[i]["pid"] != ends[i]["pid"] and ends[i]["ts"] >= starts[i]["ts"] for i in starts)


def test_trace_ranks_keeps_only_those_rank_classes(traces):
    names = {e["args"]["name"] for e in traces["stage1"] if e.get("name") == "process_name"}
    assert len(names) == 1 and len(traces["stage1"]) < len(traces["all"])
