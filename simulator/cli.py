"""The ``clustersim`` command line.

Each sub-command lives in its own module under ``simulator/commands/`` and exposes
``register(subparsers)``, which adds its parser and sets ``handler`` (a function of the
parsed arguments returning the exit code). Bad input anywhere is a :class:`ConfigError`:
one line on stderr naming the field, exit code 2, no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import shutil
import sys
import textwrap

from simulator import commands
from simulator.errors import ConfigError

EXIT_BAD_INPUT = 2


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("clustersim")
    except PackageNotFoundError:
        return "0+unknown"


class _VersionAction(argparse.Action):
    """``--version``, with the version read only when asked (importlib.metadata costs ~50 ms at start)."""

    def __call__(self, parser, namespace, values, option_string=None):
        # which engine build runs: setup.py's compiled one or pure Python
        from simulator.engine import ENGINE_BUILD

        print(f"clustersim {_version()} (engine: {ENGINE_BUILD})")
        parser.exit(0)


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line (exit 2), like every other bad input."""

    def error(self, message: str):
        command = self.prog.removeprefix("clustersim").strip()
        self.exit(EXIT_BAD_INPUT, f"clustersim: error: {command + ': ' if command else ''}{message}\n")


class _TopParser(_Parser):
    """The ``clustersim`` parser, whose epilog (every strategy kind and its summary, and every planner's
    name, read from the modules' source: ~12 ms) is written only when the help is printed."""

    def format_help(self) -> str:
        if self.epilog is None:
            from simulator.explore.planners import planner_summaries
            from simulator.strategies.registry import kind_summaries  # read, not imported: --help stays light

            summaries = sorted(kind_summaries().items())
            width = max(len(name) for name, _ in summaries)  # one column however long a kind's name is
            # each summary wrapped to the terminal as argparse wraps the options (they ran to 240 columns)
            columns = max(shutil.get_terminal_size().columns - 2, width + 40)
            kinds = "\n".join(textwrap.fill(summary, columns, initial_indent=f"  {name:<{width}}  ",
                                             subsequent_indent=" " * (width + 4), break_on_hyphens=False)
                               for name, summary in summaries)
            planners = ", ".join(sorted(planner_summaries()))
            self.epilog = (f"strategy kinds (a scenario's strategy: {{kind: ...}}):\n{kinds}\n\n" + textwrap.fill(
                f"planners (clustersim plan SCENARIO --planner NAME; each one's options: clustersim plan --help): "
                f"{planners}", columns, break_on_hyphens=False))
        return super().format_help()


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command; with ``command``, of that one only (its module alone is imported and
    registered: ``clustersim simulate`` does not build the other commands' parsers), or None where no
    module registers it."""
    parser = _TopParser(
        prog="clustersim",
        description="Discrete-event simulator of neural-network training on GPU clusters.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_VersionAction, nargs=0, help="show the version and exit")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)  # no kinds epilog
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if command is not None and info.name != command.replace("-", "_"):
            continue
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        module.register(subparsers)
    if command is not None and command not in subparsers.choices:
        return None
    return parser


def _terminate(signum, frame):
    """SIGTERM (``kill``) unwinds like Ctrl-C, so a sweep stops its worker processes and closes its output."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return _main(argv)
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return _main(argv)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _negative_lists_joined(argv: list[str]) -> list[str]:
    """``--gpus -8,16`` as ``--gpus=-8,16``: argparse takes a token that starts with '-' and is not one plain
    negative number for an option, and answered "argument --gpus: expected one argument"; joined, the option's own
    check names the bad count ("--gpus: GPU counts must be positive, got -8")."""
    import re

    out: list[str] = []
    for token in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and re.fullmatch(r"-\d[\d.]*(,-?[\d.]*)+", token):
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


def _main(argv: list[str] | None) -> int:
    argv = _negative_lists_joined(sys.argv[1:] if argv is None else list(argv))
    command = argv[0] if argv and not argv[0].startswith("-") else None
    parser = (command and build_parser(command)) or build_parser()  # an unknown command: every one, for its error
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 0
    try:
        return int(args.handler(args) or 0)
    except ConfigError as exc:
        print(f"clustersim: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # e.g. `clustersim simulate | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("clustersim: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
