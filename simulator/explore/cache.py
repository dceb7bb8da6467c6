"""A persistent on-disk cache of finished points (search, sweep, scale): a re-run is instant.

A point's key is a hash of the *resolved* scenario (``repr`` of the :class:`Scenario`, which holds
every spec value the catalog or a user file supplied, so editing a spec invalidates it), the
evaluation path (engine or fast path) and the code version: a hash of every ``.py`` and ``.yaml``
file of ``simulator/``, ``workloads/``, ``hardware_specs/`` and ``validation/profiles/`` (so any
change to the code or the catalog invalidates every entry). Entries are one JSON file each, written
atomically (temporary file, then rename), so concurrent workers never read half an entry.

Where: ``$CLUSTERSIM_CACHE_DIR`` or ``~/.cache/clustersim/points``; ``CLUSTERSIM_CACHE=0`` (or
``--no-cache`` on the commands) turns it off.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parents[2]
_VERSIONED = ("simulator", "workloads", "hardware_specs", "validation/profiles")


@functools.cache
def code_version() -> str:
    """Hash of the simulator's code and catalog (computed once per process)."""
    digest = hashlib.sha256()
    for folder in _VERSIONED:
        base = _ROOT / folder
        if not base.is_dir():
            continue
        for path in sorted(p for p in base.rglob("*") if p.suffix in (".py", ".yaml", ".yml", ".json")):
            if "__pycache__" in path.parts:
                continue
            digest.update(str(path.relative_to(_ROOT)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def enabled() -> bool:
    return os.environ.get("CLUSTERSIM_CACHE", "1") not in ("0", "false", "no", "off")


def cache_dir() -> Path:
    folder = os.environ.get("CLUSTERSIM_CACHE_DIR")
    return Path(folder) if folder else Path.home() / ".cache" / "clustersim" / "points"


def point_key(scenario: Any, path: str) -> str:
    """Key of a resolved scenario evaluated by ``path`` ("engine", "fast", ...)."""
    text = json.dumps({"scenario": repr(scenario), "path": path, "code": code_version()})
    return hashlib.sha256(text.encode()).hexdigest()


def _file(key: str) -> Path:
    return cache_dir() / key[:2] / f"{key}.json"


def load(key: str) -> dict[str, Any] | None:
    """The cached result of ``key``, or None (missing, unreadable, or the cache is off)."""
    if not enabled():
        return None
    try:
        return json.loads(_file(key).read_text())
    except (OSError, ValueError):
        return None


def store(key: str, result: dict[str, Any]) -> None:
    """Write ``result`` under ``key`` (best effort: a read-only disk only loses the cache)."""
    if not enabled():
        return
    target = _file(key)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=target.parent, suffix=".tmp", delete=False) as handle:
            json.dump(result, handle, default=str)
        os.replace(handle.name, target)
    except (OSError, TypeError, ValueError):
        return


def cached_point(raw: dict[str, Any], engine: str = "full") -> dict[str, Any]:
    """``simulate_point(raw, engine=..., messages=True)`` through the cache (the row carries the scenario's
    ``warnings`` and ``notes``). Bad input is not cached (it is cheap)."""
    from simulator.errors import ConfigError
    from simulator.scenario import load_scenario
    from simulator.simulate import simulate_point

    if not enabled():
        return simulate_point(raw, engine=engine, messages=True)
    try:
        scenario = load_scenario(raw)
    except ConfigError:
        return simulate_point(raw, engine=engine, messages=True)
    key = point_key(scenario, engine)
    hit = load(key)
    if hit is not None:
        return hit
    result = simulate_point(raw, engine=engine, messages=True)
    store(key, result)
    return result
