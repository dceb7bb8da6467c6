"""Reading YAML files and mappings into specs, with errors that name the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError

from simulator.errors import ConfigError, from_pydantic

SpecT = TypeVar("SpecT", bound=BaseModel)


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (YAML 1.2 forbids it; PyYAML
    would keep the last silently, so ``parallelism: {tp: 2}`` ... ``parallelism: {tp: 4}`` ran tp 4)."""

    def construct_mapping(self, node, deep=False):
        _refuse_duplicate_keys(self, node)
        return super().construct_mapping(node, deep)


def _refuse_duplicate_keys(loader, node) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = loader.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                continue  # the base class reports unhashable keys
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark, f"duplicate key {key!r}", key_node.start_mark)
            seen[key] = True


class _StrictCLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """:class:`_StrictLoader` on libyaml's parser (~10x faster; PyYAML's pure-Python loader where libyaml is
    missing), for the package's own catalog files only: a user's file keeps the pure-Python loader, whose
    errors (line of invalid YAML, runaway nesting as a RecursionError) the bad-input tests fix."""

    def construct_mapping(self, node, deep=False):
        _refuse_duplicate_keys(self, node)
        return super().construct_mapping(node, deep)


def read_text(path: Path, field: str) -> str:
    """A text file's contents; a missing file, a folder or bytes that are not UTF-8 are a ConfigError."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(field, f"file not found: {path}")
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(field, f"{path} is not UTF-8 text (byte {exc.start}: {exc.object[exc.start]:#04x}); "
                                 "is it a binary file?") from None
    except OSError as exc:
        raise ConfigError(field, f"cannot read {path}: {exc.strerror or exc}") from None


def parse_yaml(text: str, field: str, where: str = "input", catalog: bool = False) -> Any:
    """YAML text to Python values; invalid YAML, a duplicate key or runaway nesting is a ConfigError.
    ``catalog``: a file shipped in the package's catalogs, read with libyaml (:class:`_StrictCLoader`)."""
    try:
        return yaml.load(text, Loader=_StrictCLoader if catalog else _StrictLoader)  # noqa: S506 - SafeLoader subclasses
    except yaml.YAMLError as exc:
        raise ConfigError(field, f"invalid YAML in {where}{_yaml_problem(exc)}") from None
    except RecursionError:
        raise ConfigError(field, f"{where} is nested too deeply") from None


def _yaml_problem(exc) -> str:
    """Where and what the parser found wrong, on one line: " at line L, column C: PROBLEM (CONTEXT
    started at line K)". Until the tenth session only the line was said (and the problem only for a
    duplicate key), so ``parallelism`` missing its colon read "invalid YAML ... at line 23" -- the line
    after the mistake -- with no reason; PyYAML's context mark points at the line that opened the
    construct (here line 22, the key without its ':')."""
    mark = getattr(exc, "problem_mark", None)
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = " ".join(str(getattr(exc, "problem", None) or "").split())
    context = " ".join(str(getattr(exc, "context", None) or "").split())
    context_mark = getattr(exc, "context_mark", None)
    if context and context_mark is not None and (mark is None or context_mark.line != mark.line):
        context += f" started at line {context_mark.line + 1}"
    return at + (f": {problem}" if problem else "") + (f" ({context})" if problem and context else "")


def read_yaml(path: Path, field: str, catalog: bool = False) -> Any:
    """Parse a YAML file; a missing file, non-UTF-8 bytes or invalid YAML is a ConfigError on ``field``."""
    return parse_yaml(read_text(path, field), field, str(path), catalog)


def read_json(path: Path, field: str) -> Any:
    """Parse a JSON file (NaN and Infinity refused); errors are a ConfigError on ``field``."""
    import json

    text = read_text(path, field)

    def _no_constant(name: str):
        raise ValueError(f"{name} is not a number JSON allows")

    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ConfigError(field, f"invalid JSON in {path}: {exc.msg} at line {exc.lineno}") from None
    except ValueError as exc:
        raise ConfigError(field, f"invalid JSON in {path}: {exc}") from None
    except RecursionError:
        raise ConfigError(field, f"{path} is nested too deeply") from None


def validate_spec(schema: type[SpecT], data: Any, field: str) -> SpecT:
    """Validate ``data`` against ``schema``; the error names ``field`` plus the bad key."""
    if not isinstance(data, dict):
        raise ConfigError(field, f"expected a mapping, got {type(data).__name__}")
    try:
        if hasattr(schema, "model_validate"):
            return schema.model_validate(data)
        return TypeAdapter(schema).validate_python(data)  # a tagged union of specs (fabrics)
    except ValidationError as exc:
        raise from_pydantic(exc, field, drop_tags=not hasattr(schema, "model_validate")) from None
