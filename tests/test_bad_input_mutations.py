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

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.cli import main

ROOT = Path(__file__).resolve().parents[1]
# small examples of several kinds (spmd transformer, CNN data parallel, pipeline CNN planner, DiLoCo over a WAN,
# mixed accelerators, MoE, a co-located background job, SWARM's preempted peers with an inline model): each
# simulates in well under 0.2 CPU-s (the swarm example in ~0.3). The swarm example was left out until its model
# sizes had bounds: 10**30 layers ran for ever (tests/test_bad_input_huge.py)
EXAMPLES = ["resnet50-8xa100.yaml", "gpt-1.7b-cyclic-dp-a100.yaml", "vgg16-dapple-v100.yaml",
            "gpt-1.7b-diloco-two-continents.yaml", "mixed-a100-t4.yaml", "mixtral-8x7b-ep8-h100.yaml",
            "llama3-8b-torchtitan-fp8-mi300x.yaml", "stragglers-dp-a100.yaml", "swarm-t4-preemptible.yaml"]
MUTATIONS = {"wrong type": "abc", "negative": -1, "zero": 0, "unknown name": "no-such-name", "empty": "",
             "null": None, "empty list": [], "empty mapping": {}, "true": True, "huge": 10**30}


#: Well-formed numbers: a refusal may come from a check between fields (a swarm's NIC latency of 10**30 us makes the
#: run so long that its preemption draw is refused as strategy.preemptions_per_hour), which names the other field;
#: one line, exit 2, is required of them, not the name.
VALUE_MUTATIONS = ("negative", "zero", "huge")


def _raw(name: str) -> dict:
    return yaml.safe_load((ROOT / "examples" / name).read_text())


def _fields(raw, path=()):
    """Every mapping key's dotted path in ``raw`` (list items by index, the first two of a list)."""
    items = raw.items() if isinstance(raw, dict) else enumerate(raw[:2]) if isinstance(raw, list) else ()
    for key, value in items:
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


@st.composite
def mutated(draw):
    name = draw(st.sampled_from(EXAMPLES))
    path, old = draw(st.sampled_from(FIELDS[name]))
    how = draw(st.sampled_from(sorted(MUTATIONS)))
    return name, path, old, how


@settings(max_examples=45, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=mutated())
def test_one_field_changed_is_run_or_refused_in_one_line_naming_it(tmp_path, case):
    name, path, old, how = case
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


def test_the_examples_drawn_from_run_unchanged(tmp_path):
    """The control: each example runs as shipped, so every refusal above is the mutation's."""
    for name in EXAMPLES:
        code, err = _simulate(_raw(name), tmp_path)
        assert code == 0, (name, err[-2000:])
