"""The catalog of networks other than decoder transformers (``workloads/models/networks/*.yaml``),
one spec class per family, told apart by the ``family`` key."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, RootModel, ValidationError

from hardware_specs.catalog import YamlCatalog
from simulator.errors import from_pydantic
from workloads.networks.bert import BertSpec
from workloads.networks.efficientnet import EfficientNetSpec
from workloads.networks.inception import InceptionV3Spec
from workloads.networks.profiles import ProfiledModelSpec
from workloads.networks.resnet import ResNetSpec
from workloads.networks.rnn import BigLSTMSpec, GNMTSpec
from workloads.networks.spec import NetworkSpec
from workloads.networks.unet import UNetSpec
from workloads.networks.vgg import VGGSpec
from workloads.networks.vit import ViTSpec

FamilySpec = Annotated[ResNetSpec | EfficientNetSpec | VGGSpec | InceptionV3Spec | ViTSpec | UNetSpec | GNMTSpec | BigLSTMSpec | BertSpec
                       | ProfiledModelSpec, Field(discriminator="family")]


class NetworkEntry(RootModel[FamilySpec]):
    """A catalog entry: one of the family specs, chosen by its ``family``."""


NETWORKS = YamlCatalog("model", Path(__file__).parent.parent / "models" / "networks", NetworkEntry)


def network_names() -> list[str]:
    return NETWORKS.names()


def get_network(ref: str | dict[str, Any], field: str = "model") -> NetworkSpec:
    """A network spec from a catalog name, a YAML path or a mapping with a ``family`` key."""
    if isinstance(ref, dict):
        try:
            return NetworkEntry.model_validate(ref).root
        except ValidationError as exc:  # the family tag is not a key the user wrote: model.name, not model.profile.name
            raise from_pydantic(exc, field, drop_tags=True) from None
    return NETWORKS.get(ref, field).root
