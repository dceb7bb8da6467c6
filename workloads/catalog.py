"""The model catalog (``workloads/models/*.yaml``) and model references in scenarios.

A model reference is a catalog name, a path to a model YAML, a path to a Hugging Face
``config.json``, or an inline mapping. Networks other than decoder transformers (ResNet, VGG,
Inception, ViT, U-Net, LSTMs, BERT: ``workloads/models/networks/``) resolve to their family's
spec (``workloads.networks``); an inline mapping with a ``family`` key is one of those.
``torchvision:NAME`` and ``{torch: "pkg.module:callable", input_shape: [...]}`` are PyTorch modules
traced on the meta device (``workloads.networks.torch_import``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hardware_specs.catalog import CatalogFolder, YamlCatalog
from hardware_specs.yaml_io import validate_spec
from simulator.errors import ConfigError, did_you_mean
from workloads.schema import TransformerSpec

if TYPE_CHECKING:
    from workloads.networks.spec import NetworkSpec

MODELS = YamlCatalog("model", Path(__file__).parent / "models", TransformerSpec)
#: The network catalog's files, for telling a network's name from a transformer's by one file check: the
#: catalog itself (workloads/networks/catalog.py, the same folder) builds nine families' schemas, ~20 ms
#: of start-up that a transformer's run does without, so it is imported only for a network. Likewise the
#: network spec, its layer builder and the PyTorch import (workloads/networks/) and the Hugging Face
#: reader are imported only for a reference that names one.
_NETWORK_FILES = CatalogFolder("model", Path(__file__).parent / "models" / "networks")


def _is_network_spec(ref: Any) -> bool:
    """Whether ``ref`` is a resolved network spec: one exists only once its module was imported."""
    spec = sys.modules.get("workloads.networks.spec")
    return spec is not None and isinstance(ref, spec.NetworkSpec)


def resolve_model(ref: str | dict[str, Any] | TransformerSpec | NetworkSpec,
                  field: str = "model") -> TransformerSpec | NetworkSpec:
    """Resolve any model reference to a spec (see module docstring)."""
    if _is_network_spec(ref):
        return ref
    if isinstance(ref, str) and ref.startswith("torchvision:"):
        from workloads.networks.torch_import import torchvision_spec

        return torchvision_spec(ref)
    if isinstance(ref, dict) and "torch" in ref:
        from workloads.networks.torch_import import TorchModelSpec

        return validate_spec(TorchModelSpec, ref, field)
    if (isinstance(ref, str) and _NETWORK_FILES.has(ref)) or (isinstance(ref, dict) and "family" in ref):
        from workloads.networks.catalog import get_network

        return get_network(ref, field)
    if isinstance(ref, str) and ref.endswith(".json"):
        from hardware_specs.yaml_io import read_json
        from workloads.hf_config import spec_from_hf_config

        path = Path(ref)
        config = read_json(path, field)
        return spec_from_hf_config(config, name=path.parent.name or path.stem, field=field)
    if isinstance(ref, str) and not MODELS.has(ref) and not Path(ref).suffix and not Path(ref).exists():
        names = sorted(MODELS.names() + _NETWORK_FILES.names())
        raise ConfigError(field, f"unknown model {ref!r}{did_you_mean(ref, names)} (known: {', '.join(names)})")
    return MODELS.get(ref, field)
