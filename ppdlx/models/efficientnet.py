"""EfficientNet-B0 and EfficientNet-Lite0 (TF layout: 'SAME' padding, BN momentum 0.99 / eps 1e-3).

Usable as a classifier (``efficientnet_b0`` in ``MODELS``, 5,288,548 trainable
parameters at 1000 classes, same as the TF/Keras B0) or, with
``features_only=True``, as a detection backbone whose ``forward`` returns the
stride 8/16/32 feature maps (40/112/320 channels).

``efficientnet_lite0`` is TF's EfficientNet-Lite0 (4,652,008 trainable parameters): the B0 stage
table without squeeze-excite and with ReLU6 instead of swish (both quantise better). The Lite
family keeps the stem (32) and head (1280) widths fixed while its larger members scale the
stages; at Lite0's width multiplier of 1.0 the table is B0's. Its published weights expect
``(pixel - 127) / 128`` (TF's Lite preprocessing), which its ``default_cfg`` records.

Stride-2 convolutions use paddle's ``padding="SAME"``, which pads like TF
(the extra pixel goes right/bottom), so 512 -> 256 -> 128 -> 64 -> 32 -> 16 and
odd sizes give ``(s - 1) // 2 + 1``.

The input must already be normalised (mean/std) by the data pipeline: unlike the
NVIDIA TF2 reference (``rescale_input=True``) the model does not normalise a
second time.
"""
from __future__ import annotations

import math

import paddle
import paddle.nn as nn

from ppdlx.layers import ConvNormAct, SqueezeExcite, drop_path
from ppdlx.models.model_cfg import check_num_classes, classification_cfg
from ppdlx.registry import MODELS

BN_MOMENTUM = 0.99  # paddle: running = 0.99 * running + 0.01 * batch (same as Keras 0.99)
BN_EPS = 1e-3

# (in, out, kernel, repeats, expand ratio, stride) per stage; se_ratio 0.25 everywhere.
B0_STAGES = (
    (32, 16, 3, 1, 1, 1),
    (16, 24, 3, 2, 6, 2),
    (24, 40, 5, 2, 6, 2),
    (40, 80, 3, 3, 6, 2),
    (80, 112, 5, 3, 6, 1),
    (112, 192, 5, 4, 6, 2),
    (192, 320, 3, 1, 6, 1),
)
# Stage indices whose outputs are the detection endpoints (strides 8, 16, 32).
B0_FEATURE_STAGES = (2, 4, 6)


# TF's EfficientNet-Lite input scaling, in 0..255 pixel units.
LITE_MEAN = (127.0, 127.0, 127.0)
LITE_STD = (128.0, 128.0, 128.0)


def _conv_bn(in_ch, out_ch, k, stride=1, groups=1, act="swish", data_format="NCHW"):
    return ConvNormAct(in_ch, out_ch, k, stride=stride, groups=groups, act=act, padding="SAME",
                       data_format=data_format, eps=BN_EPS, momentum=BN_MOMENTUM)


class MBConv(nn.Layer):
    """Inverted residual: [expand 1x1] -> depthwise kxk -> SE -> project 1x1 (+ residual).
    ``act`` follows the expand and depthwise convs and sits inside the SE gate."""

    def __init__(self, in_ch, out_ch, kernel_size, stride, expand_ratio, se_ratio=0.25,
                 drop_path_rate=0.0, data_format="NCHW", act="swish"):
        super().__init__()
        mid = in_ch * expand_ratio
        self.expand = _conv_bn(in_ch, mid, 1, act=act, data_format=data_format) if expand_ratio != 1 else None
        self.depthwise = _conv_bn(mid, mid, kernel_size, stride=stride, groups=mid, act=act, data_format=data_format)
        self.se = (SqueezeExcite(mid, max(1, int(in_ch * se_ratio)), act=act, data_format=data_format,
                                 names=("reduce", "expand"))
                   if se_ratio and se_ratio > 0 else None)
        self.project = _conv_bn(mid, out_ch, 1, act=None, data_format=data_format)
        self.has_residual = stride == 1 and in_ch == out_ch
        self.drop_path_rate = drop_path_rate

    def forward(self, x):
        y = x if self.expand is None else self.expand(x)
        y = self.depthwise(y)
        if self.se is not None:
            y = self.se(y)
        y = self.project(y)
        if self.has_residual:
            y = drop_path(y, self.drop_path_rate, self.training) + x
        return y


