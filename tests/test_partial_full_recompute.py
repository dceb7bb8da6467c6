"""Megatron-Core's partial full recompute (``parallelism.recompute_method`` / ``recompute_num_layers`` with
``recompute: full``; megatron-core 0.16.1 ``transformer/transformer_block.py`` ``_checkpointed_forward``): which
layers of a chunk are re-run, what they keep, what it costs, counted by hand on a toy GPT; bad values refused
naming the field; runs that do not set it unchanged."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from simulator.cost.compute import ComputeModel
from simulator.errors import ConfigError
from simulator.explore.search import _modules_for
from simulator.memory.analytic import rank_memory
from simulator.memory.vectorised import stage_memories
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.strategies.spmd.layout import Parallelism
from tests.test_simulate import toy_raw
from workloads.graph import full_units, partial_full_mode, partial_full_of

LAYERS = 8
FLOPS = ("gemm", "attention")


def _raw(num_gpus=1, **par) -> dict:
    raw = toy_raw(num_gpus, **par)
    raw["model"]["num_layers"] = LAYERS
    return raw


def _sc(num_gpus=1, **par):
    return load_scenario(_raw(num_gpus, **par))


def _partial(method, n, **par):
    return _sc(recompute="full", recompute_method=method, recompute_num_layers=n, **par)


def test_units_follow_checkpointed_forward():
    assert partial_full_of(partial_full_mode("block", 5)) == ("block", 5)
    assert partial_full_of("full") is None and partial_full_of("selective:moe_act") is None
    assert full_units("full", 3) == ((0, 1), (1, 2), (2, 3))
    assert full_units("none", 3) == ()
    # block N: the chunk's first N layers, one unit each; all of them where the chunk is shorter
    assert full_units("full:block:2", 5) == ((0, 1), (1, 2))
    assert full_units("full:block:4", 3) == ((0, 1), (1, 2), (2, 3))
    # uniform N: consecutive units of N
    assert full_units("full:uniform:2", 6) == ((0, 2), (2, 4), (4, 6))
    assert full_units("full:uniform:1", 2) == full_units("full", 2)


def test_block_reruns_the_first_layers_forward_exactly():
    # one GPU, one micro-batch, 8 equal blocks: block N re-runs N blocks' forward kernels, the step is the step
    # without recompute plus that, the hardware FLOPs add N blocks' forward FLOPs
    none = simulate(_sc(recompute="none"))
    for n in (1, 3):
        sc = _partial("block", n)
        result = simulate(sc)
        block = sc.layer_graph().pipelined[0]
        compute = ComputeModel(sc.accelerator, "bf16")
        one = sum(compute.time_s(op) for op in block.forward)
        assert result.time_breakdown_s["recompute"] == pytest.approx(n * one, rel=1e-9)
        assert result.step_time_s == pytest.approx(none.step_time_s + n * one, rel=1e-9)
        rerun = sum(op.flops for op in block.forward if op.kind in FLOPS)
        assert result.hardware_flops_per_step - none.hardware_flops_per_step == pytest.approx(n * rerun, rel=1e-9)


def test_uniform_reruns_every_layer_once():
    full = simulate(_sc(recompute="full"))
    result = simulate(_partial("uniform", 2))
    assert result.time_breakdown_s["recompute"] == pytest.approx(full.time_breakdown_s["recompute"], rel=1e-9)
    assert result.hardware_flops_per_step == full.hardware_flops_per_step


def test_memory_by_hand():
    # one micro-batch in flight: full keeps every block's input and re-creates one block (saved - input);
    # block N keeps the other L - N blocks' activations whole; uniform N keeps L/N inputs and re-creates N
    # blocks at once (N x saved - input)
    sc = _sc(recompute="full")
    block = sc.layer_graph().pipelined[1]
    saved, kept = block.saved_bytes, block.kept_bytes("full", sc.layer_graph().input_bytes(block))
    assert 0 < kept < saved
    full = rank_memory(sc, 0).activations_bytes
    for n in (1, 3):
        got = rank_memory(_partial("block", n), 0).activations_bytes
        assert got - full == pytest.approx((LAYERS - n) * (saved - kept), rel=1e-12)
    for n in (2, 4):
        got = rank_memory(_partial("uniform", n), 0).activations_bytes
        assert got - full == pytest.approx(-(LAYERS - LAYERS // n) * kept + (n - 1) * saved, rel=1e-12)


@pytest.mark.parametrize(("pp", "v", "schedule"), [(2, 1, "1f1b"), (2, 2, "interleaved")])
def test_per_chunk_with_pipelines(pp, v, schedule):
    # block counts per model chunk (a virtual stage's TransformerBlock): block 1 re-runs v of a stage's 8/pp
    # layers; every engine path and the vectorised memory agree
    base = dict(pp=pp, dp=2, virtual_stages=v, schedule=schedule, global_batch_size=16, zero_stage=1)
    full = simulate(_sc(4, recompute="full", **base))
    results = []
    for mode, detail in (("symmetric", False), ("symmetric", True), ("full", False), ("full", True)):
        sc = load_scenario(_raw(4, recompute="full", recompute_method="block", recompute_num_layers=1, **base))
        results.append(simulate(sc, mode=mode, detail=detail))
    for result in results:
        assert result.time_breakdown_s["recompute"] == pytest.approx(
            full.time_breakdown_s["recompute"] * v / (LAYERS // pp), rel=1e-9)
        assert result.step_time_s == pytest.approx(results[0].step_time_s, rel=1e-9)
    sc = load_scenario(_raw(4, recompute="full", recompute_method="uniform", recompute_num_layers=2, **base))
    assert [m.activations_bytes for m in stage_memories(sc)] == pytest.approx(
        [rank_memory(sc, s).activations_bytes for s in range(pp)], rel=1e-12)


def test_uniform_one_and_block_all_are_full():
    full = simulate(_sc(recompute="full")).to_dict()
    for method, n in (("uniform", 1), ("block", LAYERS)):
        got = simulate(_partial(method, n)).to_dict()
        got["parallelism"] = {k: v for k, v in got["parallelism"].items()
                              if k not in ("recompute_method", "recompute_num_layers")}
        assert got == full


def test_unset_fields_are_left_out_of_dumps():
    dump = Parallelism().model_dump()
    assert "recompute_method" not in dump and "recompute_num_layers" not in dump
    assert Parallelism().recompute_mode == "none"
    par = Parallelism(recompute="full", recompute_method="block", recompute_num_layers=2)
    assert par.model_dump()["recompute_method"] == "block" and par.recompute_mode == "full:block:2"


@pytest.mark.parametrize(("par", "field"), [
    (dict(recompute="selective", recompute_method="block", recompute_num_layers=1), "parallelism.recompute_method"),
    (dict(recompute="full", recompute_num_layers=1), "parallelism.recompute_num_layers"),
    (dict(recompute="full", recompute_method="block"), "parallelism.recompute_num_layers"),
    (dict(recompute="full", recompute_method="block", recompute_num_layers=LAYERS + 1),
     "parallelism.recompute_num_layers"),
    (dict(recompute="full", recompute_method="uniform", recompute_num_layers=3), "parallelism.recompute_num_layers"),
    (dict(recompute="full", recompute_method="block", recompute_num_layers=1, pp=2, pp_split="balanced",
          global_batch_size=2), "parallelism.recompute_method"),
])
def test_bad_values_refused_naming_the_field(par, field):
    num_gpus = par.get("pp", 1)
    with pytest.raises(ConfigError) as err:
        _sc(num_gpus, **par)
    assert err.value.field == field


def test_chunk_limits_per_virtual_stage():
    # 8 layers over pp 2 x v 2: chunks of 2 layers; block 3 exceeds them, uniform 2 divides them
    base = dict(pp=2, dp=1, virtual_stages=2, schedule="interleaved", global_batch_size=4)
    with pytest.raises(ConfigError) as err:
        load_scenario(_raw(2, recompute="full", recompute_method="block", recompute_num_layers=3, **base))
    assert err.value.field == "parallelism.recompute_num_layers"
    load_scenario(_raw(2, recompute="full", recompute_method="uniform", recompute_num_layers=2, **base))


def test_cli_exit_2_one_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_raw(recompute="none", recompute_method="block", recompute_num_layers=1)))
    run = subprocess.run([sys.executable, "-m", "simulator", "simulate", str(path)], capture_output=True, text=True)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "parallelism.recompute_method" in lines[0]


def test_search_keeps_it_for_full_only():
    base = {"recompute": "full", "recompute_method": "block", "recompute_num_layers": 2}
    assert _modules_for(base, "full") == {}
    assert _modules_for(base, "none") == {"recompute_method": None, "recompute_num_layers": None}
    assert _modules_for({"recompute": "none"}, "full") == {}
