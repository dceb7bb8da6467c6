"""Checking an output path before any work is done, so a long run never ends in a failed write."""

from __future__ import annotations

import os
from pathlib import Path

from simulator.errors import ConfigError


def check_output_path(path: str | Path, field: str, suffixes: tuple[str, ...] = ()) -> Path:
    """The path as a :class:`Path` if a file can be written there; else a ConfigError on ``field``.

    Checks: a non-empty file name, an accepted suffix (when ``suffixes`` is given), an existing
    folder that this process may write into, and no folder of that name in the way."""
    text = str(path)
    if not text.strip() or "\x00" in text:
        raise ConfigError(field, f"not a usable file name: {text!r}")
    out = Path(text)
    if suffixes and out.suffix.lower() not in suffixes:
        raise ConfigError(field, f"{out} must end in {' or '.join(suffixes)}")
    folder = out.parent
    if not folder.is_dir():
        raise ConfigError(field, f"folder does not exist: {folder}")
    if out.is_dir():
        raise ConfigError(field, f"{out} is a folder, not a file")
    if not os.access(folder, os.W_OK | os.X_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise ConfigError(field, f"cannot write to {out}: permission denied")
    return out


def check_output_folder(path: str | Path, field: str) -> Path:
    """A folder that exists or can be created (its nearest existing parent is a writable folder)."""
    text = str(path)
    if not text.strip() or "\x00" in text:
        raise ConfigError(field, f"not a usable folder name: {text!r}")
    out = Path(text)
    if out.exists() and not out.is_dir():
        raise ConfigError(field, f"{out} is a file, not a folder")
    folder = out
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise ConfigError(field, f"cannot create {out}: {folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(field, f"cannot write to {folder}: permission denied")
    _try_creating(out, folder, field)
    return out


def _try_creating(out: Path, existing: Path, field: str) -> None:
    """Create the folders from ``existing`` down to ``out`` and remove them again, so that a folder the access
    check passes but the system refuses (``--out /proc/figures`` as root: os.access says writable, mkdir says
    no such file) is one line here, not a FileNotFoundError traceback after the simulation; nothing is left."""
    missing = []
    folder = out
    while folder != existing:
        missing.append(folder)
        folder = folder.parent
    made = []
    try:
        for folder in reversed(missing):
            folder.mkdir()
            made.append(folder)
    except OSError as exc:
        raise ConfigError(field, f"cannot create {out}: {exc.strerror or exc}") from None
    finally:
        for folder in reversed(made):
            try:
                folder.rmdir()
            except OSError:
                pass
