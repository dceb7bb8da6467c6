"""`clustersim plan --help` lists every registered planner with its options, and `clustersim --help`
names the planners: both generated from the planner registry (read from the modules' source)."""

import os
import re
import subprocess
import sys
from pathlib import Path

from simulator.explore.planners import load_planners, planner_help
from simulator.registry_source import literal_call_fields

ROOT = Path(__file__).resolve().parents[1]


def _help(*args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"}
    out = subprocess.run([sys.executable, "-m", "simulator.cli", *args, "--help"], capture_output=True, text=True,
                         env=env, cwd=ROOT, check=True)
    return out.stdout


def test_plan_help_lists_every_planner_and_its_options():
    text = _help("plan")
    planners = load_planners()
    assert set(planners) == {"dapple", "pase", "deeppool", "adaptive"}
    listing = text[text.index("planners (--planner NAME):"):]
    # each planner's block: from "  name: " to the next planner's; its option keys in it, in order
    starts = sorted((listing.index(f"\n  {name}: "), name) for name in planners)
    assert [name for _, name in starts] == sorted(planners)
    for (start, name), end in zip(starts, [s for s, _ in starts[1:]] + [len(listing)], strict=True):
        block = " ".join(listing[start:end].split())  # unwrapped
        assert " ".join(planners[name].summary.split()) in block
        assert planners[name].options, name
        keys = [re.search(rf" {key}: ", block) for key in planners[name].options]
        assert all(keys), (name, block)
        assert [k.start() for k in keys] == sorted(k.start() for k in keys)
        for key, description in planners[name].options.items():
            assert f"{key}: {' '.join(description.split())}" in block
    assert "--planner PLANNER" in text and "one of: adaptive, dapple, deeppool, pase" in " ".join(text.split())


def test_top_level_help_names_the_planners():
    text = _help()
    line = " ".join(text[text.index("\nplanners") + 1:].split())  # the last paragraph, wrapped to the terminal
    assert line.endswith(": " + ", ".join(sorted(load_planners())))
    assert "clustersim plan --help" in line


def test_the_planners_read_from_source_are_the_registered_ones():
    assert planner_help() == {name: (p.summary, dict(p.options)) for name, p in load_planners().items()}


def test_a_named_literal_is_read_only_when_asked_and_literal(tmp_path, monkeypatch):
    (tmp_path / "planner_a.py").write_text(
        'OPTIONS = {\n    "k": "one "\n         "two",  # a comment\n    "j": "x"}\nOTHER = 1\n'
        'A = register(PlannerKind(name="a", summary="s", options=OPTIONS, run=f))\n')
    (tmp_path / "planner_b.py").write_text('OPTIONS = dict(k="v")\nB = register(PlannerKind(name="b", summary="s", '
                                           'options=OPTIONS, run=f))\n')
    (tmp_path / "planner_c.py").write_text('C = register(PlannerKind(name="c", summary="s", options=MISSING, run=f))\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    keys = ("name", "summary", "options")
    assert literal_call_fields("planner_a", "PlannerKind", keys) is None  # names are not followed by default
    assert literal_call_fields("planner_a", "PlannerKind", keys, names=True) == {
        "name": "a", "summary": "s", "options": {"k": "one two", "j": "x"}}
    assert literal_call_fields("planner_b", "PlannerKind", keys, names=True) is None  # not a literal: import it
    assert literal_call_fields("planner_c", "PlannerKind", keys, names=True) is None
