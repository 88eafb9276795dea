"""ppdlx.layers: BatchNormAct2D is a BatchNorm2D to every caller (keys, parameter names, isinstance)
that also knows its activation, and every model family builds its BatchNorms from it."""
import numpy as np
import paddle
import pytest

from ppdlx.layers import BatchNormAct2D, ConvNormAct, create_act
from ppdlx.models import MODELS


def test_batch_norm_act_is_a_batch_norm_with_the_same_state_and_parameter_names():
    with paddle.utils.unique_name.guard():
        plain = paddle.nn.BatchNorm2D(4, momentum=0.99, epsilon=1e-3)
    with paddle.utils.unique_name.guard():
        fused = BatchNormAct2D(4, "relu", eps=1e-3, momentum=0.99)
    assert isinstance(fused, paddle.nn.BatchNorm2D)
    assert [(k, v.name) for k, v in fused.state_dict().items()] == [(k, v.name) for k, v in plain.state_dict().items()]
    assert (fused._epsilon, fused._momentum) == (1e-3, 0.99)
    x = paddle.randn([3, 4, 5, 5])
    np.testing.assert_array_equal(fused(x).numpy(), paddle.nn.functional.relu(plain(x)).numpy())


def test_conv_norm_act_layout_and_zero_init():
    block = ConvNormAct(3, 8, 3, stride=2, act=None, zero_init_gamma=True)
    assert list(block.state_dict()) == ["conv.weight", "bn.weight", "bn.bias", "bn._mean", "bn._variance"]
    assert block.conv._padding == 1 and block.conv.bias is None and isinstance(block.bn.act, paddle.nn.Identity)
    assert float(block.bn.weight.abs().max()) == 0.0
    assert block(paddle.randn([2, 3, 9, 9])).shape == [2, 8, 5, 5]
    same = ConvNormAct(3, 8, 3, stride=2, padding="SAME", data_format="NHWC")
    assert same(paddle.randn([1, 9, 9, 3])).shape == [1, 5, 5, 8]


def test_create_act():
    assert [type(create_act(n)).__name__ for n in ("relu", "relu6", "swish", "silu", "sigmoid", None, "none")] == [
        "ReLU", "ReLU6", "Silu", "Silu", "Sigmoid", "Identity", "Identity"]
    np.testing.assert_array_equal(create_act("relu6")(paddle.to_tensor([-1.0, 3.0, 6.5])).numpy(), [0.0, 3.0, 6.0])
    with pytest.raises(ValueError, match="unknown activation 'gelu'"):
        create_act("gelu")


@pytest.mark.parametrize("name", ["resnet18_bottleneck_tiny", "gpunet_0", "gpunet_d1", "efficientnet_b0",
                                  "efficientnet_lite0", "efficientdet_d0"])
def test_every_batch_norm_of_every_family_knows_its_activation(name):
    model = MODELS.build(name)
    norms = [layer for layer in model.sublayers() if isinstance(layer, paddle.nn.layer.norm._BatchNormBase)]
    assert norms and all(type(layer) is BatchNormAct2D for layer in norms)
