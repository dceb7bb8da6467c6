"""Catalogs of named specs: one YAML file per entry, the file stem is the name.

A :class:`YamlCatalog` knows one folder and one schema. ``get`` takes a catalog name,
a path to a YAML file, or an inline mapping, so a scenario can use any of the three. A node may
also be a variant of a catalog node, ``{base, overrides}`` (hardware_specs/variants.py), inline or
as a catalog file.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any, Generic

from hardware_specs.schema import FABRIC_TYPES, Accelerator, Fabric, Node
from hardware_specs.variants import resolve_variant
from hardware_specs.yaml_io import SpecT, read_yaml, validate_spec
from simulator.errors import ConfigError, did_you_mean

_HERE = Path(__file__).parent


class CatalogFolder:
    """The names of a catalog: the stems of ``folder/*.yaml`` (no schema: telling a name needs none)."""

    def __init__(self, kind: str, folder: Path):
        self.kind = kind
        self.folder = folder

    def names(self) -> list[str]:
        return sorted(p.stem for p in self.folder.glob("*.yaml"))

    def has(self, name: str) -> bool:
        """Whether ``name`` is one of :meth:`names` (one file check, not a directory listing: a
        search resolves the same names thousands of times)."""
        return bool(name) and "/" not in name and "\\" not in name and (self.folder / f"{name}.yaml").is_file()


class YamlCatalog(CatalogFolder, Generic[SpecT]):
    """Named specs of one kind, read from ``folder/*.yaml`` and validated by ``schema``."""

    def __init__(self, kind: str, folder: Path, schema: type[SpecT], types: tuple[type, ...] | None = None,
                 variants_of: Path | None = None, built_first: tuple[type, ...] = ()):
        super().__init__(kind, folder)
        self.schema = schema
        self.types = types or (schema,)  # the classes a resolved spec may be (a union's members)
        self.variants_of = variants_of  # nodes: the accelerator folder a {base, overrides} variant merges into
        # Specs nested in this schema that are also validated on their own (a node's inline accelerator):
        # their deferred validators are built before this schema's, which then reuses them; built the
        # other way round, pydantic builds the nested schema twice (inline, then on its own: ~14 ms).
        self.built_first = built_first

    def validate(self, raw: Any, field: str) -> SpecT:
        """``raw`` (a mapping as written) validated by the schema, the error naming ``field``."""
        for nested in self.built_first:
            if not nested.__pydantic_complete__:
                nested.model_rebuild()
        return validate_spec(self.schema, self.resolved(raw, field), field)

    def resolved(self, raw: Any, field: str) -> Any:
        """A mapping as the schema reads it: a node variant ``{base, overrides}`` as its full node mapping."""
        if self.variants_of is None:
            return raw
        return resolve_variant(raw, field, self.folder, self.variants_of)

    def get(self, ref: str | dict[str, Any] | SpecT, field: str | None = None) -> SpecT:
        """Resolve a catalog name, a YAML path, an inline mapping, or an existing spec."""
        field = field or self.kind
        if isinstance(ref, self.types):
            return ref
        if isinstance(ref, dict):
            return self.validate(ref, field)
        if not isinstance(ref, str) or not ref:
            raise ConfigError(field, f"expected a catalog name, a file path or a mapping, got {ref!r}")
        if self.has(ref):
            return _load_cached(self, ref)
        path = Path(ref)
        if path.suffix in (".yaml", ".yml") or path.exists():
            return self.validate(read_yaml(path, field), field)
        raise ConfigError(field, f"unknown {self.kind} {ref!r}{did_you_mean(ref, self.names())} "
                                f"(known: {', '.join(self.names())})")

    def all(self) -> dict[str, SpecT]:
        return {name: self.get(name) for name in self.names()}


@cache
def _load_cached(catalog: YamlCatalog, name: str):
    path = catalog.folder / f"{name}.yaml"
    field = f"{catalog.kind}:{name}"
    return catalog.validate(read_yaml(path, field, catalog=True), field)


ACCELERATORS = YamlCatalog("accelerator", _HERE / "accelerators", Accelerator)
NODES = YamlCatalog("node", _HERE / "nodes", Node, variants_of=_HERE / "accelerators", built_first=(Accelerator,))
FABRICS = YamlCatalog("fabric", _HERE / "fabrics", Fabric, FABRIC_TYPES)


def node_accelerator(node: Node, field: str = "cluster.node.accelerator") -> Accelerator:
    """The node's accelerator spec, resolving a catalog name."""
    return ACCELERATORS.get(node.accelerator, field)
