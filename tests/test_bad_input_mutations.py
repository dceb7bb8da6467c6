"""A property of ``clustersim simulate`` over bad input: one field of an example scenario changed to a wrong type, a
negative number, zero, an unknown name, an empty value or null is either run (exit 0: the change was valid) or
refused in one line (exit 2) that names the field (a wrong type, name or empty value; see VALUE_MUTATIONS), never a
traceback; a number's field given a string, list or mapping is always refused.

tests/test_bad_input.py runs 100+ hand-written bad inputs through every command; this draws its cases (hypothesis)
from the examples' own fields, so a field that no hand-written case touches is met too. Cheap by design: a few
small examples, in-process (``simulator.cli.main``, as the ``clustersim`` script calls it), few examples each.
An exception out of ``main`` is what the user would see as a traceback (the CLI turns only ConfigError into a line).
"""

from __future__ import annotations

import contextlib
import copy
import io
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES_DIR = ROOT / "examples"
# examples of every kind, each simulating in well under 0.2 CPU-s (the swarm and co-located ones ~0.3-0.6): spmd
# transformers (dense, MoE, FP8), a CNN data parallel, DAPPLE's pipeline, DiLoCo over a WAN, mixed accelerators,
# stragglers, SWARM, a co-located background job, per-layer splits, local learning, a parameter server, MGRIT,
# subnetwork DP, a measured per-layer profile, an asynchronous pipeline and a traced PyTorch module (TRACED). The
# swarm example was left out until its model sizes had bounds: 10**30 layers ran for ever (test_bad_input_huge.py)
EXAMPLES = ["resnet50-8xa100.yaml", "gpt-1.7b-cyclic-dp-a100.yaml", "vgg16-dapple-v100.yaml",
            "gpt-1.7b-diloco-two-continents.yaml", "mixed-a100-t4.yaml", "mixtral-8x7b-ep8-h100.yaml",
            "llama3-8b-torchtitan-fp8-mi300x.yaml", "stragglers-dp-a100.yaml", "swarm-t4-preemptible.yaml",
            "vgg16-with-background-8xa100.yaml", "vgg16-per-layer-8xa100.yaml", "gpt-1.7b-local-learning-a100.yaml",
            "gpt3-xl-parameter-server-v100.yaml", "resnet50-layer-parallel-mgrit-a100.yaml",
            "resnet50-subnetwork-dp-a100.yaml", "vgg16-deeppool-profile-8xa100.yaml", "gpt-1.7b-pipedream-a100.yaml",
            "traced"]
#: A PyTorch module traced by torch.fx (tests/torch_nets.py, a small ResNet), as a scenario names one; its
#: ``kwargs`` are the user's own constructor arguments and are not mutated (a constructor looping 10**30 times is
#: the user's code, not the simulator's: left out on purpose).
TRACED = {"name": "traced", "model": {"torch": "torch_nets:ResNet", "input_shape": [3, 64, 64],
                                      "kwargs": {"blocks": [1, 1, 1, 1], "width_per_group": 16}},
          "cluster": {"node": "dgx-a100-80g", "num_gpus": 8},
          "parallelism": {"dp": 8, "micro_batch_size": 4, "global_batch_size": 32}}
#: Draws per example: ~0.1-0.6 CPU-s each; the whole file stays within ~60 CPU-s on CI's 2 cores.
DRAWS = 5
MUTATIONS = {"wrong type": "abc", "negative": -1, "zero": 0, "unknown name": "no-such-name", "empty": "",
             "null": None, "empty list": [], "empty mapping": {}, "true": True, "huge": 10**30}


#: Well-formed numbers: a refusal may come from a check between fields (a swarm's step made so long that its
#: preemption draw is refused as strategy.preemptions_per_hour), which names the other field; one line, exit 2, is
#: required of them, not the name.
VALUE_MUTATIONS = ("negative", "zero", "huge")


def _absolute(raw):
    """``raw`` with each file it names relative to examples/ (a profile, a co-located job) made absolute: the
    mutated copy is written elsewhere."""
    if isinstance(raw, dict):
        return {k: _absolute(v) for k, v in raw.items()}
    if isinstance(raw, list):
        return [_absolute(v) for v in raw]
    if isinstance(raw, str) and "/" in raw and (EXAMPLES_DIR / raw).is_file():
        return str((EXAMPLES_DIR / raw).resolve())
    return raw


def _raw(name: str) -> dict:
    if name == "traced":
        return copy.deepcopy(TRACED)
    return _absolute(yaml.safe_load((EXAMPLES_DIR / name).read_text()))


def _fields(raw, path=()):
    """Every mapping key's dotted path in ``raw`` (list items by index, the first two of a list)."""
    items = raw.items() if isinstance(raw, dict) else enumerate(raw[:2]) if isinstance(raw, list) else ()
    for key, value in items:
        if path == ("model",) and key == "kwargs":
            continue  # a traced module's constructor arguments: see TRACED
        yield (*path, key), value
        yield from _fields(value, (*path, key))


FIELDS = {name: list(_fields(_raw(name))) for name in EXAMPLES}


def _simulate(raw: dict, tmp: Path) -> tuple[int, str]:
    path = tmp / "scenario.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["simulate", str(path)])  # an exception here is a traceback to the user: the test fails with it
    return code, err.getvalue()


def _needs(name: str) -> None:
    if name == "traced":
        pytest.importorskip("torch")


@st.composite
def mutated(draw, name):
    path, old = draw(st.sampled_from(FIELDS[name]))
    how = draw(st.sampled_from(sorted(MUTATIONS)))
    return path, old, how


