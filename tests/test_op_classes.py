"""``clustersim compare --op-classes``: a host trace's step split by op class beside the simulated step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.errors import ConfigError
from simulator.report.op_classes import OP_CLASSES, measured_op_classes, op_class_rows, simulated_op_classes
from simulator.report.result import TimelineEvent

GPU = Path(__file__).parent / "data" / "traces" / "nccl_gpu_two_steps.json"
CPU = Path(__file__).parent / "data" / "traces" / "gloo_cpu_two_steps.json"


def _op(name, ts, dur, tid=1, cat="cpu_op"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}


def _trace(tmp_path) -> Path:
    """One 10 ms step on thread 1 (us): every class once, a TP all-reduce wrapper, a gloo thread."""
    ev = [_op("ProfilerStep#1", 0, 10_000, cat="user_annotation"),
          _op("aten::linear", 100, 1200), _op("aten::addmm", 150, 1100), _op("aten::copy_", 160, 100),
          _op("aten::gelu", 1400, 200),
          _op("aten::scaled_dot_product_attention", 1700, 400),
          _op("aten::_scaled_dot_product_flash_attention_for_cpu", 1750, 300),
          _op("aten::cross_entropy_loss", 2200, 300), _op("aten::_log_softmax", 2250, 150),
          _op("_ReduceFromTP", 2600, 500), _op("c10d::allreduce_", 2650, 50),
          _op("autograd::engine::evaluate_function: AddmmBackward0", 3200, 1000),
          _op("AddmmBackward0", 3250, 900), _op("aten::mm", 3300, 800),
          _op("Optimizer.step#Adam.step", 4500, 100, cat="user_annotation"), _op("aten::_fused_adam_", 4510, 80),
          _op("gloo:all_reduce", 2600, 480, tid=2, cat="user_annotation"),
          _op("aten::add", 2700, 5, tid=2)]  # another, lighter thread: not the step's
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    return path


def test_measured_self_times_by_class(tmp_path):
    got = measured_op_classes(_trace(tmp_path))
    us = {k: round(v * 1e6, 3) for k, v in got.items()}
    assert us["gemm_forward"] == 1000          # addmm less its bias copy
    assert us["elementwise_norm"] == 100 + 200  # the copy and the GELU
    assert us["attention"] == 300 and us["cross_entropy"] == 150
    assert us["gemm_backward"] == 800
    assert us["optimizer"] == 100              # the step annotation's self time and the fused kernel
    # linear's self 100, sdpa wrapper 100, cross_entropy_loss 150, autograd wrappers 100 + 100;
    # _ReduceFromTP (issued an all_reduce: its self time is the wait) and the c10d op are left out
    assert us["framework"] == 100 + 100 + 150 + 100 + 100
    # the step less the top-level ops (1200, 200, 400, 300, 500, 1000, 100)
    assert us["python_between_ops"] == 10_000 - 3700
    assert set(got) == set(OP_CLASSES)


def test_simulated_events_by_class():
    def ev(name, s, t, cat="compute", flops=0.0):
        return TimelineEvent("stage0", "compute", name, cat, s, t, (("flops", flops),) if flops else ())

    class R:
        timeline = [ev("F.mb0.c0.L0.qkv", 0, 1, flops=1e9), ev("F.mb0.c0.L0.attn_scores", 1, 2, flops=1e8),
                    ev("F.mb0.c0.L0.softmax_dropout", 2, 2.5), ev("F.mb0.c0.L0.gelu", 2.5, 3),
                    ev("F.mb0.c0.head.cross_entropy", 3, 4), ev("B.mb0.c0.L0.fc1.wgrad", 4, 6, flops=1e9),
                    ev("B.mb0.c0.L0.fc1.bias_grad", 6, 6.25), ev("optimizer_step", 7, 8, cat="optimizer"),
                    TimelineEvent("stage0", "dp", "B.dp_allreduce", "dp_comm", 5, 7),
                    TimelineEvent("stage1", "compute", "F.mb0.c0.L1.qkv", "compute", 0, 9)]

    got = simulated_op_classes(R(), "stage0")
    assert got["gemm_forward"] == 1 and got["attention"] == 1.5 and got["elementwise_norm"] == 0.75
    assert got["cross_entropy"] == 1 and got["gemm_backward"] == 2 and got["optimizer"] == 1
    assert got["framework"] == got["python_between_ops"] == 0
    rows = op_class_rows({"gemm_forward": 2.0, "framework": 0.5}, got)
    assert rows[0] == {"op_class": "gemm_forward", "measured_s": 2.0, "simulated_s": 1, "relative_error": -0.5}
    assert {r["op_class"] for r in rows} == {"gemm_forward", "gemm_backward", "attention", "cross_entropy",
                                              "elementwise_norm", "optimizer", "framework"}


def test_device_traces_are_not_split():
    with pytest.raises(ConfigError, match="host"):
        measured_op_classes(GPU)


def test_compare_cli_prints_and_returns_the_op_classes(tmp_path, capsys):
    from tests.test_compare import _tiny_scenario

    scenario = _tiny_scenario(tmp_path)
    args = ["compare", str(scenario), "--trace", str(CPU), "--step", "2", "--op-classes",
            "--set", "parallelism.micro_batch_size=2", "--set", "parallelism.global_batch_size=4"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "op class" in out and "gemm_forward" in out
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    classes = {r["op_class"]: r for r in doc["op_classes"]}
    assert classes["gemm_forward"]["simulated_s"] > 0 and "rows" in doc
    assert main(["compare", str(scenario), "--trace", str(GPU), "--op-classes"]) == 2
    assert "host" in capsys.readouterr().err
