"""ppdlx.layers.drop_path: one stochastic-depth convention (drop probability, as timm) for every family."""
import numpy as np
import paddle

from ppdlx.layers import drop_path


def test_drop_path_function():
    paddle.seed(3)
    x = paddle.ones([4000, 2, 3, 3])
    assert drop_path(x, 0.25, training=False) is x
    y = drop_path(x, 0.25, training=True).numpy()
    per_sample = y.reshape(4000, -1)
    assert np.all(per_sample.min(1) == per_sample.max(1))  # whole sample kept or dropped
    np.testing.assert_allclose(np.unique(per_sample), [0.0, 1 / 0.75], rtol=1e-6)  # x / keep * {0, 1}
    assert abs((per_sample[:, 0] > 0).mean() - 0.75) < 0.03
    assert abs(y.mean() - 1.0) < 0.04


def test_drop_path_keeps_expectation_and_is_off_in_eval():
    # EfficientNet's former drop_connect(x, survival_prob=0.8) is drop_path(x, drop_prob=0.2)
    paddle.seed(0)
    x = paddle.ones([4000, 1, 2, 2])
    y = drop_path(x, 0.2, training=True).numpy()
    per_sample = y[:, 0, 0, 0]
    assert set(np.unique(per_sample).round(4)) == {0.0, 1.25}
    assert abs(per_sample.mean() - 1.0) < 0.05
    assert (y == y[:, :1, :1, :1]).all()  # whole samples are dropped
    assert np.array_equal(drop_path(x, 0.2, training=False).numpy(), x.numpy())


def test_zero_drop_probability_consumes_no_random_numbers():
    x = paddle.ones([8, 3])
    paddle.seed(5)
    assert drop_path(x, 0.0, training=True) is x
    after = paddle.rand([4]).numpy()
    paddle.seed(5)
    np.testing.assert_array_equal(after, paddle.rand([4]).numpy())
