"""The one error type for bad user input.

Every check of a scenario, a spec or a command-line value raises :class:`ConfigError`
with the dotted path of the offending field and the reason. The CLI turns it into one
line on stderr and exit code 2 (never a traceback). Layouts that are well-formed but
cannot run (out of memory) are *results* with ``infeasible_reason``, not errors.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """Bad input: names the field (dotted path) and the reason."""

    def __init__(self, field: str, reason: str):
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}" if field else reason)


def from_pydantic(exc, prefix: str = "", drop_tags: bool = False) -> ConfigError:
    """Turn a pydantic ``ValidationError`` into a ConfigError naming the first bad field
    (``drop_tags``: the error came from a tagged union, whose tag pydantic puts first in the path)."""
    err = exc.errors()[0]
    parts = list(err.get("loc", ()))[1 if drop_tags else 0:]
    loc = ".".join(str(p) for p in parts if p != "__root__")
    field = ".".join(p for p in (prefix, loc) if p)
    msg = err.get("msg", "invalid value")
    if err.get("type") == "extra_forbidden":
        msg = "unknown key"
    elif err.get("type") == "missing":
        msg = "required field is missing"
    return ConfigError(field or prefix or "input", msg)
