"""Reading measured profiler traces and setting them beside a simulated step (no torch needed)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.errors import ConfigError
from simulator.report.compare import (
    comm_kind,
    compare_rows,
    load_trace,
    measured_breakdown,
    sim_comm_kind,
    simulated_breakdown,
    stage_of_rank,
    union_length,
)
from simulator.report.result import TimelineEvent

DATA = Path(__file__).parent / "data" / "traces"
CPU = DATA / "gloo_cpu_two_steps.json"
GPU = DATA / "nccl_gpu_two_steps.json"
MS = 1e-3


@pytest.mark.parametrize("name, kind", [
    ("ncclKernel_AllReduce_RING_LL_Sum_float", "all_reduce"),
    ("ncclDevKernel_AllGather_RING_LL", "all_gather"),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "reduce_scatter"),
    ("ncclDevKernel_SendRecv", "send_recv"),
    ("ncclDevKernel_Broadcast_RING_LL", "broadcast"),
    ("gloo:all_reduce", "all_reduce"), ("gloo:recv", "send_recv"), ("gloo:send", "send_recv"),
    ("c10d::allreduce_", "all_reduce"), ("c10d::_allgather_base_", "all_gather"),
    ("c10d::_reduce_scatter_base_", "reduce_scatter"), ("c10d::recv_", "send_recv"),
    ("c10d::alltoall_base_", "all_to_all"), ("c10d::barrier", "barrier"),
    ("aten::mm", None), ("ampere_sgemm_128x64_tn", None), ("aten::all", None), ("Memcpy HtoD", None),
])
def test_event_names_map_to_communication_kinds(name, kind):
    assert comm_kind(name) == kind


def test_record_param_comms_uses_its_collective_name():
    assert comm_kind("record_param_comms", {"Collective name": "_allgather_base"}) == "all_gather"
    assert comm_kind("record_param_comms", {"Collective name": "allreduce"}) == "all_reduce"


def test_union_counts_overlap_once():
    assert union_length([(0, 2), (1, 3), (5, 6)]) == 4
    assert union_length([]) == 0


def test_cpu_trace_single_step_breakdown():
    b = measured_breakdown(CPU, step=1)
    assert b.duration_s == pytest.approx(10 * MS)
    assert b.busy_s["compute"] == pytest.approx(4.0 * MS)  # linear 3 + the non-comm part of the TP function 0.2 + gelu 0.8
    assert b.busy_s["all_reduce"] == pytest.approx(3.0 * MS)
    assert b.busy_s["optimizer"] == pytest.approx(1.0 * MS)
    assert b.exposed_communication_s == pytest.approx(3.0 * MS)
    assert b.idle_s == pytest.approx(2.0 * MS)
    assert any("not in the trace" in n and "send_recv" in n for n in b.notes)


def test_cpu_trace_average_of_steps():
    b = measured_breakdown(CPU)  # average is the default
    assert "average of 2" in b.step
    assert b.busy_s["compute"] == pytest.approx(4.5 * MS)  # 4.0 and 5.0
    assert b.exposed_communication_s == pytest.approx(2.5 * MS)  # 3.0 and 2.0 (gelu overlaps in step 2)
    assert b.idle_s == pytest.approx(2.0 * MS)


def test_gpu_trace_uses_device_streams_and_launch_windows():
    b = measured_breakdown(GPU, step=5)
    assert b.duration_s == pytest.approx(6.0 * MS)  # first kernel of step 5 (1.0 ms) to that of step 6 (7.0 ms)
    assert b.busy_s["compute"] == pytest.approx(2.5 * MS)
    assert b.busy_s["all_reduce"] == pytest.approx(2.0 * MS)
    assert b.exposed_communication_s == pytest.approx(1.0 * MS)
    assert b.busy_s["optimizer"] == pytest.approx(0.5 * MS)
    assert b.idle_s == pytest.approx(2.0 * MS)
    assert {i.lane for i in b.intervals} == {"stream 7", "stream 20"}


def test_missing_step_and_non_traces_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="ProfilerStep#9 is not in the trace"):
        measured_breakdown(CPU, step=9)
    with pytest.raises(ConfigError, match="not a PyTorch profiler"):
        load_trace(DATA / "not_a_trace.json")
    bad = tmp_path / "x.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not JSON"):
        load_trace(bad)
    chrome = tmp_path / "chrome.json"  # a Chrome trace, but not the profiler's
    chrome.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "paint", "ts": 0, "dur": 5, "cat": "blink"}]}))
    with pytest.raises(ConfigError, match="no profiler events"):
        load_trace(chrome)
    with pytest.raises(ConfigError, match="file not found"):
        load_trace(tmp_path / "missing.json")


def test_gzipped_trace_and_trace_without_steps(tmp_path):
    doc = json.loads(CPU.read_text())
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep")]
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    b = measured_breakdown(path)
    assert b.step == "whole trace"
    assert any("whole trace" in n for n in b.notes)
    assert b.busy_s["compute"] == pytest.approx(9.0 * MS)  # both steps' compute


class _FakeResult:
    def __init__(self, events, step):
        self.timeline = events
        self.step_time_s = step


def test_simulated_side_groups_by_kind_and_compares():
    ev = [
        TimelineEvent("stage0", "compute", "F.mb0", "compute", 0.0, 4 * MS),
        TimelineEvent("stage0", "tp", "F.mb0.c0", "tp_comm", 4 * MS, 6 * MS),
        TimelineEvent("stage0", "dp", "B.mb0.c0.grad_all_reduce", "dp_comm", 5 * MS, 8 * MS),
        TimelineEvent("stage0", "compute", "optimizer_step", "optimizer", 8 * MS, 9 * MS),
        TimelineEvent("stage1", "compute", "F.mb0", "compute", 0.0, 1 * MS),
    ]
    sim = simulated_breakdown(_FakeResult(ev, 10 * MS), "stage0")
    assert sim.busy_s["all_reduce"] == pytest.approx(4 * MS)  # tp (4-6) and dp (5-8) overlap
    assert sim.busy_s["compute"] == pytest.approx(4 * MS)
    assert sim.idle_s == pytest.approx(1 * MS)
    rows = {r["category"]: r for r in compare_rows(measured_breakdown(CPU, step=1), sim)}
    assert rows["compute"]["relative_error"] == pytest.approx(0.0)
    assert rows["all_reduce"]["simulated_s"] == pytest.approx(4 * MS)
    assert rows["step"]["relative_error"] == pytest.approx(0.0)
    assert "send_recv" not in rows  # absent on both sides
    with pytest.raises(ConfigError, match="rank classes"):
        simulated_breakdown(_FakeResult(ev, 10 * MS), "stage7")


def test_simulated_comm_kind_from_name_then_purpose():
    assert sim_comm_kind("B.mb0.c0.grad_reduce_scatter", "dp_comm", 3) == "reduce_scatter"
    assert sim_comm_kind("F.mb0.c0.L1.zero3_gather", "dp_comm", 3) == "all_gather"
    assert sim_comm_kind("send_act.mb0.c0", "pp_comm") == "send_recv"
    assert sim_comm_kind("F.mb0.c0", "tp_comm") == "all_reduce"
    assert stage_of_rank(3, 4, 2) == "stage1" and stage_of_rank(None, 4, 2) is None


def _tiny_scenario(tmp_path) -> Path:
    import yaml

    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump({
        "model": {"name": "tiny", "num_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
                  "vocab_size": 1024, "seq_length": 128},
        "cluster": {"node": "dgx-a100-80g", "num_gpus": 2},
        "parallelism": {"tp": 2, "pp": 1, "dp": 1, "micro_batch_size": 1, "global_batch_size": 2},
        "training": {"precision": "bf16"},
    }))
    return path


def test_compare_cli_table_json_and_plot(tmp_path, capsys):
    scenario = _tiny_scenario(tmp_path)
    png = tmp_path / "cmp.png"
    assert main(["compare", str(scenario), "--trace", str(GPU), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "compute" in out and "all_reduce" in out and "idle" in out
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["compare", str(scenario), "--trace", str(CPU), "--step", "2", "--json",
                 "--set", "parallelism.micro_batch_size=2", "--set", "parallelism.global_batch_size=4"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["measured_step"] == "ProfilerStep#2"
    cats = {r["category"] for r in doc["rows"]}
    assert {"step", "compute", "all_reduce", "idle"} <= cats


def test_compare_cli_errors_are_one_line(tmp_path, capsys):
    scenario = _tiny_scenario(tmp_path)
    assert main(["compare", str(scenario), "--trace", str(DATA / "not_a_trace.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("clustersim: error: --trace:") and len(err.strip().splitlines()) == 1
    assert main(["compare", "--trace", str(CPU)]) == 2  # no scenario, not a harness trace
    assert "scenario" in capsys.readouterr().err


def test_a_cut_off_last_step_is_left_out_of_the_average():
    from simulator.report.compare import drop_truncated_last_step

    steps = [("ProfilerStep#1", 0.0, 100.0), ("ProfilerStep#2", 100.0, 205.0), ("ProfilerStep#3", 205.0, 230.0)]
    kept, note = drop_truncated_last_step(steps)
    assert kept == steps[:2] and "ProfilerStep#3 left out" in note
    whole = steps[:2] + [("ProfilerStep#3", 205.0, 300.0)]
    assert drop_truncated_last_step(whole) == (whole, None)
    assert drop_truncated_last_step(steps[:2]) == (steps[:2], None)  # two steps: nothing to compare with


def test_compare_warns_when_the_trace_has_another_world_size(tmp_path, capsys):
    from simulator.cli import main

    scenario = tmp_path / "s.yaml"
    scenario.write_text("model: gpt-1.7b\ncluster: {node: dgx-a100-80g, num_gpus: 8}\n"
                        "parallelism: {tp: 2, global_batch_size: 16}\n")
    trace = Path(__file__).parent / "data" / "traces" / "gloo_cpu_two_steps.json"
    assert main(["compare", str(scenario), "--trace", str(trace)]) == 0
    assert "recorded on 2 ranks, the scenario has 8 GPUs" in capsys.readouterr().err


def _trace_with_shapes(tmp_path, weight: list[int]) -> Path:
    """The gloo test trace with shapes recorded (record_shapes=True): its linear has ``weight``."""
    doc = json.loads((Path(__file__).parent / "data" / "traces" / "gloo_cpu_two_steps.json").read_text())
    for e in doc["traceEvents"]:
        if e.get("name") == "aten::linear":
            e["args"] = {"Input Dims": [[1, 2048, weight[1]], weight, [weight[0]]]}
        elif e.get("name") == "aten::addmm":
            e["args"] = {"Input Dims": [[weight[0]], [2048, weight[1]], [weight[1], weight[0]]]}
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("weight, warned", [([3456, 2304], False),   # gpt-1.7b's qkv at tp 2
                                            ([2304, 4608], False),   # its fc2
                                            ([768, 256], True),      # another model
                                            ([6912, 2304], True)])   # gpt-1.7b's qkv at tp 1: not this layout
def test_compare_warns_when_the_traced_model_is_not_the_scenarios(tmp_path, capsys, weight, warned):
    from simulator.cli import main

    scenario = tmp_path / "s.yaml"
    scenario.write_text("model: gpt-1.7b\ncluster: {node: dgx-a100-80g, num_gpus: 2}\n"
                        "parallelism: {tp: 2, global_batch_size: 4}\n")
    assert main(["compare", str(scenario), "--trace", str(_trace_with_shapes(tmp_path, weight))]) == 0
    err = capsys.readouterr().err
    assert ("the traced model is not the scenario's" in err) == warned, err
    if warned:
        assert f"{weight[0]}x{weight[1]}" in err and "3456x2304" in err


def test_a_trace_without_shapes_is_not_checked(tmp_path, capsys):
    from simulator.cli import main
    from simulator.report.compare import load_trace, trace_linear_weights

    trace = Path(__file__).parent / "data" / "traces" / "gloo_cpu_two_steps.json"
    assert trace_linear_weights(load_trace(trace)) == set()
    scenario = tmp_path / "s.yaml"
    scenario.write_text("model: gpt-1.7b\ncluster: {node: dgx-a100-80g, num_gpus: 2}\n"
                        "parallelism: {tp: 2, global_batch_size: 4}\n")
    assert main(["compare", str(scenario), "--trace", str(trace)]) == 0
    assert "traced model" not in capsys.readouterr().err
