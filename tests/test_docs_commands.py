"""README.md and docs/*.md: every quoted command parses, every quoted path exists.

A newcomer copies the commands the docs quote; one that names an option renamed since (``--set`` for
``--case-set``), a module or benchmark that moved, or an example file that was removed stops them, and they stop
trusting the rest. Every command quoted in a code span or a ``bash`` block of README.md and docs/*.md — ``clustersim
...``, ``python -m validation...``, ``python benchmarks/....py`` — is handed to the argparse parser of the program it
names and nothing runs: ``clustersim`` commands to ``simulator.cli.build_parser``'s sub-command parser, the others
through ``runpy`` with ``ArgumentParser.parse_args`` replaced by one that parses the quoted argv and stops before the
program does any work. A synopsis (``clustersim plot SCENARIO --out DIR [--weak|--strong]``) is parsed with its
brackets dropped and each ``a|b`` alternative in turn; an upper-case placeholder (``SCENARIO``, ``N``) stands for a
value of the option's type. Every path quoted under the repository's top-level folders (``examples/...``,
``validation/...``, ``tests/...``) must exist. Internal links and anchors: tests/test_docs_links.py.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import io
import itertools
import re
import runpy
import shlex
import sys
import warnings
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP_FOLDERS = ("examples", "validation", "tests", "benchmarks", "simulator", "hardware_specs", "workloads",
               "clustersim", "docs", ".ci")
# where a quoted command starts: the CLI, a module run with -m, or a script of the repository
START = re.compile(r"(?<![\w./-])(clustersim(?= |$)|python -m [\w.<>]+|python validation/[\w/]+\.py"
                   r"|(?:python )?(?:benchmarks/)?bench_\w+\.py)")
# scripts that read sys.argv without argparse: how many arguments each reads (its docstring's usage)
WITHOUT_PARSER = {"benchmarks/bench_engine_examples_json.py": 1}
# options quoted on their own that belong to programs outside this repository (pytest-xdist, Megatron-LM)
FOREIGN_OPTIONS = {"--dist", "--data-backend", "--train-iters", "--log-interval"}
PLACEHOLDER = re.compile(r"<[^>]+>|[A-Z][A-Z0-9_]*(?:\.[a-z]+)?")
FOLDERS = "|".join(re.escape(f) for f in TOP_FOLDERS)
PATH = re.compile(rf"(?<![\w./-])((?:{FOLDERS})/[\w./*{{}},-]*)")


def _lines(page: Path) -> list[str]:
    return page.read_text().splitlines()


def quoted(page: Path) -> list[tuple[int, str]]:
    """(line, text) of every inline code span and every line of a fenced ``bash`` block (continuation lines
    joined); a span may run over a line break as in Markdown."""
    out: list[tuple[int, str]] = []
    lines = _lines(page)
    prose: list[tuple[int, str]] = []
    fence = None
    pending = ""
    for number, line in enumerate(lines, 1):
        if line.startswith("```"):
            fence = None if fence is not None else (line[3:].strip() or "plain")
            continue
        if fence is None:
            prose.append((number, line))
        elif fence in ("bash", "sh", "shell", "console"):
            pending += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
            if not line.endswith("\\"):
                out.append((number, pending))
                pending = ""
    text = "\n".join(line for _, line in prose)
    starts = list(itertools.accumulate([0, *(len(line) + 1 for _, line in prose)]))
    for match in re.finditer(r"(`+)(.+?)\1", text, flags=re.S):
        index = next(i for i, start in enumerate(starts) if start > match.start()) - 1
        out.append((prose[index][0], " ".join(match.group(2).split())))
    return out


def commands(text: str) -> list[str]:
    """The commands in one quoted text: each from its start to the end, a shell separator or a comment."""
    found = []
    for match in START.finditer(text):
        before = text[:match.start()].rstrip()
        # a command starts the quote, follows a shell separator or a prompt, or comes after VAR=value prefixes;
        # elsewhere (`import clustersim`, `clustersim.simulate`) the name is prose
        if before and not re.search(r"(&&|\|\||;|\||\$|^(\w+=(<[^>]*>|\S+)\s*)+)$", before):
            continue
        rest = text[match.start():]
        rest = re.split(r"\s(?:&&|\|\||;|\||#)\s|\s#|;$|\s>\s?\S+", rest)[0]
        found.append(rest.strip().rstrip(".,:;)"))
    return found


def all_commands() -> list[tuple[str, str]]:
    return [(f"{page.relative_to(ROOT)}:{number}", command)
            for page in PAGES for number, text in quoted(page) for command in commands(text)]


def all_paths() -> list[tuple[str, str]]:
    """Every path under a top-level folder of the repository that a page names, quoted or in prose."""
    out = []
    for page in PAGES:
        for number, text in enumerate(_lines(page), 1):
            for match in PATH.finditer(text):
                path = match.group(1).rstrip(".,:;)")
                out.append((f"{page.relative_to(ROOT)}:{number}", path))
    return out


def _braces(path: str) -> list[str]:
    match = re.search(r"\{([^{}]*)\}", path)
    if not match:
        return [path]
    return [p for alt in match.group(1).split(",")
            for p in _braces(path[:match.start()] + alt + path[match.end():])]


def path_exists(path: str) -> bool:
    return all(glob.glob(str(ROOT / p)) for p in _braces(path))


# -- parsing without running -------------------------------------------------------------------------------------

_PARSE_ARGS = argparse.ArgumentParser.parse_args
OPTIONS: set[str] = set()  # every option of every parser a quoted command reached


class _Parsed(Exception):
    """Raised by the replaced parse_args once the quoted argv parsed: the program stops before any work."""


def _value_for(action: argparse.Action | None, placeholder: str) -> str:
    """A value an option's type accepts, for a placeholder such as ``N`` or ``NAME``."""
    if action is None:
        return placeholder
    if action.choices:
        return str(next(iter(action.choices)))
    if action.type in (int, float):
        return "1"
    return placeholder


