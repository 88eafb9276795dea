"""What export and evaluation refuse to use: weights that are not finite (a diverged run's checkpoint) would deploy
a model that predicts NaN, or score a meaningless accuracy, so they are one line naming the first such tensor, as
training's own check says."""
from __future__ import annotations

import numpy as np
import paddle

from ppdlx.engine.dynamic_step import LayerWeights
from ppdlx.engine.step import NonFiniteWeightsError

# use -> what non-finite weights would do there
_CONSEQUENCE = {"export": "an export of these weights would predict NaN/inf",
                "evaluate": "these weights predict NaN/inf, so any accuracy measured from them is meaningless"}


def check_finite_weights(model, weights: str, use: str = "export") -> None:
    """Raise :class:`NonFiniteWeightsError` (exit 4) naming the first parameter or buffer holding NaN or inf;
    ``use`` ("export" | "evaluate") is what the message says the weights were loaded for."""
    labels, flags = LayerWeights(model).finite_flags()
    if flags is None or bool(flags.all()):
        return
    bad = np.flatnonzero(~flags.numpy())
    first = labels[bad[0]]
    kind = "NaN" if bool(paddle.isnan(model.state_dict()[first]).any()) else "inf"
    raise NonFiniteWeightsError(
        f"model.weights={weights}: '{first}' holds {kind} (non-finite tensors: {bad.size} of {len(labels)}); "
        f"{_CONSEQUENCE[use]}: {use} a checkpoint saved before the run diverged (an earlier epoch_N) or retrain "
        f"with a lower lr.base_lr")