@pytest.mark.parametrize("name", EXAMPLES)
@settings(max_examples=DRAWS, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_one_field_changed_is_run_or_refused_in_one_line_naming_it(tmp_path, name, data):
    _needs(name)
    path, old, how = data.draw(mutated(name))
    raw = _raw(name)
    target = raw
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = copy.deepcopy(MUTATIONS[how])
    code, err = _simulate(raw, tmp_path)
    where = f"{name}: {'.'.join(map(str, path))} {old!r} -> {MUTATIONS[how]!r} ({how})"
    assert "Traceback" not in err, where
    assert code in (0, 2), (where, code, err[-2000:])
    if isinstance(old, int | float) and not isinstance(old, bool) and how in ("wrong type", "unknown name",
                                                                            "empty list", "empty mapping"):
        assert code == 2, (where, "a number's field took a string, list or mapping")
    if code == 2:
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("clustersim: error: "), (where, err)
        if how not in VALUE_MUTATIONS:
            # the field is named, or (a renamed region, stage, ...) the field that still refers to its old value
            named = next(str(p) for p in reversed(path) if not isinstance(p, int))
            assert named in lines[0] or (isinstance(old, str) and repr(old) in lines[0]), (where, lines[0])


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_examples_drawn_from_run_unchanged(tmp_path, name):
    """The control: each example runs as shipped, so every refusal above is the mutation's."""
    _needs(name)
    code, err = _simulate(_raw(name), tmp_path)
    assert code == 0, (name, err[-2000:])


# --- the flags of the other commands -------------------------------------------------------------------------------
DATA = ROOT / "tests" / "data"
TINY = {"model": {"name": "tiny", "num_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 1024,
                  "seq_length": 128},
        "cluster": {"node": "dgx-a100-80g", "num_gpus": 2},
        "parallelism": {"tp": 2, "pp": 1, "dp": 1, "micro_batch_size": 1, "global_batch_size": 2},
        "training": {"precision": "bf16"}}
#: One cheap, valid command line per command (each well under 1 CPU-s in-process), as (positional arguments,
#: [(flag, value), ...]): one flag's value is mutated at a time. Files are written in the test's folder (its cwd).
#: calibrate keeps --from (without it, it measures this machine for minutes).
COMMANDS = {
    "search": ([str(EXAMPLES_DIR / "resnet50-8xa100.yaml"), "--no-cache"],
               [("--gpus", "8"), ("--space", "micro_batch_size=128,256"), ("--space", "tp=1"), ("--space", "pp=1"),
                ("--constraint", "max_memory_gib=70"), ("--top", "3"), ("--top-k", "2"), ("--rank-by", "tokens_per_s"),
                ("--csv", "rows.csv"), ("--workers", "1")]),
    "scale": ([str(EXAMPLES_DIR / "resnet50-8xa100.yaml"), "--fixed", "--json"],
              [("--gpus", "8"), ("--out", "out"), ("--workers", "1"), ("--set", "parallelism.micro_batch_size=128")]),
    "plan": ([str(EXAMPLES_DIR / "vgg16-pase-32x1080ti.yaml"), "--json"],
             [("--planner", "pase"), ("--gpus", "32"), ("--out", "plan.yaml"), ("--set", "training.precision=fp32")]),
    "sweep": (["sweep.yaml", "--no-progress", "--force"], [("--out", "r.csv"), ("--workers", "1")]),
    "compare": (["tiny.yaml", "--json"], [("--trace", str(DATA / "traces" / "gloo_cpu_two_steps.json")),
                                          ("--step", "2"), ("--set", "parallelism.micro_batch_size=1")]),
    "calibrate": (["--json"], [("--from", str(DATA / "harness" / "loop_1347")), ("--out", "p.yaml"),
                               ("--world-size", "2"), ("--intra-node-kind", "shm")]),
}
FLAG_VALUES = ["abc", "-1", "0", "", "1" + "0" * 30, "1e30", "nan", "inf", "true", "1,,2", "a=b", "=", "no-such-name"]


@st.composite
def flag_mutated(draw, command):
    index = draw(st.integers(0, len(COMMANDS[command][1]) - 1))
    return index, draw(st.sampled_from(FLAG_VALUES))


def _cli(args: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(args)
        except SystemExit as exc:  # what the `clustersim` script would exit with
            code = exc.code
    return code, err.getvalue()


def _command_files(folder: Path) -> None:
    (folder / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    (folder / "sweep.yaml").write_text(yaml.safe_dump({"name": "s", "base": str(EXAMPLES_DIR / "gpt-1.7b-cyclic-dp-a100.yaml"),
                                                       "grid": {"parallelism.micro_batch_size": [1, 2]}}))


@pytest.mark.parametrize("command", sorted(COMMANDS))
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_one_flag_value_changed_is_run_or_refused_in_one_line(tmp_path, monkeypatch, command, data):
    monkeypatch.chdir(tmp_path)
    _command_files(tmp_path)
    index, value = data.draw(flag_mutated(command))
    positional, flags = COMMANDS[command]
    args = [command, *positional]
    for i, (flag, given_value) in enumerate(flags):
        args += [flag, value if i == index else given_value]
    code, err = _cli(args)
    where = f"clustersim {' '.join(args)}"
    assert "Traceback" not in err, where
    assert code in (0, 2), (where, code, err[-2000:])
    if code == 2:
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("clustersim: error: "), (where, err)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_the_command_lines_mutated_run_unchanged(tmp_path, monkeypatch, command):
    """The control: each command line runs as written, so every refusal above is the mutated value's."""
    monkeypatch.chdir(tmp_path)
    _command_files(tmp_path)
    positional, flags = COMMANDS[command]
    code, err = _cli([command, *positional, *(x for pair in flags for x in pair)])
    assert code == 0, (command, err[-2000:])
