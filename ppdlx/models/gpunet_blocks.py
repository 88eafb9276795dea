"""GPUNet's modules, one per JSON ``layer_type`` of each family (``ppdlx.models.gpunet`` documents
the format and the reference quirks).

Sub-layer names are the reference's (``conv_pw/bn1/conv_dw/bn2/se/conv_pwl/bn3``, ``net.N``,
``body.N``), so its checkpoints map by name. Every BatchNorm is a ``BatchNormAct2D`` owning the
activation that follows it; in the ``nn.Sequential`` containers such a pair keeps the two indices
the reference's separate BatchNorm and activation children had (``reference_sequential``).

Initialisation follows PyTorch's defaults (the reference does no custom init): conv and linear
weights and biases ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), BN gamma 1 / beta 0. BN momentum 0.9
(paddle convention) == PyTorch's 0.1.
"""
from __future__ import annotations

import paddle.nn as nn

from ppdlx.layers import BatchNormAct2D, Conv2D, SqueezeExcite, drop_path, fan_in_uniform, get_padding, make_divisible

BN_MOMENTUM = 0.9  # paddle's running = m*running + (1-m)*batch; == PyTorch momentum 0.1


def same_padding_static(kernel_size, stride=1, dilation=1):
    """Padding of the reference's ``create_conv2d(..., padding="same")``.

    Static "same" (stride 1, odd effective kernel) -> symmetric padding; otherwise the reference
    computes padding 0 and drops the dynamic-pad flag, i.e. VALID padding.
    """
    if stride == 1 and (dilation * (kernel_size - 1)) % 2 == 0:
        return get_padding(kernel_size, stride, dilation)
    return 0


