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


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_kernel_events_carry_layer_and_flops_that_add_up_to_the_step(recompute):
    # Every kernel event names its layer and the FLOPs it runs; over every rank the kernels' FLOPs add up
    # to the step's hardware FLOPs exactly (standard attention: no causal tiles skipped).
    from simulator.report.trace import chrome_trace
    from simulator.scenario import load_scenario
    from simulator.simulate import simulate

    scenario = load_scenario({"model": "gpt-1.7b", "cluster": {"node": "dgx-a100-80g", "num_gpus": 8},
                              "parallelism": {"tp": 2, "pp": 2, "global_batch_size": 16, "micro_batch_size": 1,
                                              "recompute": recompute},
                              "training": {"attention": "standard"}})
    result = simulate(scenario, detail=True)
    kernels = [e for e in chrome_trace(result)["traceEvents"]
               if e["ph"] == "X" and e["cat"] in ("compute", "recompute") and e["name"] != "optimizer_step"]
    assert kernels and all("layer" in e["args"] and "flops" in e["args"] for e in kernels)
    layers = {e["args"]["layer"] for e in kernels}
    assert {"embedding", "block0", "block23"} <= layers
    per_rank_class = sum(e["args"]["flops"] for e in kernels)  # one representative per stage
    par = scenario.parallelism
    assert per_rank_class * par.tp * par.dp_degree == pytest.approx(result.hardware_flops_per_step, rel=1e-12)


def test_summary_merges_each_layer_pass_and_keeps_flops_and_times(tmp_path):
    # --trace-summary: one event per layer pass and stream; FLOPs, the first start and the last end
    # per rank class and stream are those of the full trace.
    common = ["simulate", MIXTRAL, "--set", "parallelism.pp=2", "--set", "parallelism.ep=4", "--set",
              "parallelism.global_batch_size=32", "--trace"]
    assert main([*common, str(tmp_path / "full.json")]) == 0
    assert main([*common, str(tmp_path / "summary.json"), "--trace-summary"]) == 0
    full, summary = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("full", "summary"))
    assert summary["metadata"]["summary"] is True
    xf = [e for e in full["traceEvents"] if e["ph"] == "X"]
    xs = [e for e in summary["traceEvents"] if e["ph"] == "X"]
    assert len(xs) * 5 < len(xf)

    def totals(events):
        out = {}
        for e in events:
            key = (e["pid"], e["tid"])
            flops, first, last = out.get(key, (0.0, float("inf"), 0.0))
            out[key] = (flops + e.get("args", {}).get("flops", 0.0), min(first, e["ts"]), max(last, e["ts"] + e["dur"]))
        return out

    tf, ts = totals(xf), totals(xs)
    assert tf.keys() == ts.keys()
    for key in tf:
        assert ts[key] == pytest.approx(tf[key], rel=1e-12)
    merged = [e for e in xs if e.get("args", {}).get("events", 1) > 1]
    assert merged and all(e["args"]["busy_us"] <= e["dur"] * (1 + 1e-12) for e in merged)
    assert {"F.mb0.c0.block0", "B.mb0.c0.block0"} <= {e["name"] for e in xs if e["pid"] == 0}


def test_summary_needs_a_trace(capsys):
    assert main(["simulate", MIXTRAL, "--trace-summary"]) == 2
    assert "--trace-summary: needs --trace FILE" in capsys.readouterr().err


def test_a_chunk_without_layers_has_no_layer_name():
    """last_stage_layers: 0 leaves the last stage only the head: the planner builds it (the layer
    name for the trace is empty instead of an index error)."""
    from simulator.scenario import load_scenario
    from simulator.simulate import simulate

    raw = {"model": {"name": "tiny", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
                     "num_kv_heads": 4, "vocab_size": 1024, "seq_length": 256},
           "cluster": {"node": "dgx-a100-80g", "num_gpus": 2},
           "parallelism": {"tp": 1, "pp": 2, "micro_batch_size": 1, "global_batch_size": 4,
                           "first_stage_layers": 4, "last_stage_layers": 0}}
    from simulator.strategies.spmd.plan import Planner

    planner = Planner(load_scenario(raw))
    assert [planner.chunk_layers(0), planner.chunk_layers(1)] == ["block0..block3", ""]
    detail = simulate(load_scenario(raw), detail=True)
    assert {dict(e.args).get("layer") for e in detail.timeline if e.rank_class == "stage1" and e.category == "compute"} \
        == {"head"}
    assert simulate(load_scenario(raw)).step_time_s == pytest.approx(detail.step_time_s, rel=1e-9)
