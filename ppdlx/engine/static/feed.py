"""Loader batches as executor feeds: paddle Tensors are handed over as the ``DenseTensor`` they
hold, so batches stay on their device (no device -> host -> device copy per batch on GPU)."""
from __future__ import annotations

import numpy as np
import paddle
from paddle.base import core


def as_feed(x, dtype: str, flat: bool = False):
    """A loader output as an executor feed of ``dtype`` (``flat``: 1-D).

    Paddle Tensors (and ``DenseTensor``s) are cast/reshaped where they live and handed over as a
    ``DenseTensor`` sharing their memory (the executor takes those as they are:
    ``Executor._pir_feed_data``); numpy input stays numpy (the executor copies it once).
    """
    if isinstance(x, core.DenseTensor):
        x = paddle.Tensor(x, place=x._place())  # same place: shares the memory
    if isinstance(x, paddle.Tensor):
        if x.dtype != getattr(paddle, dtype):
            x = x.astype(dtype)
        if flat and len(x.shape) != 1:
            x = x.reshape([-1])
        if not x.is_contiguous():
            x = x.contiguous()
        dense = core.DenseTensor()
        dense._share_data_with(x.get_tensor())  # keeps the memory alive after ``x`` is gone
        return dense
    x = np.asarray(x, dtype=dtype)
    return x.reshape(-1) if flat else x


def feed_shape(x) -> tuple:
    """Shape of a feed value (``DenseTensor.shape`` is a method)."""
    return tuple(int(d) for d in (x.shape() if callable(x.shape) else x.shape))


def feed_rows(x) -> int:
    """Leading dimension of a feed value."""
    return feed_shape(x)[0]
