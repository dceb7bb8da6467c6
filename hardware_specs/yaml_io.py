"""Reading YAML files and mappings into specs, with errors that name the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError

from simulator.errors import ConfigError, from_pydantic

SpecT = TypeVar("SpecT", bound=BaseModel)


def read_yaml(path: Path, field: str) -> Any:
    """Parse a YAML file; a missing file or invalid YAML is a ConfigError on ``field``."""
    if not path.is_file():
        raise ConfigError(field, f"file not found: {path}")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(field, f"invalid YAML in {path}{where}") from None


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
