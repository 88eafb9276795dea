"""ppdlx.layers.SqueezeExcite: the gate's arithmetic and its checkpoint-facing sub-layer names."""
import numpy as np
import paddle

from ppdlx.layers import SqueezeExcite, fan_in_uniform


def test_gate_matches_the_formula_in_both_layouts():
    paddle.seed(0)
    se = SqueezeExcite(6, 2, act="swish")
    x = paddle.randn([2, 6, 5, 4])
    s = x.numpy().mean(axis=(2, 3))  # [2, 6]
    w1, b1 = se.conv_reduce.weight.numpy()[:, :, 0, 0], se.conv_reduce.bias.numpy()
    w2, b2 = se.conv_expand.weight.numpy()[:, :, 0, 0], se.conv_expand.bias.numpy()
    h = s @ w1.T + b1
    h = h / (1 + np.exp(-h))
    gate = 1 / (1 + np.exp(-(h @ w2.T + b2)))
    np.testing.assert_allclose(se(x).numpy(), x.numpy() * gate[:, :, None, None], rtol=1e-5, atol=1e-6)
    nhwc = SqueezeExcite(6, 2, act="swish", data_format="NHWC")
    nhwc.set_state_dict(se.state_dict())
    y = nhwc(x.transpose([0, 2, 3, 1])).transpose([0, 3, 1, 2])
    np.testing.assert_allclose(y.numpy(), se(x).numpy(), rtol=1e-5, atol=1e-6)


def test_names_and_initialisation_are_the_callers():
    keras = SqueezeExcite(8, 2, names=("reduce", "expand"))
    assert list(keras.state_dict()) == ["reduce.weight", "reduce.bias", "expand.weight", "expand.bias"]
    assert float(keras.reduce.bias.abs().max()) == 0.0  # Paddle's default zero bias
    torch_like = SqueezeExcite(8, 2, init=lambda fan_in: (fan_in_uniform(fan_in), fan_in_uniform(fan_in)))
    assert list(torch_like.state_dict()) == ["conv_reduce.weight", "conv_reduce.bias", "conv_expand.weight",
                                             "conv_expand.bias"]
    assert float(torch_like.conv_expand.bias.abs().max()) > 0.0 and torch_like.rd_channels == 2
