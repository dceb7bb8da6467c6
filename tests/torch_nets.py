"""PyTorch reference modules for the layer-graph tests (they need torch alone; tests/test_networks.py
also checks the catalog against torchvision's own modules), written after torchvision 0.28's
``resnet.py`` and ``vgg.py``, and a measure of the activation bytes autograd saves."""

from __future__ import annotations

import math

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


class SquaredFeatures(nn.Module):
    """A feature map times itself (not a per-channel gate): the importer refuses the product."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        y = self.conv(x)
        return y * y


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



# EfficientNet (torchvision 0.28 models/efficientnet.py: Conv2dNormActivation with in-place SiLU,
# SqueezeExcitation, MBConv with the in-place residual add; stochastic depth left out).

def make_divisible(v, d=8):
    n = max(d, int(v + d / 2) // d * d)
    return n + d if n < 0.9 * v else n


def cna(cin, cout, k, s=1, g=1, act=True):
    layers = [nn.Conv2d(cin, cout, k, s, (k - 1) // 2, groups=g, bias=False), nn.BatchNorm2d(cout)]
    if act:
        layers.append(nn.SiLU(inplace=True))
    return nn.Sequential(*layers)


class SE(nn.Module):
    def __init__(self, c, s):
        super().__init__()
        self.avgpool, self.fc1, self.fc2 = nn.AdaptiveAvgPool2d(1), nn.Conv2d(c, s, 1), nn.Conv2d(s, c, 1)
        self.act, self.sig = nn.SiLU(inplace=True), nn.Sigmoid()
    def forward(self, x):
        return self.sig(self.fc2(self.act(self.fc1(self.avgpool(x))))) * x


class MBConv(nn.Module):
    def __init__(self, cin, e, k, s, cout, wide=False):
        super().__init__()
        h = cin * e
        layers = [cna(cin, h, 1)] if e != 1 else []
        layers += [cna(h, h, k, s, h), SE(h, max(1, int((h if wide else cin) * 0.25))), cna(h, cout, 1, act=False)]
        self.block, self.res = nn.Sequential(*layers), s == 1 and cin == cout
    def forward(self, x):
        r = self.block(x)
        if self.res:
            r += x
        return r


B0 = [(1,3,1,32,16,1),(6,3,2,16,24,2),(6,5,2,24,40,2),(6,3,2,40,80,3),(6,5,1,80,112,3),(6,5,2,112,192,4),(6,3,1,192,320,1)]


def efficientnet(w=1.0, d=1.0, dropout=0.2, wide=False):
    layers = [cna(3, make_divisible(32 * w), 3, 2)]
    c = make_divisible(32 * w)
    for e, k, s, _, o, n in B0:
        o = make_divisible(o * w)
        for i in range(math.ceil(n * d)):
            layers.append(MBConv(c, e, k, s if i == 0 else 1, o, wide))
            c = o
    layers.append(cna(c, 4 * c, 1))
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout), nn.Linear(4 * c, 1000))



# ResNeXt / SE-ResNeXt (torchvision's Bottleneck with groups; Hu et al. 2018's SE block before the add).

class SEBottleneck(nn.Module):
    """torchvision's Bottleneck with ``groups`` (ResNeXt) and, with ``se``, Hu et al.'s SE block before the add."""
    def __init__(self, inplanes, planes, stride, width, groups, se):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(inplanes, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = nn.Conv2d(width, width, 3, stride, 1, groups=groups, bias=False), nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, planes * 4, 1, bias=False), nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.se = None
        if se:
            c = planes * 4
            self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(c, c // se, 1), nn.ReLU(inplace=True),
                                    nn.Conv2d(c // se, c, 1), nn.Sigmoid())
        self.downsample = None
        if stride != 1 or inplanes != planes * 4:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes * 4, 1, stride, bias=False),
                                            nn.BatchNorm2d(planes * 4))

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.se is not None:
            out = out * self.se(out)
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


def resnext(blocks=(3, 4, 23, 3), groups=32, width_per_group=4, se=None):
    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
    inplanes = 64
    for stage, n in enumerate(blocks):
        planes = 64 * 2 ** stage
        for i in range(n):
            layers.append(SEBottleneck(inplanes, planes, 2 if stage and not i else 1,
                                       planes * width_per_group // 64 * groups, groups, se))
            inplanes = planes * 4
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000))


# The operations of ConvNeXt, ShuffleNet V2, MnasNet and RegNet that the importer maps (torchvision 0.28's
# convnext.py, shufflenetv2.py, mnasnet.py, regnet.py), in one small module.

class ChannelsLastNorm(nn.LayerNorm):
    """torchvision's LayerNorm2d: the functional layer norm over channels of a permuted feature map."""

    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = nn.functional.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class MixedOps(nn.Module):
    """Channel split (chunk), a channel shuffle (transpose + contiguous copy), a functional layer norm,
    a learned per-channel layer scale and a mean over H x W; its widths computed with tensors in the
    constructor (``.tolist()``, as RegNet's), which the meta device cannot run."""

    def __init__(self, channels: int = 16, classes: int = 10):
        super().__init__()
        width = int(torch.tensor([channels]).tolist()[0])
        self.stem = nn.Conv2d(3, width, 3, 2, 1)
        self.norm = ChannelsLastNorm(width)
        self.branch = nn.Sequential(nn.Conv2d(width // 2, width // 2, 3, 1, 1, groups=width // 2), nn.BatchNorm2d(width // 2),
                                    nn.ReLU(inplace=True))
        self.layer_scale = nn.Parameter(torch.full((width, 1, 1), 1e-6))
        self.fc = nn.Linear(width, classes)

    def forward(self, x):
        x = self.norm(self.stem(x))
        left, right = x.chunk(2, dim=1)
        x = torch.cat((left, self.branch(right)), dim=1)
        n, c, h, w = x.size()
        x = torch.transpose(x.view(n, 2, c // 2, h, w), 1, 2).contiguous().view(n, -1, h, w)
        x = self.layer_scale * x
        return self.fc(x.mean([2, 3]))
