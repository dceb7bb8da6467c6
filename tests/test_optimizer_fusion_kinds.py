"""Optimizer fusion (``training.optimizer_fusion``, Jiang et al. 2021) on the strategy kinds other than
spmd: each kind either models a mode (the update of each parameter group right after its last
gradient, "backward", or just before its next forward, "forward"; the gradients freed at the
update) or refuses it with one error naming the field and the kind; none ignores it.

Toy GPT of tests/test_simulate.py: 4 layers of 789,760 parameters, embedding 67,584, final norm +
head 2,560 (3,229,184 in all), bf16 gradients (2 B); a layer's forward takes T = T_LAYER, its backward
2T; the optimizer streams at 1e21 B/s (~1e-13 s), so fusion moves no time here.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from simulator.errors import ConfigError
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.strategies.registry import get_kind, load_kinds

sys.path.insert(0, str(Path(__file__).parent))
from test_simulate import T_LAYER, TOY_PARAMS, toy_raw  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
P_LAYER, P_EMBED, P_HEAD = 789_760, 67_584, 2_560
GIB = 2**30


#: With ``slow_optimizer``: the optimizer streams at 1e12 GB/s x 2.8e-11 = 2.8e10 B/s, Adam (bf16 weights)
#: touching 28 B per parameter: U = params x 28 / 2.8e10 = params x 1e-9 s.
OPTIMIZER_EFFICIENCY = 2.8e-11


def _update_s(params: int) -> float:
    return params * 1e-9


def _raw(kind: dict | None, num_gpus: int, fusion: str, steps: int = 1, slow_optimizer: bool = False, **par) -> dict:
    raw = toy_raw(num_gpus, **par)
    if slow_optimizer:
        raw["cluster"]["node"]["accelerator"]["efficiency"]["optimizer_efficiency"] = OPTIMIZER_EFFICIENCY
    if kind is not None:
        raw["strategy"] = dict(kind)
    raw["training"]["optimizer_fusion"] = fusion
    raw["simulation"] = {"steps": steps}
    return raw


def _run(kind, num_gpus, fusion, steps=1, slow_optimizer=False, **par):
    return simulate(load_scenario(_raw(kind, num_gpus, fusion, steps, slow_optimizer, **par)))


def _peak_bytes(result, actor: str) -> float:
    return result.simulated_peak_memory_gib[actor] * GIB


PIPEDREAM = {"kind": "async_pipeline", "variant": "pipedream"}
CYCLIC = {"kind": "cyclic_dp"}


@pytest.mark.parametrize("fusion", ["none", "backward", "forward"])
def test_pipedream_step_time_is_unchanged_by_fusion(fusion):
    # pp 2 of 2 layers (3T + 3T per micro-batch on each stage), m = 4, no flush: 4 x 6T = 24T (tests/
    # test_async_pipeline.py). The update per micro-batch stays where it was in time: after the
    # backward ("backward": its kernels right after the gradient), or before the next forward, which
    # 1F1B runs right after that backward in steady state ("forward").
    r = _run(PIPEDREAM, 2, fusion, pp=2, global_batch_size=4)
    assert r.step_time_s == pytest.approx(24 * T_LAYER, rel=1e-9)


@pytest.mark.parametrize("fusion", ["none", "backward", "forward"])
def test_pipedream_update_kernels_counted_once_wherever_they_go(fusion):
    # The same pipeline with a visible optimizer: stage 0 (2 layers + embedding, 1,647,104 parameters)
    # runs F 2T, B 4T and its update U0 = 1.647104 ms per micro-batch; stage 1 (1,582,080) is faster.
    # No flush: a step is m = 4 times the slowest stage's 6T + U0, whichever place fusion gives the
    # update (right after the backward, or before the next forward, which 1F1B runs next).
    r = _run(PIPEDREAM, 2, fusion, slow_optimizer=True, pp=2, global_batch_size=4)
    assert r.step_time_s == pytest.approx(4 * (6 * T_LAYER + _update_s(2 * P_LAYER + P_EMBED)), rel=1e-9)


@pytest.mark.parametrize("fusion", ["none", "backward", "forward"])
def test_cyclic_dp_delayed_update_counted_once_wherever_it_goes(fusion):
    # dp 2, one micro-batch: a step is F + B = 12T plus the update of all 3,229,184 parameters
    # (3.229184 ms), applied after the backward (none), fused into the next backward layer by layer
    # (backward: one task after it here, the same kernels), or before the next forward (forward).
    r = _run(CYCLIC, 2, fusion, steps=2, slow_optimizer=True, dp=2, global_batch_size=2)
    assert r.step_time_s == pytest.approx(12 * T_LAYER + _update_s(TOY_PARAMS), rel=1e-9)


def test_pipedream_step_in_backward_frees_all_but_one_modules_gradients():
    # PipeDream updates after every micro-batch (no accumulation): with step in backward each module's
    # gradients are freed by its update, so a stage holds its largest module's (a layer, 2 x 789,760 B)
    # while a backward runs instead of its whole gradient until the update. Stage 0: 2 layers +
    # embedding -> saves 2 x (789,760 + 67,584) B; stage 1: 2 layers + head -> 2 x (789,760 + 2,560) B.
    none = _run(PIPEDREAM, 2, "none", pp=2, global_batch_size=4)
    fused = _run(PIPEDREAM, 2, "backward", pp=2, global_batch_size=4)
    assert _peak_bytes(none, "stage0") - _peak_bytes(fused, "stage0") == pytest.approx(2 * (P_LAYER + P_EMBED))
    assert _peak_bytes(none, "stage1") - _peak_bytes(fused, "stage1") == pytest.approx(2 * (P_LAYER + P_HEAD))
    assert max(fused.simulated_peak_memory_gib.values()) == pytest.approx(fused.peak_memory_gib, rel=1e-12)
    assert fused.memory_per_stage_gib == pytest.approx(list(fused.simulated_peak_memory_gib.values()), rel=1e-12)


def test_2bw_accumulates_so_step_in_backward_saves_nothing():
    # 2BW accumulates the step's 4 micro-batches' gradients before its one update: they must outlive
    # every backward (as the spmd kind with gradient accumulation).
    none = _run({"kind": "async_pipeline", "variant": "2bw"}, 2, "none", pp=2, global_batch_size=4)
    fused = _run({"kind": "async_pipeline", "variant": "2bw"}, 2, "backward", pp=2, global_batch_size=4)
    assert fused.simulated_peak_memory_gib == pytest.approx(none.simulated_peak_memory_gib, rel=1e-12)
    assert fused.step_time_s == pytest.approx(none.step_time_s, rel=1e-9)


def test_pipedream_forward_fusion_issues_each_update_before_the_next_forward():
    scenario = load_scenario(_raw(PIPEDREAM, 2, "forward", pp=2, global_batch_size=4))
    plan = get_kind("async_pipeline").compile(scenario)
    for actor in ("stage0", "stage1"):
        names = [t.name for t in plan.compute_tasks[actor]]
        updates = [i for i, name in enumerate(names) if name.startswith("optimizer.")]
        assert len(updates) == 8  # n = p + m + p = 8 micro-batches, one update each
        # each update sits right before a forward, or in the run's tail where no forward follows
        last_forward = max(i for i, name in enumerate(names) if name.startswith("F."))
        for i in updates:
            assert names[i + 1].startswith(("F.", "optimizer.")) if i + 1 < len(names) else True
            assert i < last_forward or all(n.startswith(("B.", "optimizer.")) for n in names[last_forward + 1:])
        # the drain's backwards run back to back (stage 0: B6, B7); their updates wait for the end
        tail = 2 if actor == "stage0" else 1
        assert all(n.startswith("optimizer.") for n in names[-tail:]) and names[-tail - 1] == "B.mb7"
    plan = get_kind("async_pipeline").compile(load_scenario(_raw(PIPEDREAM, 2, "none", pp=2, global_batch_size=4)))
    names = [t.name for t in plan.compute_tasks["stage0"]]
    assert all(names[i - 1].startswith("B.") for i, n in enumerate(names) if n.startswith("optimizer."))



def test_cyclic_dp_step_in_backward_keeps_one_buffer_and_one_module():
    # dp 2, one micro-batch (F + B = 3 x 4T = 12T per step; the all-reduce hides behind the next step).
    # Cyclic DP holds two gradient buffers (step t's, reduced during t + 1, and t + 1's); with step in
    # backward step t's gradient is applied layer by layer in step t + 1's backward, each layer's old
    # gradient freed as its new one is made: one buffer and one module (a layer) instead of two buffers,
    # a saving of 2 x (3,229,184 - 789,760) B.
    none = _run(CYCLIC, 2, "none", steps=2, dp=2, global_batch_size=2)
    fused = _run(CYCLIC, 2, "backward", steps=2, dp=2, global_batch_size=2)
    assert none.step_time_s == pytest.approx(12 * T_LAYER, rel=1e-9)
    assert fused.step_time_s == pytest.approx(12 * T_LAYER, rel=1e-9)
    assert _peak_bytes(none, "stage0") - _peak_bytes(fused, "stage0") == pytest.approx(2 * (TOY_PARAMS - P_LAYER))
    assert fused.peak_memory_gib == pytest.approx(fused.simulated_peak_memory_gib["stage0"], rel=1e-12)
    forward = _run(CYCLIC, 2, "forward", steps=2, dp=2, global_batch_size=2)
    assert forward.step_time_s == pytest.approx(12 * T_LAYER, rel=1e-9)
    assert forward.simulated_peak_memory_gib == pytest.approx(none.simulated_peak_memory_gib, rel=1e-12)


def _memory_at(series: list[tuple[float, float]], t: float) -> float:
    return [b for time, b in series if time <= t + 1e-9][-1]  # the value just after t (to float rounding)


def test_cyclic_dp_memory_over_time_shows_the_old_buffer_freed_in_the_backward():
    # The memory-over-time series (the engine's counter) with a visible optimizer, times identical in
    # both modes. After step 1's backward the separate update still holds step 0's buffer beside
    # step 1's (two buffers) until the update ends; with step in backward it was freed during the
    # backward: one buffer, 2 x 3,229,184 B less, and never more than it at any moment.
    runs = {f: _run(CYCLIC, 2, f, steps=2, slow_optimizer=True, dp=2, global_batch_size=2)
            for f in ("none", "backward")}
    none, fused = (runs[f].memory_series_bytes["stage0"] for f in ("none", "backward"))
    end_of_backward = 2 * 12 * T_LAYER + _update_s(TOY_PARAMS)  # step 0 (12T + U), step 1's F + B (12T)
    assert _memory_at(none, end_of_backward) - _memory_at(fused, end_of_backward) == pytest.approx(2 * TOY_PARAMS)
    for t, _ in none:
        assert _memory_at(fused, t) <= _memory_at(none, t) + 1e-6
    # the separate update frees that buffer when it ends (and the next forward saves one micro-batch's)
    after_update = end_of_backward + _update_s(TOY_PARAMS)
    assert _memory_at(none, after_update) == pytest.approx(_memory_at(fused, after_update))


def test_local_sgd_forward_fusion_lands_the_inner_update_before_the_delta():
    # dp 2, H = 2, 4 inner steps: step 0's update is applied before step 1's forward; step 1 ends a
    # period, so its own update runs before the delta against the anchor is taken (not in step 2).
    scenario = load_scenario(_raw({"kind": "local_sgd", "local_steps": 2}, 2, "forward", steps=4,
                                  dp=2, global_batch_size=2))
    plan = get_kind("local_sgd").compile(scenario)
    names = [t.name for t in plan.streams[("stage0", "compute")]]
    first_forward = next(i for i, n in enumerate(names) if n.startswith("s1.F."))
    assert names[first_forward - 1] == "s1.optimizer_step.c0"  # step 0's update
    delta = names.index("s1.outer_delta.p0")
    assert names[delta - 1] == "s1.optimizer_step.c0" and names.count("s1.optimizer_step.c0") == 2
    assert not any(n.startswith("s0.optimizer") for n in names)


def test_local_sgd_step_in_backward_saves_all_but_one_layers_gradients():
    none = _run({"kind": "local_sgd", "local_steps": 2}, 2, "none", steps=2, dp=2, global_batch_size=2)
    fused = _run({"kind": "local_sgd", "local_steps": 2}, 2, "backward", steps=2, dp=2, global_batch_size=2)
    assert (none.peak_memory_gib - fused.peak_memory_gib) * GIB == pytest.approx(2 * (TOY_PARAMS - P_LAYER))
    assert _peak_bytes(fused, "stage0") == pytest.approx(fused.peak_memory_gib * GIB, rel=1e-12)
    assert fused.step_time_s == pytest.approx(none.step_time_s, rel=1e-9)


def test_local_learning_step_in_backward_frees_the_group_gradients():
    # pp 2, one micro-batch: the last group (2 layers + head, no auxiliary head) holds one layer's
    # gradients while its backward runs instead of its whole gradient: 2 x (789,760 + 2,560) B less.
    kind = {"kind": "local_learning"}
    none = _run(kind, 2, "none", pp=2, global_batch_size=1)
    fused = _run(kind, 2, "backward", pp=2, global_batch_size=1)
    assert _peak_bytes(none, "stage1") - _peak_bytes(fused, "stage1") == pytest.approx(2 * (P_LAYER + P_HEAD))
    assert _peak_bytes(fused, "stage0") < _peak_bytes(none, "stage0")
    assert fused.memory_per_stage_gib == pytest.approx(list(fused.simulated_peak_memory_gib.values()), rel=1e-12)
    assert fused.step_time_s == pytest.approx(none.step_time_s, rel=1e-9)


# -- every registered kind ---------------------------------------------------------------------------

#: A toy layout per kind that models fusion (one micro-batch per update, so step in backward saves).
TOY_LAYOUTS = {
    "spmd": (None, 1, dict()),
    "local_sgd": ({"kind": "local_sgd", "local_steps": 2}, 2, dict(dp=2, global_batch_size=2)),
    "async_pipeline": (PIPEDREAM, 2, dict(pp=2, global_batch_size=4)),
    "local_learning": ({"kind": "local_learning"}, 2, dict(pp=2, global_batch_size=1)),
    "cyclic_dp": (CYCLIC, 2, dict(dp=2, global_batch_size=2)),
}


def _example_of(kind: str) -> dict:
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        if isinstance(doc, dict) and (doc.get("strategy") or {}).get("kind") == kind:
            return doc
    pytest.fail(f"no example of kind {kind}")


@pytest.mark.parametrize("kind", sorted(load_kinds()))
@pytest.mark.parametrize("fusion", ["backward", "forward"])
def test_every_kind_models_fusion_or_refuses_it(kind, fusion):
    modes = load_kinds()[kind].optimizer_fusion
    if fusion not in modes:  # refused at load, naming the field and the kind
        doc = copy.deepcopy(_example_of(kind))
        doc.setdefault("training", {})["optimizer_fusion"] = fusion
        with pytest.raises(ConfigError, match=rf"training\.optimizer_fusion.*{kind}"):
            load_scenario(doc)
        return
    assert kind in TOY_LAYOUTS, f"{kind} models optimizer fusion: give it a toy layout here"
    strategy, gpus, par = TOY_LAYOUTS[kind]
    none, fused = _run(strategy, gpus, "none", steps=2, **par), _run(strategy, gpus, fusion, steps=2, **par)
    analytic_none = get_kind(kind).memory(load_scenario(_raw(strategy, gpus, "none", 2, **par)))[1]
    # the simulated peak is the kind's analytic one in both
    for r in (none, fused):
        assert max(r.simulated_peak_memory_gib.values()) == pytest.approx(r.peak_memory_gib, rel=1e-12)
    fall_bytes = (none.peak_memory_gib - fused.peak_memory_gib) * GIB
    if fusion == "backward":  # gradients freed early: the peak falls, by at most the gradient bytes
        assert 0 < fall_bytes <= analytic_none.gradients_bytes
    else:  # gradients live until the next forward: nothing freed earlier
        assert fall_bytes == pytest.approx(0.0, abs=1e-6)
    optimizer_s = 1e-9  # the toy's optimizer kernels (~1e-13 s each): not worse beyond them
    assert fused.step_time_s <= none.step_time_s + optimizer_s


def test_every_kind_lists_only_known_modes():
    for kind in load_kinds().values():
        assert set(kind.optimizer_fusion) <= {"backward", "forward"}, kind.name


# -- CLI end to end ----------------------------------------------------------------------------------

def _cli(tmp_path, raw) -> subprocess.CompletedProcess:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(raw))
    return subprocess.run([sys.executable, "-m", "simulator.cli", "simulate", str(path), "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_cli_step_in_backward_on_pipedream(tmp_path):
    runs = {}
    for fusion in ("none", "backward"):
        done = _cli(tmp_path, _raw(PIPEDREAM, 2, fusion, pp=2, global_batch_size=4))
        assert done.returncode == 0, done.stderr
        runs[fusion] = json.loads(done.stdout)
    fall = (runs["none"]["peak_memory_gib"] - runs["backward"]["peak_memory_gib"]) * GIB
    assert fall == pytest.approx(2 * (P_LAYER + P_EMBED), rel=1e-9)
    assert runs["backward"]["step_time_s"] == pytest.approx(24 * T_LAYER, rel=1e-9)


def test_cli_refuses_fusion_on_the_parameter_server(tmp_path):
    done = _cli(tmp_path, _raw({"kind": "parameter_server"}, 2, "backward", dp=2, global_batch_size=2))
    assert done.returncode == 2
    assert "training.optimizer_fusion" in done.stderr and "parameter_server" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "kinds that model it: spmd, local_sgd" in done.stderr  # where to go instead


def test_the_field_description_names_the_kinds_that_model_it():
    from simulator.scenario import TrainingSpec

    description = TrainingSpec.model_fields["optimizer_fusion"].description
    modelled = [name for name, kind in load_kinds().items() if kind.optimizer_fusion]
    assert all(name in description for name in modelled), modelled