class EfficientNet(nn.Layer):
    """EfficientNet with the B0 stage table by default.

    ``act`` is the activation of the stem, every block and the head (``create_act`` name);
    ``se_ratio=0`` leaves squeeze-excite out.
    ``features_only=False``: ``forward(x) -> logits [N, num_classes]``.
    ``features_only=True``: no head; ``forward(x) -> [C3, C4, C5]`` (strides 8/16/32,
    channels ``feature_channels``).
    """

    def __init__(self, stages=B0_STAGES, num_classes=1000, in_channels=3, data_format="NCHW",
                 drop_connect_rate=0.2, dropout=0.2, features_only=False, stem_width=32,
                 head_width=1280, se_ratio=0.25, feature_stages=B0_FEATURE_STAGES, act="swish"):
        super().__init__()
        if data_format not in ("NCHW", "NHWC"):
            raise ValueError(f"data_format must be NCHW or NHWC, got {data_format!r}")
        self.data_format = data_format
        self.num_classes = num_classes
        self.features_only = features_only
        self.feature_stages = tuple(feature_stages)
        self.stem = _conv_bn(in_channels, stem_width, 3, stride=2, act=act, data_format=data_format)
        total = sum(s[3] for s in stages)
        blocks_done, stage_layers = 0, []
        for in_ch, out_ch, k, repeats, expand, stride in stages:
            blocks = []
            for j in range(repeats):
                rate = drop_connect_rate * blocks_done / total
                blocks.append(MBConv(in_ch if j == 0 else out_ch, out_ch, k, stride if j == 0 else 1,
                                     expand, se_ratio, rate, data_format, act))
                blocks_done += 1
            stage_layers.append(nn.Sequential(*blocks))
        self.stages = nn.LayerList(stage_layers)
        self.feature_channels = tuple(stages[i][1] for i in self.feature_stages)
        strides, s = [], 2
        for st in stages:
            s *= st[5]
            strides.append(s)
        self.feature_strides = tuple(strides[i] for i in self.feature_stages)
        self.num_features = stages[-1][1]
        if not features_only:
            self.head = _conv_bn(stages[-1][1], head_width, 1, act=act, data_format=data_format)
            self.avgpool = nn.AdaptiveAvgPool2D(1, data_format=data_format)
            self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
            self.num_features = head_width
            self.fc = self._classifier(num_classes)
        self.default_cfg = classification_cfg(224, 0.875, "bicubic", classifier=None if features_only else "fc")

    def _classifier(self, num_classes):
        bound = 1.0 / math.sqrt(num_classes)  # TF dense init range 1/sqrt(units)
        return nn.Linear(self.num_features, num_classes,
                         weight_attr=paddle.ParamAttr(initializer=nn.initializer.Uniform(-bound, bound)),
                         bias_attr=paddle.ParamAttr(initializer=nn.initializer.Constant(0.0)))

    def reset_classifier(self, num_classes):
        """A new, freshly initialised ``fc`` with ``num_classes`` outputs; every other weight is kept."""
        if self.features_only:
            raise ValueError("a features_only EfficientNet has no classifier to reset")
        self.num_classes = check_num_classes(num_classes)
        self.fc = self._classifier(num_classes)

    def forward_stages(self, x):
        """The output of every stage (7 maps for B0)."""
        x = self.stem(x)
        outs = []
        for stage in self.stages:
            x = stage(x)
            outs.append(x)
        return outs

    def forward_features(self, x):
        """``features_only``: the ``feature_stages`` maps (C3, C4, C5); otherwise the head conv's map
        (``num_features`` channels)."""
        stages = self.forward_stages(x)
        if self.features_only:
            return [stages[i] for i in self.feature_stages]
        return self.head(stages[-1])

    def forward_head(self, features):
        return self.fc(self.dropout(paddle.flatten(self.avgpool(features), 1)))

    def forward(self, x):
        features = self.forward_features(x)
        return features if self.features_only else self.forward_head(features)


@MODELS.register("efficientnet_b0")
def efficientnet_b0(num_classes=1000, data_format="NCHW", drop_connect_rate=0.2, dropout=0.2,
                    in_channels=3, features_only=False):
    return EfficientNet(B0_STAGES, num_classes, in_channels, data_format, drop_connect_rate, dropout,
                        features_only)


@MODELS.register("efficientnet_lite0")
def efficientnet_lite0(num_classes=1000, data_format="NCHW", drop_connect_rate=0.2, dropout=0.2,
                       in_channels=3, features_only=False):
    model = EfficientNet(B0_STAGES, num_classes, in_channels, data_format, drop_connect_rate, dropout,
                         features_only, stem_width=32, head_width=1280, se_ratio=0.0, act="relu6")
    model.default_cfg = classification_cfg(224, 0.875, "bicubic", classifier=model.default_cfg["classifier"],
                                           mean=LITE_MEAN, std=LITE_STD)
    return model