def _filled(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """argv with each upper-case placeholder after an option replaced by a value of the option's type."""
    options = parser._option_string_actions
    out = []
    for token in argv:
        name, eq, value = token.partition("=")
        if eq and name in options and PLACEHOLDER.fullmatch(value):
            token = f"{name}={_value_for(options[name], value)}"
        elif out and out[-1] in options and PLACEHOLDER.fullmatch(token):
            token = _value_for(options[out[-1]], token)
        out.append(token)
    return out


def _strict(parser: argparse.ArgumentParser) -> None:
    """No abbreviations (``--repeat`` for ``--repeats`` works, but the docs quote the name), for every sub-parser."""
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _strict(sub)


def _parse(parser: argparse.ArgumentParser, argv: list[str],
           options: argparse.ArgumentParser | None = None, parsed: list | None = None) -> str | None:
    """None when ``parser`` accepts argv (``--help`` included), else what argparse printed. An option hidden from
    ``--help`` (an old name kept working, such as validate's ``--set NAME``) is refused: the docs quote the current
    name. ``options``: the (sub-command) parser whose options argv names; ``parsed`` gets the namespace."""
    hidden = [token for token in argv if token.startswith("--")
              and (action := (options or parser)._option_string_actions.get(token.split("=")[0])) is not None
              and action.help == argparse.SUPPRESS]
    if hidden:
        return f"{', '.join(hidden)}: an old name, hidden from --help"
    _strict(parser)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            namespace = _PARSE_ARGS(parser, argv)
        if parsed is not None:
            parsed.append(namespace)
    except SystemExit as exc:
        message = err.getvalue().strip()
        # a command quoted by its name and some options (`clustersim plan --planner adaptive`) leaves out what
        # it requires; every option it does quote was still parsed
        if exc.code not in (0, None) and "the following arguments are required" not in message:
            return message or f"exit {exc.code}"
    OPTIONS.update(parser._option_string_actions)
    return None


@cache
def _clustersim_parser() -> argparse.ArgumentParser:
    from simulator.cli import build_parser

    return build_parser()


def _subparser(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The innermost sub-command parser argv names (``specs list``), for its options' types."""
    for token in argv:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None or token not in sub.choices:
            break
        parser = sub.choices[token]
    return parser


def _command_filled(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``clustersim COMMAND --help``: a placeholder where the sub-command goes stands for the first command."""
    sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    if argv and sub and PLACEHOLDER.fullmatch(argv[0]) and argv[0] not in sub.choices:
        return [next(iter(sub.choices)), *argv[1:]]
    return argv


def parse_clustersim(argv: list[str]) -> str | None:
    from simulator.cli import _negative_lists_joined

    parser = _clustersim_parser()
    argv = _command_filled(parser, _negative_lists_joined(argv))
    parsed: list[argparse.Namespace] = []
    why = _parse(parser, _filled(_subparser(parser, argv), argv), _subparser(parser, argv), parsed)
    return why or (_scenario_loads(parsed[0]) if parsed else None)


def _scenario_loads(args: argparse.Namespace) -> str | None:
    """A command's scenario with its ``--set`` fields, loaded and checked as the command would before it runs
    (a renamed field fails here; nothing is simulated). A placeholder scenario (``SCENARIO``, ``<example>``) or
    value is not loaded."""
    from simulator.errors import ConfigError
    from simulator.scenario import load_scenario

    scenario, overrides = getattr(args, "scenario", None), getattr(args, "overrides", None) or []
    if not hasattr(args, "scenario") or (scenario is None and not overrides):
        return None
    if scenario is not None and (PLACEHOLDER.fullmatch(scenario) or not (ROOT / scenario).is_file()):
        return None if PLACEHOLDER.fullmatch(scenario) else f"no scenario file {scenario}"
    if any(PLACEHOLDER.fullmatch(o.partition("=")[2]) for o in overrides):
        return None
    try:
        load_scenario(None if scenario is None else str(ROOT / scenario), list(overrides))
    except ConfigError as exc:
        return f"the scenario does not load: {exc}"
    return None


def parse_program(target: str, argv: list[str]) -> str | None:
    """Run ``python -m MODULE`` / ``python SCRIPT`` up to its first parse_args, with argv, and stop there."""
    source = (ROOT / target).read_text() if target.endswith(".py") else None
    if source is None:
        path = ROOT / target.replace(".", "/")
        file = path / "__main__.py" if path.is_dir() else path.with_suffix(".py")
        if not file.exists():
            return f"no module {target} ({file.relative_to(ROOT)})"
        source = file.read_text()
    if target in WITHOUT_PARSER:
        wanted = WITHOUT_PARSER[target]
        return None if len(argv) == wanted else f"{target} reads {wanted} argument(s) from sys.argv, got {argv}"
    if "parse_args(" not in source:
        return f"{target} has no argparse parser to check the options against"
    outcome: list[str | None] = []

    def parse_only(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        outcome.append(_parse(self, _filled(self, args)))
        raise _Parsed

    saved_argv, saved_path = sys.argv[:], sys.path[:]
    argparse.ArgumentParser.parse_args = parse_only
    sys.argv = [target, *argv]
    try:
        with warnings.catch_warnings():
            # runpy's "found in sys.modules" when an earlier check imported the module: it runs afresh anyway
            warnings.simplefilter("ignore", RuntimeWarning)
            if target.endswith(".py"):
                sys.path.insert(0, str((ROOT / target).parent))
                runpy.run_path(str(ROOT / target), run_name="__main__")
            else:
                runpy.run_module(target, run_name="__main__", alter_sys=False)
    except _Parsed:
        pass
    finally:
        argparse.ArgumentParser.parse_args = _PARSE_ARGS
        sys.argv, sys.path[:] = saved_argv, saved_path
    if not outcome:
        return f"{target} finished without parsing its arguments"
    return outcome[0]


def _variants(argv: list[str]) -> list[list[str]]:
    """A synopsis's argv with brackets and ``...`` dropped, once per alternative of each ``a|b`` token."""
    tokens = [t.strip("[]") for t in argv]
    tokens = [re.sub(r",?\.\.\.$", "", t) for t in tokens]
    tokens = [t for t in tokens if t]
    choices = [t.split("|") if "|" in t else [t] for t in tokens]
    variants = [[c[0] for c in choices]]
    for i, alternatives in enumerate(choices):
        variants += [[*variants[0][:i], alt, *variants[0][i + 1:]] for alt in alternatives[1:]]
    return variants


def check(command: str) -> str | None:
    """None when the command parses, else why not."""
    command = re.sub(r"<[^<>]*>", lambda m: m.group(0).replace(" ", "_"), command)  # <main before it>: one word
    try:
        words = shlex.split(command)
    except ValueError as exc:
        return f"cannot split: {exc}"
    if words[0] == "python" and words[1] == "-m":
        target, argv = words[2], words[3:]
        if target == "pytest":
            return None  # not this project's parser
        if "<" in target:
            return None  # python -m validation.<module>: a pattern, not a command
    elif words[0] == "python" or words[0].endswith(".py"):
        target, argv = (words[1], words[2:]) if words[0] == "python" else (words[0], words[1:])
        if target.startswith("bench_"):
            target = f"benchmarks/{target}"  # a benchmark named without its folder
        if not (ROOT / target).exists():
            return f"no file {target}"
    else:
        target, argv = "clustersim", words[1:]
    for variant in _variants(argv):
        why = parse_clustersim(variant) if target == "clustersim" else parse_program(target, variant)
        if why:
            return f"{' '.join(variant)}: {why}"
    return None


COMMANDS = all_commands()


def test_the_docs_quote_commands():
    # the extraction itself: a change that stopped finding the commands would pass every check below vacuously
    assert len(COMMANDS) > 150
    texts = {c for _, c in COMMANDS}
    assert "clustersim simulate examples/resnet50-8xa100.yaml" in texts
    assert any(c.startswith("python -m validation.modern") for c in texts)
    assert any(c.startswith("python benchmarks/") for c in texts)


def test_every_quoted_command_parses():
    broken = [f"{where}: `{command}`: {why}" for where, command in COMMANDS if (why := check(command))]
    assert not broken, "\n".join(broken)


def test_every_quoted_path_exists():
    missing = [f"{where}: {path}" for where, path in all_paths() if not path_exists(path)]
    assert not missing, "\n".join(missing)


def _every_option() -> set[str]:
    """The options of every clustersim sub-command and of every program a quoted command runs."""
    for _, command in COMMANDS:
        check(command)  # fills OPTIONS with the options of each program's parser
    pending = [_clustersim_parser()]
    while pending:
        parser = pending.pop()
        OPTIONS.update(parser._option_string_actions)
        pending += [p for a in parser._actions if isinstance(a, argparse._SubParsersAction) for p in a.choices.values()]
    return OPTIONS


def test_every_option_quoted_alone_exists():
    # `--margin`, `--phases --rounds 5`: an option quoted in prose, its program named around it, must be an option
    # of some program the docs run (the check cannot tell which one; renamed everywhere, it fails here)
    known = _every_option() | FOREIGN_OPTIONS
    unknown = []
    for page in PAGES:
        for number, text in quoted(page):
            if START.search(text):
                continue  # a command: checked whole above
            unknown += [f"{page.relative_to(ROOT)}:{number}: {option}"
                        for option in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", text) if option not in known]
    assert not unknown, "\n".join(unknown)


@pytest.mark.parametrize("command", [
    "clustersim validate --set nemo",                       # session 11 renamed it --case-set
    "clustersim simulate examples/resnet50-8xa100.yaml --stepz 3",
    "clustersim plan SCENARIO --planner dapple --options k=v",  # it is --option
    "clustersim specs list --kind gpu",                     # not a kind
    "clustersim simulate examples/gpt-1.7b-pipedream-a100.yaml --set training.optimizer-fusion=backward",  # a field
    "clustersim simulate examples/no-such-example.yaml",
    "clustersim simulate --steps many",                     # --steps takes a number
    "bench_simulate.py --rounds",                           # a benchmark named without its folder
    "python benchmarks/bench_engine_examples_json.py",      # reads its output folder from sys.argv
    "python -m validation.modern --set nemo",
    "python -m validation.no_such_module",
    "python benchmarks/bench_simulate.py --repeat 7",
    "python benchmarks/no_such_bench.py",
    "clustersim scale SCENARIO --gpus 64,128 [--weak|--stronger]",
])
def test_a_stale_command_fails(command):
    assert check(command)


def test_docs_examples_names_every_example():
    # docs/examples.md says it lists every example scenario: each by its full name (a table row's later files go
    # without the folder), and no name there that is not a file
    page = ROOT / "docs" / "examples.md"
    named = {text.removeprefix("examples/") for _, text in quoted(page) if text.endswith(".yaml")}
    files = {p.name for p in (ROOT / "examples").glob("*.yaml")}
    assert sorted(files - named) == []
    assert sorted(n for n in named - files if not (ROOT / "examples" / n).exists()) == []


def test_a_missing_path_fails():
    assert not path_exists("examples/no-such-scenario.yaml")
    assert not path_exists("docs/{commands,nothing}.md")
    assert path_exists("docs/{commands,engine}.md") and path_exists("examples/*.yaml")
