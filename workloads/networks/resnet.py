"""ResNets (He et al. 2016, arXiv:1512.03385, Table 1) as torchvision builds them (v1.5: the stride
sits on the 3×3 convolution of a bottleneck), and wide ResNets (Zagoruyko & Komodakis 2016,
arXiv:1605.07146; torchvision's ``wide_resnet*_2``: bottleneck width ×2 via ``width_per_group``),
ResNeXts (Xie et al. 2017, arXiv:1611.05431, Table 1: ``groups`` = cardinality, ``width_per_group`` =
bottleneck width d) and SE-ResNeXts (Hu et al. 2018, arXiv:1709.01507, Table 1: a squeeze-and-excitation
block with reduction ``se_reduction`` on each bottleneck's residual branch before the add).

Stem: 7×7/2 convolution (64), batch norm, ReLU, 3×3/2 max pool; four stages of blocks (the first
block of stages 2–4 strides by 2, a 1×1/stride projection with batch norm on its shortcut); global
average pool; a fully connected classifier. ReLUs and the residual add run in place, as torchvision's.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from workloads.networks.blocks import squeeze_excitation
from workloads.networks.builder import NetBuilder, Tensor
from workloads.networks.spec import NetworkSpec


class ResNetSpec(NetworkSpec):
    """A ResNet: ``blocks`` per stage of ``block`` kind; bottleneck width = 64·2^stage·width_per_group/64."""

    family: Literal["resnet"] = "resnet"
    block: Literal["basic", "bottleneck"] = "bottleneck"
    blocks: tuple[int, int, int, int] = (3, 4, 6, 3)
    width_per_group: int = Field(default=64, gt=0)
    groups: int = Field(default=1, gt=0)
    se_reduction: int | None = Field(default=None, gt=0)   # squeeze-and-excitation C -> C/r after conv3 (SE-ResNeXt)
    num_classes: int = Field(default=1000, gt=0)
    image_size: int = Field(default=224, gt=0)

    def _build(self, net: NetBuilder) -> None:
        x = net.input(3, self.image_size, self.image_size)
        x = net.conv2d("conv1", x, 64, 7, stride=2, padding=3)
        x = net.batchnorm("bn1", x)
        x = net.relu("relu", x)
        x = net.maxpool("maxpool", x, 3, 2, 1)
        expansion = 4 if self.block == "bottleneck" else 1
        for stage, count in enumerate(self.blocks):
            planes = 64 * 2 ** stage
            for i in range(count):
                stride = 2 if stage > 0 and i == 0 else 1
                name = f"layer{stage + 1}.{i}"
                if self.block == "bottleneck":
                    x = self._bottleneck(net, name, x, planes, stride, expansion)
                else:
                    x = self._basic(net, name, x, planes, stride)
        x = net.adaptive_avgpool("avgpool", x, 1)
        x = net.flatten("flatten", x)
        net.linear("fc", x, self.num_classes)

    def _shortcut(self, net: NetBuilder, name: str, x: Tensor, out_channels: int, stride: int) -> Tensor:
        if stride == 1 and x.shape[0] == out_channels:
            return x
        s = net.conv2d(f"{name}.downsample.0", x, out_channels, 1, stride=stride)
        return net.batchnorm(f"{name}.downsample.1", s)

    def _bottleneck(self, net: NetBuilder, name: str, x: Tensor, planes: int, stride: int, expansion: int) -> Tensor:
        width = planes * self.width_per_group // 64 * self.groups
        out = net.conv2d(f"{name}.conv1", x, width, 1)
        out = net.relu(f"{name}.relu1", net.batchnorm(f"{name}.bn1", out))
        out = net.conv2d(f"{name}.conv2", out, width, 3, stride=stride, padding=1, groups=self.groups)
        out = net.relu(f"{name}.relu2", net.batchnorm(f"{name}.bn2", out))
        out = net.batchnorm(f"{name}.bn3", net.conv2d(f"{name}.conv3", out, planes * expansion, 1))
        if self.se_reduction is not None:
            out = squeeze_excitation(net, f"{name}.se", out, planes * expansion // self.se_reduction)
        identity = self._shortcut(net, name, x, planes * expansion, stride)
        out = net.add(f"{name}.add", out, identity, inplace=True)
        return net.relu(f"{name}.relu3", out)

    def _basic(self, net: NetBuilder, name: str, x: Tensor, planes: int, stride: int) -> Tensor:
        out = net.conv2d(f"{name}.conv1", x, planes, 3, stride=stride, padding=1)
        out = net.relu(f"{name}.relu1", net.batchnorm(f"{name}.bn1", out))
        out = net.batchnorm(f"{name}.bn2", net.conv2d(f"{name}.conv2", out, planes, 3, padding=1))
        identity = self._shortcut(net, name, x, planes, stride)
        out = net.add(f"{name}.add", out, identity, inplace=True)
        return net.relu(f"{name}.relu2", out)
