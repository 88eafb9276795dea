"""Squeeze-and-excitation channel gate."""
from __future__ import annotations

import paddle.nn as nn

from ppdlx.layers.activations import create_act
from ppdlx.layers.conv import Conv2D


def kaiming_normal_weights(fan_in):
    """Kaiming-normal weights, Paddle's default (zero) bias: the Keras-port initialisation."""
    return nn.initializer.KaimingNormal(), None


class SqueezeExcite(nn.Layer):
    """``x * sigmoid(expand(act(reduce(mean_hw(x)))))``, ``reduce``/``expand`` 1x1 convs with bias
    (``channels -> rd_channels -> channels``).

    ``init(fan_in) -> (weight_attr, bias_attr)`` initialises each conv. ``names`` are the two convs'
    sub-layer names, which are the checkpoints' parameter names: timm/NVIDIA call them
    ``conv_reduce``/``conv_expand``, ppdlx's EfficientNet ``reduce``/``expand``."""

    def __init__(self, channels, rd_channels, act="relu", data_format="NCHW", init=kaiming_normal_weights,
                 names=("conv_reduce", "conv_expand")):
        super().__init__()
        # A global average pool, not mean(axis=H, W): Paddle Inference runs pool2d on oneDNN's pooling
        # kernel, but the mean over the spatial axes of an NHWC tensor on oneDNN's reference reduction
        # (measured in docs/cpu_speed.md, GPUNet).
        self.squeeze = nn.AdaptiveAvgPool2D(1, data_format=data_format)
        self.rd_channels = rd_channels
        self._reduce_name, self._expand_name = names
        for name, cin, cout in ((names[0], channels, rd_channels), (names[1], rd_channels, channels)):
            weight_attr, bias_attr = init(cin)
            self.add_sublayer(name, Conv2D(cin, cout, 1, data_format=data_format, weight_attr=weight_attr,
                                              bias_attr=bias_attr))
        self.act = create_act(act)
        self.gate = nn.Sigmoid()

    def forward(self, x):
        s = self.squeeze(x)
        s = self._sub_layers[self._expand_name](self.act(self._sub_layers[self._reduce_name](s)))
        return x * self.gate(s)
