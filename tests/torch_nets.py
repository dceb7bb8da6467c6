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


class EncoderBlock(nn.Module):
    def __init__(self, heads: int, hidden: int, mlp: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(hidden, heads, dropout=0.0, batch_first=True)
        self.dropout = nn.Dropout(0.0)
        self.ln_2 = nn.LayerNorm(hidden, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(hidden, mlp), nn.GELU(), nn.Dropout(0.0), nn.Linear(mlp, hidden),
                                 nn.Dropout(0.0))

    def forward(self, inputs):
        x = self.ln_1(inputs)
        x, _ = self.self_attention(x, x, x, need_weights=False)
        x = self.dropout(x) + inputs
        return x + self.mlp(self.ln_2(x))


class VisionTransformer(nn.Module):
    def __init__(self, image: int = 224, patch: int = 16, layers: int = 12, heads: int = 12, hidden: int = 768,
                 mlp: int = 3072, num_classes: int = 1000):
        super().__init__()
        self.hidden = hidden
        self.conv_proj = nn.Conv2d(3, hidden, patch, patch)
        self.class_token = nn.Parameter(torch.zeros(1, 1, hidden))
        self.pos_embedding = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, hidden) * 0.02)
        self.layers = nn.Sequential(*[EncoderBlock(heads, hidden, mlp) for _ in range(layers)])
        self.ln = nn.LayerNorm(hidden, eps=1e-6)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x):
        n = x.shape[0]
        x = self.conv_proj(x).reshape(n, self.hidden, -1).permute(0, 2, 1)
        x = torch.cat([self.class_token.expand(n, -1, -1), x], dim=1)
        x = self.ln(self.layers(x + self.pos_embedding))
        return self.head(x[:, 0])


class UNet(nn.Module):
    """Ronneberger et al. 2015's U-Net (unpadded 3×3 convolutions, crop and concatenate)."""

    def __init__(self, in_channels: int = 1, classes: int = 2, base: int = 64, depth: int = 4):
        super().__init__()

        def double(c_in, c_out):
            return nn.Sequential(nn.Conv2d(c_in, c_out, 3), nn.ReLU(inplace=True), nn.Conv2d(c_out, c_out, 3),
                                 nn.ReLU(inplace=True))

        self.down = nn.ModuleList([double(in_channels if i == 0 else base * 2 ** (i - 1), base * 2 ** i)
                                   for i in range(depth)])
        self.pool = nn.MaxPool2d(2, 2)
        self.bottom = double(base * 2 ** (depth - 1), base * 2 ** depth)
        self.upconv = nn.ModuleList([nn.ConvTranspose2d(base * 2 ** (i + 1), base * 2 ** i, 2, 2)
                                     for i in range(depth)])
        self.up = nn.ModuleList([double(base * 2 ** (i + 1), base * 2 ** i) for i in range(depth)])
        self.out = nn.Conv2d(base, classes, 1)

    def forward(self, x):
        skips = []
        for block in self.down:
            x = block(x)
            skips.append(x)
            x = self.pool(x)
        x = self.bottom(x)
        for i in reversed(range(len(self.up))):
            x = self.upconv[i](x)
            skip = skips[i]
            dh, dw = (skip.shape[2] - x.shape[2]) // 2, (skip.shape[3] - x.shape[3]) // 2
            x = self.up[i](torch.cat([skip[:, :, dh:dh + x.shape[2], dw:dw + x.shape[3]], x], dim=1))
        return self.out(x)


class DataDependent(nn.Module):
    """Control flow on a tensor's values: torch.fx cannot trace it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        if x.sum() > 0:
            return self.fc(x)
        return x


class WithRecurrence(nn.Module):
    """A module kind the importer does not map (an LSTM)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.rnn = nn.LSTM(8, 8, batch_first=True)

    def forward(self, x):
        y = self.conv(x).flatten(2).transpose(1, 2)
        return self.rnn(y)[0]
