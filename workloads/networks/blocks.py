"""Blocks shared by the CNN families that go beyond plain convolutions: squeeze-and-excitation
(Hu et al. 2018, arXiv:1709.01507, Fig. 3 / Eq. 2-4) and the inverted-residual MBConv block with
a depthwise convolution (Sandler et al. 2018, arXiv:1801.04381, Table 1; Tan & Le 2019,
arXiv:1905.11946, Sec. 4), as torchvision 0.28 (``ops/misc.py`` ``SqueezeExcitation``,
``models/efficientnet.py`` ``MBConv``) and NVIDIA DeepLearningExamples (ConvNets ``resnet.py``,
``efficientnet.py``) build them.

A depthwise convolution is a convolution with ``groups`` = channels (one input channel per output
channel); it is priced as a grouped convolution (simulator/cost/conv.py ``grouped_conv_time_s``),
not as one dense implicit GEMM.
"""

from __future__ import annotations

from workloads.networks.builder import NetBuilder, Tensor


def squeeze_excitation(net: NetBuilder, name: str, x: Tensor, squeeze_channels: int,
                       activation: str = "relu") -> Tensor:
    """Global average pool, a 1×1 convolution with bias to ``squeeze_channels``, ``activation``
    (ReLU in SE-ResNeXt, SiLU in EfficientNet), a 1×1 convolution with bias back to C, a sigmoid,
    and the channel-wise product with ``x`` (Hu et al. 2018 Eq. 2-4). Parameters 2·C·s + s + C."""
    channels = x.shape[0]
    s = net.adaptive_avgpool(f"{name}.avgpool", x, 1)
    s = net.conv2d(f"{name}.fc1", s, squeeze_channels, 1, bias=True)
    s = net.relu(f"{name}.act", s) if activation == "relu" else net.activation(f"{name}.act", s, activation)
    s = net.conv2d(f"{name}.fc2", s, channels, 1, bias=True)
    s = net.activation(f"{name}.sigmoid", s, "sigmoid")
    return net.scale(f"{name}.scale", x, s)


def conv_bn_act(net: NetBuilder, name: str, x: Tensor, out_channels: int, kernel: int, stride: int = 1,
                groups: int = 1, activation: str | None = "silu") -> Tensor:
    """Convolution (no bias, 'same' padding (k-1)/2), batch norm, optional activation:
    torchvision's ``Conv2dNormActivation``."""
    x = net.conv2d(f"{name}.conv", x, out_channels, kernel, stride=stride, padding=(kernel - 1) // 2, groups=groups)
    x = net.batchnorm(f"{name}.bn", x)
    if activation is None:
        return x
    return net.relu(f"{name}.act", x) if activation == "relu" else net.activation(f"{name}.act", x, activation)


def mbconv(net: NetBuilder, name: str, x: Tensor, expand_ratio: int, kernel: int, stride: int,
           out_channels: int, se_ratio: float = 0.25, se_on_expanded: bool = False) -> Tensor:
    """An MBConv block: 1×1 expansion (when ``expand_ratio`` > 1), a k×k depthwise convolution with
    ``stride``, squeeze-and-excitation with SiLU, a 1×1 projection with batch norm and no
    activation, and the residual add when the shape is kept (stride 1, same channels).

    The squeeze width is ``se_ratio`` × the block's *input* channels (torchvision, the EfficientNet
    paper's reference code), or × the expanded channels with ``se_on_expanded`` (NVIDIA DLE's
    "widese" EfficientNets: ``squeeze_hidden=True``). Stochastic depth in training is a per-sample
    scale of the residual branch: left out (one elementwise kernel per block)."""
    in_channels = x.shape[0]
    hidden = in_channels * expand_ratio
    out = x
    if expand_ratio != 1:
        out = conv_bn_act(net, f"{name}.expand", out, hidden, 1)
    out = conv_bn_act(net, f"{name}.depthwise", out, hidden, kernel, stride, groups=hidden)
    base = hidden if se_on_expanded else in_channels
    out = squeeze_excitation(net, f"{name}.se", out, max(1, int(base * se_ratio)), "silu")
    out = conv_bn_act(net, f"{name}.project", out, out_channels, 1, activation=None)
    if stride == 1 and in_channels == out_channels:
        out = net.add(f"{name}.add", out, x)
    return out
