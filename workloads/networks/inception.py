"""Inception-v3 (Szegedy et al. 2016, arXiv:1512.00567, Table 1 and Figs. 5–7) at 299×299, as
torchvision 0.28's ``inception_v3`` builds it: every convolution a ``BasicConv2d`` (convolution
without bias, batch norm, in-place ReLU); modules A (Mixed_5b–d), B (6a), C (6b–e, factorised 7×7),
D (7a), E (7b–c, expanded 3×3); the auxiliary classifier on Mixed_6e's output (training mode);
global average pool, dropout 0.5, fully connected classifier. Branches read the same input and
are concatenated along the channels."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from workloads.networks.builder import NetBuilder, Tensor
from workloads.networks.spec import NetworkSpec

Pair = int | tuple[int, int]


class InceptionV3Spec(NetworkSpec):
    """Inception-v3; ``aux_logits`` keeps the auxiliary classifier (torchvision's default)."""

    family: Literal["inception_v3"] = "inception_v3"
    aux_logits: bool = True
    dropout: float = Field(default=0.5, ge=0, lt=1)
    num_classes: int = Field(default=1000, gt=0)
    image_size: int = Field(default=299, ge=75)

    def _build(self, net: NetBuilder) -> None:
        def conv(name: str, x: Tensor, out: int, kernel: Pair, stride: int = 1, padding: Pair = 0) -> Tensor:
            x = net.conv2d(f"{name}.conv", x, out, kernel, stride=stride, padding=padding)
            return net.relu(f"{name}.relu", net.batchnorm(f"{name}.bn", x))

        x = net.input(3, self.image_size, self.image_size)
        x = conv("Conv2d_1a_3x3", x, 32, 3, stride=2)
        x = conv("Conv2d_2a_3x3", x, 32, 3)
        x = conv("Conv2d_2b_3x3", x, 64, 3, padding=1)
        x = net.maxpool("maxpool1", x, 3, 2)
        x = conv("Conv2d_3b_1x1", x, 80, 1)
        x = conv("Conv2d_4a_3x3", x, 192, 3)
        x = net.maxpool("maxpool2", x, 3, 2)
        for name, pool_features in (("Mixed_5b", 32), ("Mixed_5c", 64), ("Mixed_5d", 64)):
            x = net.concat(f"{name}.cat", [
                conv(f"{name}.branch1x1", x, 64, 1),
                conv(f"{name}.branch5x5_2", conv(f"{name}.branch5x5_1", x, 48, 1), 64, 5, padding=2),
                conv(f"{name}.branch3x3dbl_3", conv(f"{name}.branch3x3dbl_2", conv(
                    f"{name}.branch3x3dbl_1", x, 64, 1), 96, 3, padding=1), 96, 3, padding=1),
                conv(f"{name}.branch_pool", net.avgpool(f"{name}.avg_pool", x, 3, 1, 1), pool_features, 1),
            ])
        x = net.concat("Mixed_6a.cat", [
            conv("Mixed_6a.branch3x3", x, 384, 3, stride=2),
            conv("Mixed_6a.branch3x3dbl_3", conv("Mixed_6a.branch3x3dbl_2", conv(
                "Mixed_6a.branch3x3dbl_1", x, 64, 1), 96, 3, padding=1), 96, 3, stride=2),
            net.maxpool("Mixed_6a.max_pool", x, 3, 2),
        ])
        for name, c7 in (("Mixed_6b", 128), ("Mixed_6c", 160), ("Mixed_6d", 160), ("Mixed_6e", 192)):
            b1 = conv(f"{name}.branch1x1", x, 192, 1)  # first, in torchvision's InceptionC._forward order
            b7 = conv(f"{name}.branch7x7_1", x, c7, 1)
            b7 = conv(f"{name}.branch7x7_2", b7, c7, (1, 7), padding=(0, 3))
            b7 = conv(f"{name}.branch7x7_3", b7, 192, (7, 1), padding=(3, 0))
            bd = conv(f"{name}.branch7x7dbl_1", x, c7, 1)
            for i, (out, kernel, pad) in enumerate(((c7, (7, 1), (3, 0)), (c7, (1, 7), (0, 3)),
                                                     (c7, (7, 1), (3, 0)), (192, (1, 7), (0, 3))), start=2):
                bd = conv(f"{name}.branch7x7dbl_{i}", bd, out, kernel, padding=pad)
            x = net.concat(f"{name}.cat", [
                b1, b7, bd,
                conv(f"{name}.branch_pool", net.avgpool(f"{name}.avg_pool", x, 3, 1, 1), 192, 1)])
        if self.aux_logits:
            a = net.avgpool("AuxLogits.avg_pool", x, 5, 3)
            a = conv("AuxLogits.conv1", conv("AuxLogits.conv0", a, 128, 1), 768, 5)
            a = net.flatten("AuxLogits.flatten", net.adaptive_avgpool("AuxLogits.adaptive_avgpool", a, 1))
            net.linear("AuxLogits.fc", a, self.num_classes)
        b3 = conv("Mixed_7a.branch3x3_2", conv("Mixed_7a.branch3x3_1", x, 192, 1), 320, 3, stride=2)
        b7 = conv("Mixed_7a.branch7x7x3_1", x, 192, 1)
        b7 = conv("Mixed_7a.branch7x7x3_2", b7, 192, (1, 7), padding=(0, 3))
        b7 = conv("Mixed_7a.branch7x7x3_3", b7, 192, (7, 1), padding=(3, 0))
        b7 = conv("Mixed_7a.branch7x7x3_4", b7, 192, 3, stride=2)
        x = net.concat("Mixed_7a.cat", [b3, b7, net.maxpool("Mixed_7a.max_pool", x, 3, 2)])
        for name in ("Mixed_7b", "Mixed_7c"):
            b1 = conv(f"{name}.branch1x1", x, 320, 1)  # first, in torchvision's InceptionE._forward order
            b3 = conv(f"{name}.branch3x3_1", x, 384, 1)
            b3 = net.concat(f"{name}.branch3x3_cat", [
                conv(f"{name}.branch3x3_2a", b3, 384, (1, 3), padding=(0, 1)),
                conv(f"{name}.branch3x3_2b", b3, 384, (3, 1), padding=(1, 0))])
            bd = conv(f"{name}.branch3x3dbl_2", conv(f"{name}.branch3x3dbl_1", x, 448, 1), 384, 3, padding=1)
            bd = net.concat(f"{name}.branch3x3dbl_cat", [
                conv(f"{name}.branch3x3dbl_3a", bd, 384, (1, 3), padding=(0, 1)),
                conv(f"{name}.branch3x3dbl_3b", bd, 384, (3, 1), padding=(1, 0))])
            x = net.concat(f"{name}.cat", [
                b1, b3, bd,
                conv(f"{name}.branch_pool", net.avgpool(f"{name}.avg_pool", x, 3, 1, 1), 192, 1)])
        x = net.dropout("dropout", net.adaptive_avgpool("avgpool", x, 1), self.dropout)
        net.linear("fc", net.flatten("flatten", x), self.num_classes)
