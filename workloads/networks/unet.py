"""U-Net (Ronneberger, Fischer & Brox 2015, arXiv:1505.04597, Fig. 1 and Sec. 2): a 572×572
one-channel tile; a contracting path of four steps, each two unpadded 3×3 convolutions with ReLU
then a 2×2/2 max pool (64, 128, 256, 512 channels), a bottom of two 3×3 convolutions (1024); an
expansive path of four steps, each a 2×2/2 up-convolution halving the channels, the centre crop
of the matching contracting feature map concatenated, two unpadded 3×3 convolutions with ReLU;
a 1×1 convolution to the classes (2). Output 388×388. Convolutions carry biases, no batch norm
(the paper predates it); ReLUs in place. ``padding=1`` gives the "same" variant common in PyTorch
ports (output = input size)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from workloads.networks.builder import NetBuilder, Tensor
from workloads.networks.spec import NetworkSpec


class UNetSpec(NetworkSpec):
    """A 2-D U-Net of ``depth`` pooling steps from ``base_channels`` (the paper: 4 and 64)."""

    family: Literal["unet"] = "unet"
    image_size: int = Field(default=572, gt=0)
    in_channels: int = Field(default=1, gt=0)
    num_classes: int = Field(default=2, gt=0)
    base_channels: int = Field(default=64, gt=0)
    depth: int = Field(default=4, gt=0)
    padding: Literal[0, 1] = 0

    @model_validator(mode="after")
    def _tile(self) -> UNetSpec:
        size = self.image_size
        for _ in range(self.depth):
            size -= 4 * (1 - self.padding)
            if size <= 0 or size % 2:
                raise ValueError(f"image_size {self.image_size}: every 2x2 max pool needs an even size (Sec. 2)")
            size //= 2
        if size - 4 * (1 - self.padding) <= 0:
            raise ValueError(f"image_size {self.image_size} is too small for depth {self.depth}")
        return self

    def _build(self, net: NetBuilder) -> None:
        def double_conv(name: str, x: Tensor, channels: int) -> Tensor:
            x = net.relu(f"{name}.relu1", net.conv2d(f"{name}.conv1", x, channels, 3, padding=self.padding,
                                                     bias=True))
            return net.relu(f"{name}.relu2", net.conv2d(f"{name}.conv2", x, channels, 3, padding=self.padding,
                                                        bias=True))

        x = net.input(self.in_channels, self.image_size, self.image_size)
        skips = []
        for i in range(self.depth):
            x = double_conv(f"down{i + 1}", x, self.base_channels * 2 ** i)
            skips.append(x)
            x = net.maxpool(f"down{i + 1}.pool", x, 2, 2)
        x = double_conv("bottom", x, self.base_channels * 2 ** self.depth)
        for i in reversed(range(self.depth)):
            channels = self.base_channels * 2 ** i
            x = net.conv_transpose2d(f"up{i + 1}.upconv", x, channels, 2, 2)
            skip = net.crop(skips[i], x.shape[1], x.shape[2])
            x = double_conv(f"up{i + 1}", net.concat(f"up{i + 1}.cat", [skip, x]), channels)
        net.conv2d("out", x, self.num_classes, 1, bias=True)
