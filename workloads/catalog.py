"""The model catalog (``workloads/models/*.yaml``) and model references in scenarios.

A model reference is a catalog name, a path to a model YAML, a path to a Hugging Face
``config.json``, or an inline mapping.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hardware_specs.catalog import YamlCatalog
from simulator.errors import ConfigError
from workloads.hf_config import spec_from_hf_config
from workloads.schema import TransformerSpec

MODELS = YamlCatalog("model", Path(__file__).parent / "models", TransformerSpec)


def resolve_model(ref: str | dict[str, Any] | TransformerSpec, field: str = "model") -> TransformerSpec:
    """Resolve any model reference to a spec (see module docstring)."""
    if isinstance(ref, str) and ref.endswith(".json"):
        path = Path(ref)
        if not path.is_file():
            raise ConfigError(field, f"file not found: {path}")
        try:
            config = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(field, f"invalid JSON in {path}: {exc.msg} at line {exc.lineno}") from None
        return spec_from_hf_config(config, name=path.parent.name or path.stem, field=field)
    return MODELS.get(ref, field)
