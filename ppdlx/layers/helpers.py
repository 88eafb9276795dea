"""Channel rounding, padding and initialisation rules the families share."""
from __future__ import annotations

import math

import paddle
import paddle.nn as nn


def make_divisible(v, divisor=8, min_value=None, round_limit=0.9):
    """timm's rule: the nearest multiple of ``divisor`` (at least ``min_value``, default ``divisor``),
    one ``divisor`` more if rounding lost over 10 %."""
    min_value = min_value or divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < round_limit * v:
        new_v += divisor
    return new_v


def get_padding(kernel_size, stride=1, dilation=1):
    """Symmetric padding ``((stride - 1) + dilation * (kernel_size - 1)) // 2`` (timm's; for odd
    kernels the "same" padding ``(kernel_size - 1) // 2`` at any stride)."""
    return ((stride - 1) + dilation * (kernel_size - 1)) // 2


def fan_in_uniform(fan_in):
    """``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``: PyTorch's default for conv and linear weights and biases."""
    bound = 1.0 / math.sqrt(fan_in)
    return paddle.ParamAttr(initializer=nn.initializer.Uniform(-bound, bound))
