"""PyTorch reference modules for the layer-graph tests (torch only: no CPU torchvision wheel for
torch 2.13 exists here), written after torchvision 0.28's ``resnet.py`` and ``vgg.py``, and a
measure of the activation bytes autograd saves."""

from __future__ import annotations

import torch
from torch import nn


def saved_activation_bytes(module: nn.Module, sample: torch.Tensor) -> int:
    """Bytes of the distinct storages autograd saves during ``module(sample)``, parameters and
    buffers left out (``torch.autograd.graph.saved_tensors_hooks``)."""
    own = {t.untyped_storage().data_ptr() for t in [*module.parameters(), *module.buffers()]}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        if storage.data_ptr() not in own and storage.nbytes():
            storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(sample)
    del out
    return sum(storages.values())


class Bottleneck(nn.Module):
    def __init__(self, inplanes: int, planes: int, stride: int, width: int):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(inplanes, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, planes * 4, 1, bias=False), nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != planes * 4:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes * 4, 1, stride, bias=False),
                                            nn.BatchNorm2d(planes * 4))

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    def __init__(self, blocks=(3, 4, 6, 3), width_per_group: int = 64, num_classes: int = 1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        layers, inplanes = [], 64
        for stage, count in enumerate(blocks):
            planes = 64 * 2 ** stage
            stage_blocks = []
            for i in range(count):
                stage_blocks.append(Bottleneck(inplanes, planes, 2 if stage and not i else 1,
                                               planes * width_per_group // 64))
                inplanes = planes * 4
            layers.append(nn.Sequential(*stage_blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(2048, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def vgg16(dropout: float = 0.5) -> nn.Sequential:
    layers: list[nn.Module] = []
    channels = 3
    for item in (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"):
        if item == "M":
            layers.append(nn.MaxPool2d(2, 2))
        else:
            layers += [nn.Conv2d(channels, item, 3, padding=1), nn.ReLU(inplace=True)]
            channels = item
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d((7, 7)), nn.Flatten(),
                         nn.Linear(512 * 49, 4096), nn.ReLU(True), nn.Dropout(dropout),
                         nn.Linear(4096, 4096), nn.ReLU(True), nn.Dropout(dropout), nn.Linear(4096, 1000))
