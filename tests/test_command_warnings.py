"""The WARNINGs and NOTEs ``clustersim simulate`` prints are said by every command that reports simulated
figures of a scenario -- search, sweep, scale, plan -- once per distinct message, not once per layout or point,
and carried in each command's ``--json`` / CSV output (simulator/report/messages.py). Before, only simulate
printed them: a search over a run that names no ``training.framework`` ranked layouts priced on the catalog
constants without a word. Run as the user runs them (subprocess, on-disk cache off)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
TORCHTITAN_H100 = ROOT / "examples" / "llama3-8b-torchtitan-sac-h100.yaml"
RESNET_A100 = ROOT / "examples" / "resnet50-8xa100.yaml"
UNNAMED = "no training.framework named: priced as megatron-core"
WARNING = f"WARNING: {UNNAMED}"
UNSET = ("--set", "training.framework=null")
SMALL = ("--space", "tp=1", "--space", "pp=1")  # 36 layouts of ResNet-50 on 8 A100s, 20 simulated


def _cli(*args: str, code: int = 0) -> subprocess.CompletedProcess:
    env = {**os.environ, "CLUSTERSIM_CACHE": "0"}
    out = subprocess.run([sys.executable, "-m", "simulator", *args], capture_output=True, text=True, cwd=ROOT,
                         timeout=600, env=env)
    assert out.returncode == code, out.stderr[-2000:]
    return out


def _said(out: subprocess.CompletedProcess) -> str:
    return out.stdout + out.stderr


def test_search_says_the_no_framework_warning_once_and_lists_it_per_row(tmp_path):
    table = _cli("search", str(RESNET_A100), *UNSET, *SMALL, "--top", "3")
    assert _said(table).count(WARNING) == 1
    assert table.stdout.count(WARNING) == 1  # under the table, as simulate prints it
    simulated = _cli("simulate", str(RESNET_A100), *UNSET, "--json")
    (expected,) = [w for w in json.loads(simulated.stdout)["warnings"] if w.startswith(UNNAMED)]
    first, *rest = expected.split("\n")  # one line per framework, indented under the WARNING
    assert "\n".join([f"  WARNING: {first}", *(f"      {line}" for line in rest)]) in table.stdout  # simulate's text

    out = _cli("search", str(RESNET_A100), *UNSET, *SMALL, "--json", "--csv", str(tmp_path / "s.csv"))
    assert out.stderr.count(WARNING) == 1 and WARNING not in out.stdout  # stdout: the JSON list alone
    rows = json.loads(out.stdout)
    timed = [r for r in rows if r.get("step_time_s")]
    assert len(timed) > 1 and all(expected in r["warnings"] for r in timed)
    with open(tmp_path / "s.csv") as fh:
        cells = [r["warnings"] for r in csv.DictReader(fh) if r["step_time_s"]]
    assert len(cells) == len(timed) and all(expected in json.loads(c) for c in cells)


def test_search_with_a_framework_named_says_nothing_of_it():
    out = _cli("search", str(RESNET_A100), *SMALL, "--json")  # the example names dle-pytorch
    assert UNNAMED not in _said(out)
    assert all(r["warnings"] == [] for r in json.loads(out.stdout) if r.get("step_time_s"))


def test_search_says_a_note_once():
    """A NOTE (here: an MoE-only field on a dense model) is said once for the whole search too."""
    out = _cli("search", str(RESNET_A100), *SMALL, "--set", "parallelism.moe_dispatch=deepep", "--top", "3")
    assert out.stdout.count("NOTE: parallelism.moe_dispatch acts only on a mixture-of-experts model") == 1


def test_search_does_not_note_the_moe_fields_it_fills_in():
    """search and scale write every field of the scenario's parallelism into each layout (etp, moe_dispatch ...
    at their defaults): that is not the user setting MoE-only fields on a dense model."""
    out = _cli("search", str(RESNET_A100), *SMALL, "--json")
    assert "NOTE" not in out.stderr
    assert all(r["notes"] == [] for r in json.loads(out.stdout) if r.get("step_time_s"))


@pytest.mark.parametrize("named", [False, True])
def test_sweep_says_the_warning_once_and_writes_it_per_point(tmp_path, named):
    sweep = {"name": "warn", "base": str(RESNET_A100), "set": [] if named else ["training.framework=null"],
             "grid": {"parallelism.micro_batch_size": [64, 128, 256]}}
    path = tmp_path / "warn.yaml"
    path.write_text(yaml.safe_dump(sweep))
    out = _cli("sweep", str(path), "--out", str(tmp_path / "warn.csv"), "--no-progress", "--workers", "1")
    with open(tmp_path / "warn.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 3 and all(r["status"] == "ok" for r in rows)
    if named:
        assert UNNAMED not in _said(out)
        assert all(json.loads(r["warnings"]) == [] for r in rows)
    else:
        assert _said(out).count(WARNING) == 1
        assert all(any(w.startswith(UNNAMED) for w in json.loads(r["warnings"])) for r in rows)
    # a resumed sweep, every point already done, still says what the file's points carry
    again = _cli("sweep", str(path), "--out", str(tmp_path / "warn.csv"), "--resume", "--no-progress")
    assert _said(again).count(WARNING) == (0 if named else 1)


@pytest.mark.parametrize("fixed", [True, False])
def test_scale_says_the_warning_once(tmp_path, fixed):
    layout = ("--fixed",) if fixed else SMALL
    out = _cli("scale", str(RESNET_A100), *UNSET, "--gpus", "8,16", *layout, "--out", str(tmp_path / "a"))
    assert out.stdout.count(WARNING) == 1
    out = _cli("scale", str(RESNET_A100), *UNSET, "--gpus", "8,16", *layout, "--json", "--out", str(tmp_path / "b"))
    assert out.stderr.count(WARNING) == 1 and WARNING not in out.stdout
    rows = json.loads(out.stdout)
    assert any(w.startswith(UNNAMED) for w in rows[0]["warnings"])
    with open(tmp_path / "b" / "scaling.csv") as fh:
        first = next(csv.DictReader(fh))
    assert any(w.startswith(UNNAMED) for w in json.loads(first["warnings"]))
    named = _cli("scale", str(RESNET_A100), "--gpus", "8,16", *layout, "--out", str(tmp_path / "c"))
    assert UNNAMED not in _said(named)


def test_plan_says_the_warning_once():
    out = _cli("plan", str(TORCHTITAN_H100), "--planner", "dapple", *UNSET)
    assert out.stderr.count(WARNING) == 1 and UNNAMED not in out.stdout  # stdout: the plan's YAML alone
    yaml.safe_load(out.stdout)
    doc = json.loads(_cli("plan", str(TORCHTITAN_H100), "--planner", "dapple", *UNSET, "--json").stdout)
    assert sum(w.startswith(UNNAMED) for w in doc["warnings"]) == 1
    named = _cli("plan", str(TORCHTITAN_H100), "--planner", "dapple", "--json")
    assert UNNAMED not in _said(named) and json.loads(named.stdout)["warnings"] == []


@pytest.mark.parametrize("command", [
    ("search", str(RESNET_A100), "--set", "training.framework=bogus"),
    ("scale", str(RESNET_A100), "--gpus", "8", "--set", "training.framework=bogus"),
    ("plan", str(TORCHTITAN_H100), "--planner", "dapple", "--set", "training.framework=bogus"),
])
def test_bad_input_is_still_one_error_and_exit_2(tmp_path, command):
    extra = ("--out", str(tmp_path / "out")) if command[0] == "scale" else ()
    out = _cli(*command, *extra, code=2)
    assert "training.framework" in out.stderr and "Traceback" not in out.stderr
