"""What export refuses to write: weights that are not finite (a diverged run's checkpoint) would deploy a
model that predicts NaN, so they are one line naming the first such tensor, as training's own check says."""
from __future__ import annotations

import numpy as np
import paddle

from ppdlx.engine.dynamic_step import LayerWeights
from ppdlx.engine.step import NonFiniteWeightsError


def check_finite_weights(model, weights: str) -> None:
    """Raise :class:`NonFiniteWeightsError` (exit 4) naming the first parameter or buffer holding NaN or inf."""
    labels, flags = LayerWeights(model).finite_flags()
    if flags is None or bool(flags.all()):
        return
    bad = np.flatnonzero(~flags.numpy())
    first = labels[bad[0]]
    kind = "NaN" if bool(paddle.isnan(model.state_dict()[first]).any()) else "inf"
    raise NonFiniteWeightsError(
        f"model.weights={weights}: '{first}' holds {kind} (non-finite tensors: {bad.size} of {len(labels)}); an "
        f"export of these weights would predict NaN/inf: export a checkpoint saved before the run diverged (an "
        f"earlier epoch_N) or retrain with a lower lr.base_lr")
