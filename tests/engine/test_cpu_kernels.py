"""1x1 convolutions as matmuls (ppdlx.engine.cpu_kernels): same outputs and gradients as Paddle's
conv kernel, only where that holds (plain NHWC 1x1 convs)."""
import numpy as np
import paddle
import pytest

from ppdlx.engine.cpu_kernels import conv1x1_as_matmul
from ppdlx.models import MODELS


@pytest.mark.parametrize("stride,bias", [(1, False), (2, False), (2, True)])
def test_matmul_1x1_matches_conv_forward_and_backward(stride, bias):
    paddle.seed(0)
    conv = paddle.nn.Conv2D(16, 24, 1, stride=stride, data_format="NHWC", bias_attr=None if bias else False)
    x = paddle.randn([3, 9, 7, 16])
    outs, grads = [], []
    for patch in (False, True):
        if patch:
            assert conv1x1_as_matmul(conv) == 1
        xi = x.clone()
        xi.stop_gradient = False
        y = conv(xi)
        (y * paddle.arange(y.size, dtype="float32").reshape(y.shape) / y.size).sum().backward()
        outs.append(y.numpy())
        grads.append((xi.grad.numpy(), conv.weight.grad.numpy()))
        conv.clear_gradients()
    assert outs[0].shape == outs[1].shape == (3, (9 + stride - 1) // stride, (7 + stride - 1) // stride, 24)
    assert np.abs(outs[0] - outs[1]).max() < 1e-5
    assert np.abs(grads[0][0] - grads[1][0]).max() < 1e-5 and np.abs(grads[0][1] - grads[1][1]).max() < 1e-4


def test_only_plain_nhwc_1x1_convs_are_replaced():
    nchw = MODELS.build("resnet18_bottleneck_tiny", num_classes=4, data_format="NCHW")
    assert conv1x1_as_matmul(nchw) == 0
    nhwc = MODELS.build("resnet18_bottleneck_tiny", num_classes=4, data_format="NHWC")
    convs = [l for l in nhwc.sublayers() if isinstance(l, paddle.nn.Conv2D)]
    ones = [l for l in convs if list(l.weight.shape[2:]) == [1, 1]]
    assert 0 < conv1x1_as_matmul(nhwc) == len(ones) < len(convs)
    grouped = paddle.nn.Conv2D(8, 8, 1, groups=2, data_format="NHWC")
    assert conv1x1_as_matmul(grouped) == 0
