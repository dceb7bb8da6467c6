"""EfficientNets (Tan & Le 2019, arXiv:1905.11946, Table 1 and Sec. 3.3) as torchvision 0.28 builds
them (``models/efficientnet.py``: ``_efficientnet_conf``, ``_make_divisible`` to multiples of 8).

B0's stages (expand ratio, kernel, stride, input channels, output channels, layers): (1,3,1,32,16,1),
(6,3,2,16,24,2), (6,5,2,24,40,2), (6,3,2,40,80,3), (6,5,1,80,112,3), (6,5,2,112,192,4),
(6,3,1,192,320,1). A scaled model multiplies the channels by ``width_mult`` (rounded to a multiple
of 8, never below 90% of the product) and the layers by ``depth_mult`` (rounded up). Stem: 3×3/2
convolution to 32·w channels, batch norm, SiLU; head: 1×1 convolution to 4× the last stage's
channels, batch norm, SiLU, global average pool, dropout, a fully connected classifier.
Published: B0 (1.0, 1.0) at 224×224, 5,288,548 parameters, 0.39 GFLOPs (multiply-adds, the
paper's Table 2); B4 (1.4, 1.8) at 380×380, 19,341,616 parameters (torchvision).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from workloads.networks.blocks import conv_bn_act, mbconv
from workloads.networks.builder import NetBuilder
from workloads.networks.spec import NetworkSpec

#: EfficientNet-B0 stages: (expand ratio, kernel, stride, input channels, output channels, layers).
B0_STAGES: tuple[tuple[int, int, int, int, int, int], ...] = (
    (1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
    (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1))


def make_divisible(value: float, divisor: int = 8) -> int:
    """torchvision's ``_make_divisible``: the nearest multiple of ``divisor``, not below 90% of value."""
    new = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * value else new


class EfficientNetSpec(NetworkSpec):
    """An EfficientNet: B0's stages scaled by ``width_mult`` and ``depth_mult`` at ``image_size``."""

    family: Literal["efficientnet"] = "efficientnet"
    width_mult: float = Field(default=1.0, gt=0)
    depth_mult: float = Field(default=1.0, gt=0)
    image_size: int = Field(default=224, gt=0)
    dropout: float = Field(default=0.2, ge=0, lt=1)
    se_on_expanded: bool = False
    num_classes: int = Field(default=1000, gt=0)

    def _build(self, net: NetBuilder) -> None:
        x = net.input(3, self.image_size, self.image_size)
        x = conv_bn_act(net, "features.0", x, make_divisible(32 * self.width_mult), 3, 2)
        for stage, (expand, kernel, stride, _, out, layers) in enumerate(B0_STAGES):
            out_channels = make_divisible(out * self.width_mult)
            for i in range(math.ceil(layers * self.depth_mult)):
                x = mbconv(net, f"features.{stage + 1}.{i}", x, expand, kernel, stride if i == 0 else 1,
                           out_channels, se_on_expanded=self.se_on_expanded)
        x = conv_bn_act(net, "features.8", x, 4 * x.shape[0], 1)
        x = net.adaptive_avgpool("avgpool", x, 1)
        x = net.flatten("flatten", x)
        x = net.dropout("classifier.0", x, self.dropout)
        net.linear("classifier.1", x, self.num_classes)
