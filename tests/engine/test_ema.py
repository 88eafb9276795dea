"""ModelEMA.swapped_into keeps BN statistics re-estimated for the EMA weights (detection's precise
BN) and restores the raw model exactly."""
import numpy as np
import paddle

from ppdlx.engine.ema import ModelEMA


def test_statistics_recomputed_while_swapped_in_stay_with_the_ema_weights():
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Conv2D(3, 4, 3), paddle.nn.BatchNorm2D(4))
    ema = ModelEMA(model, 0.9)
    with paddle.no_grad():
        model[0].weight.set_value(model[0].weight * 2)  # raw weights now differ from the EMA copy
    raw = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    with ema.swapped_into(model):
        model.train()
        model(paddle.randn([2, 3, 8, 8]) * 5 + 3)  # a train-mode forward moves the BN statistics
        recomputed = model[1]._mean.numpy().copy()
    assert np.abs(recomputed).max() > 0.1
    assert np.allclose(ema.shadow["1._mean"].numpy(), recomputed)
    assert np.allclose(ema.shadow["0.weight"].numpy() * 2, raw["0.weight"])  # EMA weights unchanged
    for k, v in model.state_dict().items():
        assert np.array_equal(v.numpy(), raw[k]), k  # raw model restored, statistics included
