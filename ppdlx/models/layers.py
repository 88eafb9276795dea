"""Small building blocks shared by the model families."""
from __future__ import annotations

import paddle
import paddle.nn as nn


class ConvBNAct(nn.Layer):
    """Conv (no bias) -> BatchNorm -> optional activation, layout-aware."""

    def __init__(self, in_ch, out_ch, kernel_size, stride=1, groups=1, act="relu",
                 padding=None, data_format="NCHW", bn_eps=1e-5, bn_momentum=0.9, zero_init_gamma=False):
        super().__init__()
        if padding is None:
            padding = (kernel_size - 1) // 2
        self.conv = nn.Conv2D(in_ch, out_ch, kernel_size, stride=stride, padding=padding, groups=groups,
                              bias_attr=False, data_format=data_format,
                              weight_attr=nn.initializer.KaimingNormal())
        gamma = nn.initializer.Constant(0.0 if zero_init_gamma else 1.0)
        self.bn = nn.BatchNorm2D(out_ch, momentum=bn_momentum, epsilon=bn_eps, data_format=data_format,
                                 weight_attr=paddle.ParamAttr(initializer=gamma))
        self.act = make_activation(act)

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


def make_activation(name):
    if name is None or name == "none":
        return nn.Identity()
    table = {"relu": nn.ReLU, "swish": nn.Silu, "silu": nn.Silu, "sigmoid": nn.Sigmoid}
    if name not in table:
        raise ValueError(f"unknown activation '{name}' (known: {', '.join(sorted(table))})")
    return table[name]()
