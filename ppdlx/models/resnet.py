"""ResNet v1.5 (stride on the 3x3 conv of downsampling bottlenecks).

Matches NVIDIA's RN50 v1.5 layout: 25,557,032 parameters at 1000 classes. Built under
``layer_config(cpu_kernels=True)`` (``ppdlx.layers.config``) a bottleneck ends its training forward with one oneDNN
add + ReLU pass (exact in float32), and with ``bf16=True`` too the network trains with bf16 activations between
its layers (``ppdlx.models.resnet_bf16``); evaluation always takes the float32 forward below.
"""
from __future__ import annotations

import paddle
import paddle.nn as nn

import ppdlx.models.resnet_bf16 as resnet_bf16
from ppdlx.layers import ConvNormAct, MaxPool2D, fan_in_uniform, get_layer_config
from ppdlx.models.model_cfg import check_num_classes, classification_cfg
from ppdlx.ops import onednn
from ppdlx.registry import MODELS


class Bottleneck(nn.Layer):
    expansion = 4

    def __init__(self, in_ch, width, stride, data_format, zero_init_last_bn):
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = ConvNormAct(in_ch, width, 1, data_format=data_format)
        # v1.5: the stride sits on the 3x3 conv, not on the first 1x1 (v1).
        self.conv2 = ConvNormAct(width, width, 3, stride=stride, data_format=data_format)
        self.conv3 = ConvNormAct(width, out_ch, 1, act=None, data_format=data_format,
                                 zero_init_gamma=zero_init_last_bn)
        self.shortcut = None
        if stride != 1 or in_ch != out_ch:
            self.shortcut = ConvNormAct(in_ch, out_ch, 1, stride=stride, act=None, data_format=data_format)
        # An identity unless the model is quantized: then the residual input is fake-quantized before the
        # add, where NVIDIA's QAT (quant_aware's AddQuantDequantForResidual) quantizes it (ppdlx.models.qat).
        self.residual_quant = nn.quant.Stub()
        self.relu = nn.ReLU()
        self.cpu_kernel = "add_relu" if get_layer_config().cpu_kernels and type(self) is Bottleneck else None

    def forward(self, x):
        identity = self.residual_quant(x if self.shortcut is None else self.shortcut(x))
        y = self.conv3(self.conv2(self.conv1(x)))
        # Evaluation keeps Paddle's add and ReLU, as the batch norms keep Paddle's kernels there.
        if self.cpu_kernel == "add_relu" and self.training:
            return onednn.add_relu(y, identity)
        return self.relu(y + identity)


class ResNet(nn.Layer):
    def __init__(self, depths=(3, 4, 6, 3), num_classes=1000, in_channels=3, data_format="NCHW",
                 zero_init_last_bn=False, widths=(64, 128, 256, 512), stem_width=64):
        super().__init__()
        if data_format not in ("NCHW", "NHWC"):
            raise ValueError(f"data_format must be NCHW or NHWC, got {data_format!r}")
        self.data_format = data_format
        self.num_classes = num_classes
        self.stem = ConvNormAct(in_channels, stem_width, 7, stride=2, data_format=data_format)
        self.pool = MaxPool2D(3, stride=2, padding=1, data_format=data_format)
        stages, in_ch = [], stem_width
        for i, (depth, width) in enumerate(zip(depths, widths)):
            blocks = []
            for j in range(depth):
                stride = 2 if (i > 0 and j == 0) else 1
                blocks.append(Bottleneck(in_ch, width, stride, data_format, zero_init_last_bn))
                in_ch = width * Bottleneck.expansion
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.LayerList(stages)
        self.num_features = in_ch
        self.avgpool = nn.AdaptiveAvgPool2D(1, data_format=data_format)
        self.fc = self._classifier(num_classes)
        self.default_cfg = classification_cfg(224, 0.875, "bilinear", classifier="fc")
        config = get_layer_config()
        self.bf16_activations = (config.cpu_kernels and config.bf16 and type(self) is ResNet
                                 and resnet_bf16.covers(self))
        self.bf16_activation_blocks = len(resnet_bf16.blocks(self)) if self.bf16_activations else 0

    def _classifier(self, num_classes):
        return nn.Linear(self.num_features, num_classes, weight_attr=fan_in_uniform(self.num_features))

    def reset_classifier(self, num_classes):
        """A new, freshly initialised ``fc`` with ``num_classes`` outputs; every other weight is kept."""
        self.num_classes = check_num_classes(num_classes)
        self.fc = self._classifier(num_classes)

    def forward_features(self, x):
        """The last stage's feature map (``num_features`` channels, stride 32)."""
        if self.bf16_activations and resnet_bf16.trains_whole(self):
            return resnet_bf16.forward_features(self, x)
        return self.forward_features_float32(x)

    def forward_features_float32(self, x):
        x = self.pool(self.stem(x))
        for stage in self.stages:
            x = stage(x)
        return x

    def forward_head(self, features):
        return self.fc(paddle.flatten(self.avgpool(features), 1))

    def forward(self, x):
        return self.forward_head(self.forward_features(x))


@MODELS.register("resnet50")
def resnet50(num_classes=1000, data_format="NCHW", in_channels=3, zero_init_last_bn=False):
    return ResNet((3, 4, 6, 3), num_classes, in_channels, data_format, zero_init_last_bn)


@MODELS.register("resnet18_bottleneck_tiny")
def resnet_tiny(num_classes=10, data_format="NCHW", in_channels=3, zero_init_last_bn=False):
    """A 4-stage, one-block-per-stage bottleneck ResNet at quarter width: for fast tests."""
    return ResNet((1, 1, 1, 1), num_classes, in_channels, data_format, zero_init_last_bn,
                  widths=(16, 32, 64, 128), stem_width=16)
