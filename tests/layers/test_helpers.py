"""ppdlx.layers helpers: timm's channel rounding, symmetric padding, PyTorch's default init."""
import math

import numpy as np
import paddle

from ppdlx.layers import fan_in_uniform, get_padding, make_divisible


def test_make_divisible():
    assert make_divisible(96 * 7.67) == 736
    assert make_divisible(704 * 2.55) == 1792
    assert make_divisible(3) == 8
    assert make_divisible(20) == 24  # int(24)//8*8 = 24
    assert make_divisible(11) == 16  # 8 < 0.9*11 -> +8


def test_get_padding_keeps_odd_kernels_centred_at_any_stride():
    assert [get_padding(k, s) for k, s in ((1, 1), (1, 2), (3, 1), (3, 2), (5, 2), (7, 2))] == [0, 0, 1, 1, 2, 3]
    assert get_padding(3, 1, dilation=2) == 2


def test_fan_in_uniform_bounds():
    paddle.seed(0)
    layer = paddle.nn.Linear(64, 4000, weight_attr=fan_in_uniform(64))
    w = layer.weight.numpy()
    assert np.abs(w).max() <= 1 / math.sqrt(64) and np.abs(w).max() > 0.99 / math.sqrt(64)
