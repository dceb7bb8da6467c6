"""Paper cuts a newcomer meets (the eighth audit's gap list): a scenario given where a sweep file is
expected and the reverse, a measured profile's sample noun, a missing ``model.name`` in an inline
profile, and ``--set FIELD=null`` on an optional field. Each case is the CLI in a subprocess; an
error is exit 2 with one line on stderr and no traceback (tests/test_bad_input.py's contract)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "examples" / "resnet50-8xa100.yaml"
SWEEP = ROOT / "examples" / "sweeps" / "llama3-8b-batch.yaml"
PROFILES = ROOT / "validation" / "data" / "profiles"


def _cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simulator", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def _error(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("clustersim: error: "), done.stderr
    return lines[0]


def test_sweep_given_a_scenario_says_so():
    line = _error(_cli("sweep", SCENARIO, "--no-progress"))
    assert line == (f"clustersim: error: sweep: {SCENARIO} is a scenario, not a sweep file: a sweep file has base: (a "
                    "scenario) and grid: (dotted fields and their values; see examples/sweeps/); run a scenario with "
                    "`clustersim simulate`")


@pytest.mark.parametrize("command", [["simulate"], ["search"], ["plan", "--planner", "pase"]])
def test_scenario_commands_given_a_sweep_file_say_so(command):
    line = _error(_cli(command[0], SWEEP, *command[1:]))
    assert line == (f"clustersim: error: scenario: {SWEEP} is a sweep file (it has base:, grid: and no model: or "
                    f"cluster:), not a scenario: run it with `clustersim sweep {SWEEP}`")


def _profile_scenario(tmp_path: Path, model: dict, node: str = "p3-16xlarge", pp: int = 2, batch: int = 256,
                      micro: int = 64) -> Path:
    doc = {"name": "profiled", "model": model, "cluster": {"node": node, "num_gpus": 8},
           "training": {"precision": "fp16"},
           "parallelism": {"pp": pp, "global_batch_size": batch, "micro_batch_size": micro}}
    path = tmp_path / "profiled.yaml"
    path.write_text(json.dumps(doc))  # JSON is YAML
    return path


@pytest.mark.parametrize(("profile", "batch", "noun"), [
    ("pipedream_gnmt_large_graph.txt", 64, "sentences"),   # EmuBidirLSTM layers
    ("dapple_bert-24-pbs-6.txt", 6, "sequences"),          # embeddings, attention
    ("pipedream_vgg16_graph.txt", 64, "images"),           # convolutions
])
def test_a_profile_says_its_own_sample_noun(tmp_path, profile, batch, noun):
    model = {"name": "profiled", "family": "profile", "format": "pipedream", "profile_batch": batch,
             "path": str(PROFILES / profile)}
    done = _cli("simulate", _profile_scenario(tmp_path, model, batch=batch * 4, micro=batch))
    assert done.returncode == 0, done.stderr
    assert re.search(rf"samples/s +[\d,.]+ \({noun}\)", done.stdout), done.stdout
    model["sample_kind"] = "image"  # the field still says it where given
    done = _cli("simulate", _profile_scenario(tmp_path, model, batch=batch * 4, micro=batch))
    assert re.search(r"samples/s +[\d,.]+ \(images\)", done.stdout), done.stdout


def test_a_profile_without_a_name_is_reported_as_model_name(tmp_path):
    model = {"family": "profile", "format": "pipedream", "profile_batch": 64,
             "path": str(PROFILES / "pipedream_gnmt_large_graph.txt")}
    line = _error(_cli("simulate", _profile_scenario(tmp_path, model)))
    assert line == "clustersim: error: model.name: required field is missing"


@pytest.mark.parametrize("value", ["null", "~", ""])
def test_set_null_unsets_an_optional_field(value):
    # training.framework cannot be null: null unsets it (its default, megatron-core: the catalog constants
    # alone), the figure the ResNet-50 example's header quotes "without training.framework"
    done = _cli("simulate", SCENARIO, "--set", f"training.framework={value}", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    header = SCENARIO.read_text()
    quoted = re.search(r"Without training\.framework\n# \(--set training\.framework=null; the catalog constants alone: "
                       r"no framework profile applies\) it\n# prints ([\d,]+) images/s", header)
    assert quoted, "the example's header no longer quotes the figure without training.framework"
    assert f"{doc['samples_per_s']:,.0f}" == quoted.group(1)


def test_set_null_on_a_nullable_field_sets_null():
    # a field that accepts null (training.seq_length) is set to null, as YAML says; one that does not
    # (parallelism.tp) is unset: its default, 1
    done = _cli("simulate", SCENARIO, "--set", "training.seq_length=null", "--set", "parallelism.tp=~", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["parallelism"]["tp"] == 1
