"""Every example scenario loads and simulates; the built-in default is the commented example."""

import re
from pathlib import Path

import pytest

from simulator.scenario import DEFAULT_SCENARIO, load_scenario
from simulator.simulate import simulate

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_default_scenario_is_the_commented_example():
    assert DEFAULT_SCENARIO.read_text() == (EXAMPLES / "gpt3-175b-1024-a100.yaml").read_text()


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_example_runs_and_fits(path):
    result = simulate(load_scenario(path))
    assert result.fits, result.infeasible_reason
    assert 0 < result.mfu < 1
    assert sum(result.time_breakdown_s.values()) == pytest.approx(result.step_time_s, rel=1e-9)
    printed = header_step_time(path.read_text())
    if printed is not None:
        figure, unit = printed
        decimals = len(figure.partition(".")[2])
        scale = 1e3 if unit == "ms" else 1.0
        assert f"{result.step_time_s * scale:.{decimals}f}" == figure, "the header's 'Simulated:' figure is stale"


SIMULATED_FIGURE = re.compile(r"Simulated:\s+(?P<figure>[\d.,]+)\s+(?P<unit>ms|s)\b")


def header_step_time(text):
    """The step time an example's header comment states ("Simulated: 47.9 ms a step"), as printed, or None."""
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    match = SIMULATED_FIGURE.search(header)
    return None if match is None else (match["figure"].replace(",", ""), match["unit"])


KEY_LINE = re.compile(r"^(?P<indent>\s*)(?:-\s+)?(?P<key>[A-Za-z_][\w.\-]*)\s*:(?:\s+(?P<rest>.*))?$")


def _has_inline_comment(text):
    """True when `text` (a line) carries a `#` comment outside quotes."""
    quote = None
    for i, char in enumerate(text):
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or text[i - 1].isspace()):
            return True
    return False


def uncommented_leaf_keys(text):
    """Leaf key lines of a YAML text with neither an inline comment nor a comment line right above.

    A leaf is a key with a scalar or flow value on its line, or a key whose block value is a list of
    scalars (its `- item` lines count as its leaves: the key's comment covers them). A key opening a
    nested mapping is a container and needs no comment of its own.
    """
    lines = text.splitlines()
    missing = []
    for number, line in enumerate(lines):
        match = KEY_LINE.match(line)
        if match is None or line.lstrip().startswith("#"):
            continue
        rest = (match["rest"] or "").strip()
        value = "" if rest.startswith("#") else rest
        if not value:
            following = next((next_line.strip() for next_line in lines[number + 1:]
                              if next_line.strip() and not next_line.strip().startswith("#")), "")
            is_scalar_list = following.startswith("- ") and KEY_LINE.match(following) is None
            if not is_scalar_list:
                continue
        if _has_inline_comment(line):
            continue
        if number > 0 and lines[number - 1].strip().startswith("#"):
            continue
        missing.append(f"line {number + 1}: {line.strip()}")
    return missing


ALL_EXAMPLE_FILES = sorted(EXAMPLES.glob("**/*.yaml"))


@pytest.mark.parametrize("path", ALL_EXAMPLE_FILES, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_every_example_field_is_commented(path):
    """HELPER_RULES: "Examples go in examples/*.yaml with a comment on every field" (audit s8 gap 2)."""
    assert uncommented_leaf_keys(path.read_text()) == []


def test_comment_checker_flags_a_bare_leaf_and_accepts_commented_ones():
    text = ("model:\n"
            "  # layers of the stack\n"
            "  num_layers: 24\n"
            "  hidden_size: 2048  # width\n"
            "  vocab_size: 50257\n"
            "  name: 'gpt #1'\n"
            "  dims:\n"
            "    - 1\n"
            "  items:\n"
            "    - name: a  # first\n")
    assert uncommented_leaf_keys(text) == ["line 5: vocab_size: 50257", "line 6: name: 'gpt #1'",
                                           "line 7: dims:"]


def test_header_step_time_reads_the_printed_figure():
    assert header_step_time("# runs. Simulated: 0.083 s per step (3,097\n# more\nname: x\n") == ("0.083", "s")
    assert header_step_time("# Simulated: 1,234.5 ms a step\n") == ("1234.5", "ms")
    assert header_step_time("name: x  # Simulated: 3 ms\n") is None
