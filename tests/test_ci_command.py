"""`.ci/run` is the README's test command, verbatim: what a user types to run the tests is what CI
runs (one command line, including pytest's options such as its pytest-xdist workers)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_test_command() -> str:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"Install and run the tests[^\n]*\n\n```bash\n(.+?)\n```", readme, re.S)
    assert block, "the README's 'Install and run the tests' block is missing"
    return block.group(1).strip()


def test_ci_runs_the_readme_test_command_verbatim():
    command = _readme_test_command()
    assert "python -m pytest" in command
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert command in lines, f"{command!r} is not a line of .ci/run"


def test_the_test_command_installs_the_dev_extra_that_holds_its_pytest_plugins():
    """Every pytest option the command passes comes from pytest itself or a plugin the `dev` extra
    installs (pytest-xdist for -n / --dist)."""
    command = _readme_test_command()
    pyproject = (ROOT / "pyproject.toml").read_text()
    dev = re.search(r"^dev = \[(.*)\]$", pyproject, re.M)
    assert dev and "dev" in re.search(r'-e "\.\[([^\]]*)\]"', command).group(1).split(",")
    if re.search(r"(^|\s)(-n|--numprocesses|--dist)(\s|=)", command):
        assert "pytest-xdist" in dev.group(1)
