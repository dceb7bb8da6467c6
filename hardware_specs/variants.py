"""A node given as a variant of a catalog node: ``{base: <catalog node>, overrides: {...}}``.

A board that differs from a catalog node in a few datasheet values -- torchtitan's benchmark H100s are
Meta "Grand Teton" hosts, eight H100 SXM at a 500 W limit with 96 GB of HBM2e at 2.4 TB/s
(torchtitan_perf.csv ``hardware_notes``) -- is the catalog node with those values changed, not a copy
of it: the copy would drift when the base's fitted blocks are rewritten. Validation has always
described such rows this way (validation/modern/mapping.py ``node_variant``); the same mapping is
accepted in ``cluster.node`` and as a catalog node file (hardware_specs/nodes/grand-teton-h100.yaml).

The variant is the base node's YAML with ``overrides`` merged in key by key (a nested mapping merges
into the base's, so ``intra_node: {latency_us: 4}`` keeps the other link values); an ``accelerator``
mapping merges into the base accelerator's catalog YAML, so the variant keeps every efficiency, ``name``
and ``source`` it does not override. The result is validated as any node: an unknown key in
``overrides`` is an error that names it.
"""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

from hardware_specs.schema import Accelerator
from hardware_specs.yaml_io import read_yaml, validate_spec
from simulator.errors import ConfigError

VARIANT_KEYS = ("base", "overrides")


def is_variant(raw: Any) -> bool:
    """Whether a node mapping is a variant (it names a ``base``)."""
    return isinstance(raw, dict) and "base" in raw


@cache
def _catalog_yaml(folder: Path, name: str) -> Any:
    return read_yaml(folder / f"{name}.yaml", f"{folder.name}:{name}", catalog=True)


def merged(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` merged in, nested mappings key by key."""
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) \
            else copy.deepcopy(value)
    return out


def resolve_variant(raw: Any, field: str, nodes: Path, accelerators: Path, seen: tuple[str, ...] = ()) -> Any:
    """The full node mapping of a variant (any other value is returned as it is); see the module docstring.
    ``nodes`` / ``accelerators``: the catalog folders. A base that is itself a variant is resolved first."""
    if not is_variant(raw):
        return raw
    unknown = sorted(str(k) for k in raw if k not in VARIANT_KEYS)
    if unknown:
        raise ConfigError(f"{field}.{unknown[0]}", "unknown key: a node variant takes base (a catalog node name) and "
                                                   "overrides (the values that differ from it)")
    base, overrides = raw["base"], raw.get("overrides", {})
    known = sorted(p.stem for p in nodes.glob("*.yaml"))
    if not isinstance(base, str) or base not in known:
        raise ConfigError(f"{field}.base", f"unknown node {base!r}: a variant's base is a catalog node (known: "
                                           f"{', '.join(known)})")
    if base in seen:
        raise ConfigError(f"{field}.base", f"node variants form a cycle: {' -> '.join((*seen, base))}")
    if not isinstance(overrides, dict):
        raise ConfigError(f"{field}.overrides", f"expected a mapping of the values that differ from {base}, got "
                                                f"{type(overrides).__name__}")
    spec = resolve_variant(copy.deepcopy(_catalog_yaml(nodes, base)), f"node:{base}", nodes, accelerators,
                           (*seen, base))
    part = overrides.get("accelerator")
    if isinstance(part, dict):
        # the part validated on its own, so that a bad key is named as cluster.node.accelerator.<key>
        held = spec.get("accelerator")
        if isinstance(held, str):
            held = copy.deepcopy(_catalog_yaml(accelerators, held))
        elif isinstance(held, Accelerator):  # a base that is itself a variant of its part
            held = held.model_dump(exclude_none=True)
        spec["accelerator"] = validate_spec(Accelerator, merged(held, part), f"{field}.accelerator")
        overrides = {k: v for k, v in overrides.items() if k != "accelerator"}
    return merged(spec, overrides)
