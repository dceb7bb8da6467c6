"""A newcomer's first commands and notebook calls (session 15): what confused, each with the line it now gets.

- ``clustersim calibrate --from ""`` (an unset shell variable) measured this machine for minutes instead of reading
  a folder; ``--world-size`` of 10**30 went on to start that many processes.
- ``clustersim.simulate(path, set=["parallelism.dp=4"])`` (the command line's ``--set`` lines) said "input: expected
  a list, got ['parallelism.dp=4']", and ``overrides=[...]`` (simulator.scenario.load_scenario's form) "overrides:
  unknown key".
"""

from __future__ import annotations

import contextlib
import io
import time
from pathlib import Path

import pytest

import clustersim
from simulator.cli import main
from simulator.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def _refused(*args: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    start = time.process_time()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    assert time.process_time() - start < 10, "it went on to measure"
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("clustersim: error: "), (code, err.getvalue())
    return lines[0]


@pytest.mark.parametrize("empty", ["", "  "])
def test_calibrate_from_an_empty_path_is_refused_not_measured(tmp_path, monkeypatch, empty):
    monkeypatch.chdir(tmp_path)
    line = _refused("calibrate", "--from", empty)
    assert line.startswith("clustersim: error: --from: empty"), line
    assert not (tmp_path / "clustersim-calibration").exists()


def test_calibrate_world_size_past_the_limit_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = _refused("calibrate", "--world-size", str(10**30))
    assert line.startswith("clustersim: error: --world-size: ") and "limit of 1,024" in line, line


@pytest.mark.parametrize("keyword", ["set", "overrides"])
def test_api_override_lines_say_the_keyword_form(keyword):
    with pytest.raises(ConfigError) as info:
        clustersim.load_scenario(str(ROOT / "examples" / "resnet50-8xa100.yaml"),
                                 **{keyword: ["parallelism.micro_batch_size=128"]})
    assert info.value.field == keyword
    assert "parallelism__micro_batch_size=128 for --set parallelism.micro_batch_size=128" in str(info.value)


def test_api_keyword_overrides_still_apply():
    """The control: the documented form works (and a misspelt field keeps its did-you-mean)."""
    scenario = clustersim.load_scenario(str(ROOT / "examples" / "resnet50-8xa100.yaml"),
                                        parallelism__micro_batch_size=128, parallelism__global_batch_size=1024)
    assert scenario.parallelism.micro_batch_size == 128
    with pytest.raises(ConfigError, match="did you mean 'parallelism'"):
        clustersim.load_scenario(str(ROOT / "examples" / "resnet50-8xa100.yaml"), paralelism__dp=4)


@pytest.mark.parametrize("command", [
    ["search", str(ROOT / "examples" / "resnet50-8xa100.yaml"), "--no-cache", "--workers", "1", "--gpus"],
    ["scale", str(ROOT / "examples" / "resnet50-8xa100.yaml"), "--fixed", "--workers", "1", "--gpus"],
    ["plan", str(ROOT / "examples" / "vgg16-pase-32x1080ti.yaml"), "--planner", "pase", "--gpus"],
    ["plan", str(ROOT / "examples" / "vgg16-dapple-v100.yaml"), "--planner", "dapple", "--gpus"]],
    ids=["search", "scale", "plan-pase", "plan-dapple"])
def test_gpus_past_the_limit_is_refused_not_walked(tmp_path, monkeypatch, command):
    """Found by tests/test_bad_input_mutations.py's flag draws: --gpus 10**30 ran for ever in search (the divisor walk)
    and every planner, and scale raised a numpy TypeError out of log2."""
    monkeypatch.chdir(tmp_path)
    line = _refused(*command, str(10**30))
    assert line.startswith("clustersim: error: --gpus: ") and "limit of 1,000,000" in line, line
