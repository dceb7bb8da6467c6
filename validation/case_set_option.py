"""``--case-set NAME`` for the validation modules' command lines, with ``--set NAME`` kept as a hidden old name.

Every ``clustersim`` command takes ``--set KEY.PATH=VALUE`` as a scenario change, and ``clustersim validate`` names its
case sets with ``--case-set`` (session 11). The ``python -m validation...`` modules used ``--set NAME`` for a case
set; they take ``--case-set NAME`` now. The old spelling still works (notes and scripts use it), hidden from
``--help``, with one NOTE line on stderr; a ``KEY=VALUE`` given to it exits 2 saying these modules set no field.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


class _OldSetFlag(argparse.Action):
    """``--set NAME``: stores or appends NAME as ``--case-set`` would, after one NOTE on stderr."""

    def __init__(self, option_strings, dest, *, append: bool, valid: Sequence[str], what_if: str = "", **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.append, self.valid, self.what_if = append, tuple(valid), what_if

    def __call__(self, parser, namespace, value, option_string=None):
        if "=" in value:
            parser.error(f"--set: {parser.prog} sets no scenario field (got {value!r}); to run only some case sets "
                         f"use --case-set NAME{self.what_if}")
        if value not in self.valid:
            parser.error(f"--set: no case set {value!r} (one of: {', '.join(self.valid)})")
        if not getattr(parser, "_old_set_noted", False):
            parser._old_set_noted = True
            print(f"NOTE: {parser.prog} --set NAME is now --case-set NAME (clustersim's --set is KEY.PATH=VALUE); "
                  "--set still works here", file=sys.stderr)
        if self.append:
            setattr(namespace, self.dest, [*(getattr(namespace, self.dest, None) or ()), value])
        else:
            setattr(namespace, self.dest, value)


def add_case_set_option(parser: argparse.ArgumentParser, dest: str, choices: Sequence[str], *, repeatable: bool,
                        default: str | None = None, help: str = "", what_if: str = "") -> None:
    """Add ``--case-set NAME`` (stored in ``dest``; appended to a list when ``repeatable``) and the hidden old
    ``--set NAME``. ``what_if``: text added to the ``--set KEY=VALUE`` refusal, e.g. the module's own override
    option. A module that needs a case set checks ``dest`` after parsing with :func:`require_case_set` (argparse's
    ``required`` would refuse the old spelling)."""
    choices = tuple(choices)
    parser.add_argument("--case-set", dest=dest, action="append" if repeatable else "store", choices=choices,
                        metavar="NAME", default=default, help=f"{help} (one of: {', '.join(choices)})".lstrip())
    parser.add_argument("--set", dest=dest, action=_OldSetFlag, append=repeatable, valid=choices, what_if=what_if,
                        metavar="NAME", default=default, help=argparse.SUPPRESS)


def require_case_set(parser: argparse.ArgumentParser, value) -> None:
    """Exit 2 with argparse's own wording when no case set was given (by ``--case-set`` or the old ``--set``)."""
    if value is None:
        parser.error("the following arguments are required: --case-set")
