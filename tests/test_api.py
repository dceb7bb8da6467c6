"""The Python API (``import clustersim``): the README's example runs as written; results as rows."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import clustersim
from simulator.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
MIXTRAL = str(ROOT / "examples" / "mixtral-8x7b-ep8-h100.yaml")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def test_readme_example_runs_as_written():
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    example = next(b for b in blocks if "import clustersim" in b)
    assert len(example.strip().splitlines()) <= 10
    proc = subprocess.run([sys.executable, "-c", example], cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    first, _, last = proc.stdout.strip().splitlines()
    assert first.startswith("SimulationResult('mixtral-8x7b-ep8', 64 GPUs") and "fits=True" in first
    tp, pp, ep, rate = last.split()
    assert (int(tp), int(pp)) in {(2, 1), (2, 2), (4, 1), (4, 2)} and int(ep) >= 1 and float(rate) > 0


def test_import_is_light():
    code = "import sys, clustersim; print(sorted(m for m in ('pandas', 'simpy', 'matplotlib') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert re.fullmatch(r"\d+\.\d+\.\d+.*|0\+unknown", clustersim.__version__)


def test_overrides_as_keywords_and_mappings_agree_with_set():
    from simulator.scenario import load_scenario

    by_set = load_scenario(MIXTRAL, ["parallelism.ep=4", "parallelism.pp=2"])
    by_keyword = clustersim.load_scenario(MIXTRAL, parallelism__ep=4, parallelism__pp=2)
    by_mapping = clustersim.load_scenario(MIXTRAL, parallelism={"ep": 4, "pp": 2})
    assert by_set.parallelism == by_keyword.parallelism == by_mapping.parallelism
    assert by_keyword.parallelism.dp == 32


def test_result_as_one_flat_row_with_units():
    result = clustersim.simulate(MIXTRAL)
    frame = result.to_frame()
    assert frame.shape[0] == 1
    row = frame.iloc[0]
    assert row["step_time_s"] == result.step_time_s
    assert row["layout.ep"] == 8 and row["num_gpus"] == 64
    assert row["memory_gib.weights"] == result.memory_gib["weights"]
    assert row["time_breakdown_s.ep_comm"] == result.time_breakdown_s["ep_comm"]
    assert not any(isinstance(v, dict) for v in result.to_flat_dict().values())
    html = result._repr_html_()
    assert html.startswith("<pre>") and "step time" in html and "&lt;" not in html.split("step time")[0]


def test_bad_input_is_a_config_error_naming_the_field():
    with pytest.raises(ConfigError, match="parallelism.tp"):
        clustersim.simulate(MIXTRAL, parallelism__tp="many")
    with pytest.raises(ConfigError, match="cluster.num_gpus"):
        clustersim.load_scenario(MIXTRAL, cluster__num_gpus=-1)
    with pytest.raises(ConfigError, match="space.tp"):
        clustersim.search(MIXTRAL, space={"tp": "eight"})


def test_sweep_returns_its_rows(tmp_path):
    sweep = {"base": MIXTRAL, "grid": {"parallelism.ep": [4, 8]}, "set": ["parallelism.pp=2"]}
    frame = clustersim.sweep(sweep, tmp_path / "out.csv", workers=1)
    assert sorted(frame["layout.ep"]) == [4, 8]
    assert (tmp_path / "out.csv").is_file()