def conv2d(in_ch, out_ch, kernel_size, stride=1, padding=0, groups=1, bias=False, data_format="NCHW"):
    fan_in = (in_ch // groups) * kernel_size * kernel_size
    return Conv2D(in_ch, out_ch, kernel_size, stride=stride, padding=padding, groups=groups,
                     data_format=data_format, weight_attr=fan_in_uniform(fan_in),
                     bias_attr=fan_in_uniform(fan_in) if bias else False)


def batch_norm(ch, eps, data_format, act=None):
    return BatchNormAct2D(ch, act, eps=eps, momentum=BN_MOMENTUM, data_format=data_format)


def linear(in_f, out_f):
    return nn.Linear(in_f, out_f, weight_attr=fan_in_uniform(in_f), bias_attr=fan_in_uniform(in_f))


def _torch_init(fan_in):
    return fan_in_uniform(fan_in), fan_in_uniform(fan_in)


def squeeze_excite(mid, exp_ratio, act, data_format):
    """The reference's SE: ``round(mid * 0.25 / exp_ratio)`` reduced channels (Python ``round``)."""
    return SqueezeExcite(mid, round(mid * (0.25 / exp_ratio)), act=act, data_format=data_format, init=_torch_init)


def reference_sequential(*layers):
    """``nn.Sequential`` numbered as the reference's, where each activation after a BatchNorm was a
    child of its own: a ``BatchNormAct2D`` with an activation takes two numbers (``net.4.weight``
    stays the reference's ``net.4.weight``)."""
    named, index = [], 0
    for layer in layers:
        named.append((str(index), layer))
        index += 2 if isinstance(layer, BatchNormAct2D) and not isinstance(layer.act, nn.Identity) else 1
    return nn.Sequential(*named)


class _Block(nn.Layer):
    """Common attributes: ``has_residual`` and the (stored) ``drop_path_rate`` of the block."""

    has_residual = False
    drop_path_rate = 0.0

    @property
    def effective_drop_path_rate(self):
        return self.drop_path_rate if self.has_residual else 0.0

    def _shape(self, in_ch, out_ch, stride, mid, drop_path_rate) -> int:
        """Record the block's ``mid`` channels, whether it is residual (shape kept) and its drop path; ``mid``."""
        self.mid_channels = mid
        self.has_residual = in_ch == out_ch and stride == 1
        self.drop_path_rate = drop_path_rate
        return mid

    def _residual(self, x, shortcut):
        if self.has_residual:
            if self.drop_path_rate > 0.0:
                x = drop_path(x, self.drop_path_rate, self.training)
            x = x + shortcut
        return x


class _Expanded(_Block):
    """An expanding residual block (irb, fused_irb): ``mid`` channels, an optional squeeze-excite on them, a 1x1
    projection to ``out_ch``; residual when the shape is kept."""

    @staticmethod
    def _project(mid, out_ch, exp_ratio, use_se, act, data_format) -> tuple:
        """``(squeeze-excite or Identity, 1x1 projection, its BN)``, built in that order."""
        se = squeeze_excite(mid, exp_ratio, act, data_format) if use_se else nn.Identity()
        return se, conv2d(mid, out_ch, 1, data_format=data_format), batch_norm(out_ch, 1e-3, data_format)


class _Sequential(_Block):
    """A block that is one ``reference_sequential`` called ``net``."""

    def forward(self, x):
        return self.net(x)


class _Tail(_Sequential):
    """The classifier block: ``net`` ends with the linear layer."""

    def reset_classifier(self, num_classes):
        name, old = list(self.net.named_children())[-1]
        self.net.add_sublayer(name, linear(old.weight.shape[0], num_classes))

    @property
    def classifier_name(self):
        return "net." + list(self.net.named_children())[-1][0]


# --------------------------------------------------------------- non-distill family
class Prologue(_Sequential):
    """head: conv3x3 s2 p1 -> BN(1e-3) -> act."""

    def __init__(self, in_ch, out_ch, act="swish", data_format="NCHW"):
        super().__init__()
        self.net = reference_sequential(conv2d(in_ch, out_ch, 3, stride=2, padding=1, data_format=data_format),
                                        batch_norm(out_ch, 1e-3, data_format, act))


class ConvBnAct(_Block):
    """conv: conv (symmetric pad) -> BN(1e-3) -> act; the reference builds it with skip=False."""

    def __init__(self, in_ch, out_ch, kernel_size, stride=1, act="relu", drop_path_rate=0.0,
                 data_format="NCHW"):
        super().__init__()
        self.drop_path_rate = drop_path_rate
        self.conv = conv2d(in_ch, out_ch, kernel_size, stride=stride, padding=get_padding(kernel_size, stride),
                           data_format=data_format)
        self.bn1 = batch_norm(out_ch, 1e-3, data_format, act)

    def forward(self, x):
        return self.bn1(self.conv(x))


class InvertedResidual(_Expanded):
    """irb: 1x1 expand -> BN -> act -> kxk depthwise -> BN -> act -> [SE] -> 1x1 project -> BN."""

    def __init__(self, in_ch, out_ch, kernel_size=3, stride=1, exp_ratio=1.0, use_se=False, act="relu",
                 drop_path_rate=0.0, data_format="NCHW"):
        super().__init__()
        mid = self._shape(in_ch, out_ch, stride, make_divisible(in_ch * exp_ratio), drop_path_rate)
        self.conv_pw = conv2d(in_ch, mid, 1, data_format=data_format)
        self.bn1 = batch_norm(mid, 1e-3, data_format, act)
        self.conv_dw = conv2d(mid, mid, kernel_size, stride=stride, padding=get_padding(kernel_size, stride),
                              groups=mid, data_format=data_format)
        self.bn2 = batch_norm(mid, 1e-3, data_format, act)
        self.se, self.conv_pwl, self.bn3 = self._project(mid, out_ch, exp_ratio, use_se, act, data_format)

    def forward(self, x):
        shortcut = x
        x = self.bn2(self.conv_dw(self.bn1(self.conv_pw(x))))
        x = self.bn3(self.conv_pwl(self.se(x)))
        return self._residual(x, shortcut)


class EdgeResidual(_Expanded):
    """fused_irb: kxk conv (stride, "same" pad quirk) -> BN -> act -> [SE] -> 1x1 project -> BN."""

    def __init__(self, in_ch, out_ch, kernel_size=3, stride=1, exp_ratio=1.0, use_se=False, act="relu",
                 drop_path_rate=0.0, data_format="NCHW"):
        super().__init__()
        mid = self._shape(in_ch, out_ch, stride, make_divisible(in_ch * exp_ratio), drop_path_rate)
        self.conv_exp = conv2d(in_ch, mid, kernel_size, stride=stride,
                               padding=same_padding_static(kernel_size, stride), data_format=data_format)
        self.bn1 = batch_norm(mid, 1e-3, data_format, act)
        self.se, self.conv_pwl, self.bn2 = self._project(mid, out_ch, exp_ratio, use_se, act, data_format)

    def forward(self, x):
        shortcut = x
        x = self.bn1(self.conv_exp(x))
        x = self.bn2(self.conv_pwl(self.se(x)))
        return self._residual(x, shortcut)


class Epilogue(_Tail):
    """tail: conv1x1 -> BN(1e-3) -> ReLU -> avgpool -> flatten -> dropout -> linear."""

    def __init__(self, in_ch, out_ch, num_classes, dropout=0.2, data_format="NCHW"):
        super().__init__()
        self.net = reference_sequential(conv2d(in_ch, out_ch, 1, data_format=data_format),
                                        batch_norm(out_ch, 1e-3, data_format, "relu"),
                                        nn.AdaptiveAvgPool2D(1, data_format=data_format), nn.Flatten(),
                                        nn.Dropout(p=dropout), linear(out_ch, num_classes))


# ------------------------------------------------------------------- distill family
class PrologueD(_Sequential):
    """head (distill): conv3x3 s2 p1 -> BN(1e-5) -> ReLU."""

    def __init__(self, in_ch, out_ch, data_format="NCHW"):
        super().__init__()
        self.net = reference_sequential(conv2d(in_ch, out_ch, 3, stride=2, padding=1, data_format=data_format),
                                        batch_norm(out_ch, 1e-5, data_format, "relu"))


class PrologueLargeD(_Sequential):
    """head_large (distill): PrologueD + 2 x [conv3x3 s1 p1 -> BN -> ReLU]."""

    def __init__(self, in_ch, out_ch, data_format="NCHW"):
        super().__init__()
        layers = []
        for i, stride in enumerate((2, 1, 1)):
            layers += [conv2d(in_ch if i == 0 else out_ch, out_ch, 3, stride=stride, padding=1,
                              data_format=data_format),
                       batch_norm(out_ch, 1e-5, data_format, "relu")]
        self.net = reference_sequential(*layers)


class _BodyD(_Block):
    """A distill-family residual block: one ``reference_sequential`` called ``body``, residual when the shape is
    kept."""

    def forward(self, x):
        return self._residual(self.body(x), x)


class InvertedResidualBlockD(_BodyD):
    """irb (distill): 1x1(groups) -> BN -> ReLU -> kxk dw (pad k//2) -> BN -> ReLU -> 1x1(groups) -> BN."""

    def __init__(self, in_ch, out_ch, kernel_size, stride, expansion, groups=1, drop_path_rate=0.0,
                 data_format="NCHW"):
        super().__init__()
        mid = self._shape(in_ch, out_ch, stride, in_ch * expansion, drop_path_rate)
        self.body = reference_sequential(
            conv2d(in_ch, mid, 1, groups=groups, data_format=data_format),
            batch_norm(mid, 1e-5, data_format, "relu"),
            conv2d(mid, mid, kernel_size, stride=stride, padding=kernel_size // 2, groups=mid,
                   data_format=data_format),
            batch_norm(mid, 1e-5, data_format, "relu"),
            conv2d(mid, out_ch, 1, groups=groups, data_format=data_format),
            batch_norm(out_ch, 1e-5, data_format))


class FusedIRBD(_BodyD):
    """fused_irb (distill): kxk conv (pad k//2) -> BN(1e-3) -> ReLU -> 1x1 -> BN(1e-3)."""

    def __init__(self, in_ch, out_ch, kernel_size, stride, expansion, drop_path_rate=0.0, data_format="NCHW"):
        super().__init__()
        mid = self._shape(in_ch, out_ch, stride, in_ch * expansion, drop_path_rate)
        self.body = reference_sequential(
            conv2d(in_ch, mid, kernel_size, stride=stride, padding=kernel_size // 2, data_format=data_format),
            batch_norm(mid, 1e-3, data_format, "relu"),
            conv2d(mid, out_ch, 1, data_format=data_format),
            batch_norm(out_ch, 1e-3, data_format))


class EpilogueD(_Tail):
    """tail (distill): conv1x1 ->1152 -> BN -> ReLU -> pool -> conv1x1 1152->out -> ReLU -> dropout -> linear."""

    width = 1152

    def __init__(self, in_ch, out_ch, num_classes, dropout=0.2, data_format="NCHW"):
        super().__init__()
        w = self.width
        self.net = reference_sequential(conv2d(in_ch, w, 1, data_format=data_format),
                                        batch_norm(w, 1e-5, data_format, "relu"),
                                        nn.AdaptiveAvgPool2D(1, data_format=data_format),
                                        conv2d(w, out_ch, 1, data_format=data_format), nn.ReLU(),
                                        nn.Flatten(), nn.Dropout(p=dropout), linear(out_ch, num_classes))
