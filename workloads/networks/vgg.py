"""VGG (Simonyan & Zisserman 2015, arXiv:1409.1556, Table 1) as torchvision builds it: 3×3
convolutions (padding 1, with bias) each followed by an in-place ReLU, 2×2/2 max pools, a 7×7
adaptive average pool, and a classifier of three linear layers with ReLU and dropout 0.5.
Configuration D is VGG-16; ``batch_norm`` adds a batch norm after every convolution."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from workloads.networks.builder import NetBuilder
from workloads.networks.spec import NetworkSpec

CONFIGS: dict[str, tuple[int | str, ...]] = {
    "A": (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    "B": (64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    "D": (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"),
    "E": (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M"),
}


class VGGSpec(NetworkSpec):
    """A VGG of configuration ``config`` (Table 1 of the paper: A = VGG-11, D = VGG-16, E = VGG-19)."""

    family: Literal["vgg"] = "vgg"
    config: Literal["A", "B", "D", "E"] = "D"
    batch_norm: bool = False
    dropout: float = Field(default=0.5, ge=0, lt=1)
    num_classes: int = Field(default=1000, gt=0)
    image_size: int = Field(default=224, gt=0)

    def _build(self, net: NetBuilder) -> None:
        x = net.input(3, self.image_size, self.image_size)
        for i, item in enumerate(CONFIGS[self.config]):
            if item == "M":
                x = net.maxpool(f"features.{i}.pool", x, 2, 2)
                continue
            x = net.conv2d(f"features.{i}.conv", x, int(item), 3, padding=1, bias=True)
            if self.batch_norm:
                x = net.batchnorm(f"features.{i}.bn", x)
            x = net.relu(f"features.{i}.relu", x)
        x = net.flatten("flatten", net.adaptive_avgpool("avgpool", x, 7))
        x = net.dropout("classifier.2", net.relu("classifier.1", net.linear("classifier.0", x, 4096)), self.dropout)
        x = net.dropout("classifier.5", net.relu("classifier.4", net.linear("classifier.3", x, 4096)), self.dropout)
        net.linear("classifier.6", x, self.num_classes)
