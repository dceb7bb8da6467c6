"""A measured per-layer profile's ``model.path`` is read from the scenario file's folder (as the scenario's
other file references are), so a scenario and its profile can travel together and run from anywhere;
where that folder holds no such file the path is the current directory's, as written."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from simulator.errors import ConfigError
from simulator.explore.sweep import absolutize
from simulator.scenario import load_raw, load_scenario

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "validation" / "data" / "profiles" / "deeppool_vggLayerGpuProfileA100.txt"
EXAMPLE = ROOT / "examples" / "vgg16-deeppool-profile-8xa100.yaml"


def _scenario(path: str) -> dict:
    return {"model": {"family": "profile", "name": "vgg", "format": "deeppool", "path": path},
            "cluster": {"node": "dgx-a100-40g", "num_gpus": 1},
            "parallelism": {"micro_batch_size": 32, "global_batch_size": 32},
            "training": {"precision": "fp32", "tf32": True}}


def _write(folder: Path, raw: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "scenario.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _measured_s(scenario) -> float:
    graph = scenario.layer_graph()
    return sum(layer.measured_forward_s + layer.measured_backward_s for layer in graph.layers
               if layer.measured_forward_s is not None)


def test_the_example_runs_from_another_folder(tmp_path, monkeypatch):
    """examples/vgg16-deeppool-profile-8xa100.yaml names its profile as ../validation/data/profiles/...:
    from any current directory it reads the shipped file, whose batch-32 block sums to 54.964 ms."""
    monkeypatch.chdir(tmp_path)
    scenario = load_scenario(EXAMPLE)
    assert Path(scenario.model.path) == PROFILE.resolve()
    assert 1e3 * _measured_s(scenario) == pytest.approx(54.964, abs=0.01)


def test_a_profile_beside_its_scenario_is_found_from_anywhere(tmp_path, monkeypatch):
    folder = tmp_path / "job"
    folder.mkdir()
    shutil.copy(PROFILE, folder / "vgg.txt")
    scenario_file = _write(folder, _scenario("vgg.txt"))
    monkeypatch.chdir(tmp_path)
    assert Path(load_scenario(scenario_file).model.path) == (folder / "vgg.txt").resolve()


def test_a_path_not_beside_the_scenario_stays_the_current_directorys(tmp_path, monkeypatch):
    """A path that names no file in the scenario's folder is read as written (a --set on the command line)."""
    shutil.copy(PROFILE, tmp_path / "vgg.txt")
    scenario_file = _write(tmp_path / "elsewhere", _scenario("vgg.txt"))
    monkeypatch.chdir(tmp_path)
    scenario = load_scenario(scenario_file)
    assert scenario.model.path == "vgg.txt"
    assert _measured_s(scenario) > 0


def test_an_inline_mapping_has_no_folder_and_keeps_its_path(tmp_path, monkeypatch):
    shutil.copy(PROFILE, tmp_path / "vgg.txt")
    monkeypatch.chdir(tmp_path)
    assert load_scenario(_scenario("vgg.txt")).model.path == "vgg.txt"


def test_a_missing_profile_names_the_field_and_where_it_was_looked_for(tmp_path):
    with pytest.raises(ConfigError, match="scenario file's folder, else from the current directory") as err:
        load_scenario(_write(tmp_path, _scenario("missing.txt"))).layer_graph()
    assert err.value.field == "model.path"


def test_search_sweep_and_plan_workers_get_the_absolute_path(tmp_path):
    """The explore commands hand workers a mapping with absolute file references (absolutize)."""
    shutil.copy(PROFILE, tmp_path / "vgg.txt")
    raw, base = load_raw(_write(tmp_path, _scenario("vgg.txt")))
    assert absolutize(raw, base)["model"]["path"] == str((tmp_path / "vgg.txt").resolve())
    assert raw["model"]["path"] == "vgg.txt"  # the mapping read is left as written


def test_the_cli_runs_the_example_from_another_folder(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
    out = subprocess.run([sys.executable, "-m", "simulator", "simulate", str(EXAMPLE), "--json"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr[-2000:]
    assert '"samples_per_s"' in out.stdout
