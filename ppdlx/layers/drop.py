"""Stochastic depth."""
from __future__ import annotations

import paddle


def drop_path(x, drop_prob: float = 0.0, training: bool = False):
    """Per-sample stochastic depth: each sample of the batch is zeroed with probability ``drop_prob``
    and the survivors are divided by ``keep = 1 - drop_prob`` (``x / keep * floor(keep + U[0, 1))``),
    so the expectation is unchanged. Identity in eval mode or at ``drop_prob == 0``."""
    if drop_prob == 0.0 or not training:
        return x
    keep = 1.0 - drop_prob
    shape = [x.shape[0]] + [1] * (x.ndim - 1)
    mask = paddle.floor(keep + paddle.rand(shape, dtype=x.dtype))
    return x / keep * mask
