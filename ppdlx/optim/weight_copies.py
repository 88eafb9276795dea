"""Every stored copy of a weight under training, by its structured name: the parameter, the fp32 master an
AMP O2 / ``multi_precision`` optimizer keeps, and the EMA shadow.

:class:`WeightAccess` is what a hook that edits weights in place (``ppdlx.sparsity.ASPHook``) and the
non-finite checks (the trainer's, export's) read and write through, whichever step holds the weights: each
step strategy of ``ppdlx.engine`` returns one from ``weights()``; :class:`LayerWeights` is the one over a
dygraph Layer, its optimizer and a ``ModelEMA``.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Tuple

import numpy as np
import paddle

LOW_PRECISION = (paddle.float16, paddle.bfloat16)


def master_weights(optimizer) -> dict:
    """Parameter name -> fp32 master of an AMP O2 / ``multi_precision`` optimizer (wrapped or not)."""
    for opt in (optimizer, getattr(optimizer, "_inner_opt", None), getattr(optimizer, "_optimizer", None)):
        mw = getattr(opt, "_master_weights", None)
        if isinstance(mw, dict) and mw:
            return mw
    return {}


class WeightAccess:
    """Every stored copy of a weight, by the structured name of ``model.state_dict()``: what a hook
    that edits weights in place (ASP) needs, whichever step holds them.

    ``copies(name)`` -> ``{"param" | "master" | "ema": getter}``, each getter returning a paddle
    Tensor that shares the copy's memory (in-place ops change the weight); ``read(name)`` -> the
    float32 value (the master where AMP O2 keeps one); ``masters_pending(name)``: a master will
    appear at the optimizer's first step; ``ema_updated_in_step``: the EMA is updated inside
    ``run`` (so before the ``after_step`` hooks) rather than by the EMA hook after them.
    """
    model: Any = None
    ema_updated_in_step: bool = False

    def copies(self, name: str) -> Dict[str, Callable[[], Any]]:
        raise NotImplementedError

    def read(self, name: str) -> np.ndarray:
        raise NotImplementedError

    def masters_pending(self, name: str) -> bool:
        return False

    def finite_flags(self) -> Tuple[List[str], Any]:
        """``(labels, flags)``: a label per floating copy of every weight and buffer (``name``, ``name (AMP
        master)``, ``name (EMA shadow)``) and a device bool tensor, one flag per copy, True where the copy
        is finite (None without copies). Nothing is read back here: the caller reads the flags once, after
        reducing them over ranks."""
        labels, flags = [], []
        if self.model is None:
            return labels, None
        for name in self.model.state_dict():
            for kind, get in self.copies(name).items():
                tensor = get()
                if tensor.is_floating_point():
                    labels.append(name + _COPY_LABEL[kind])
                    flags.append(paddle.isfinite(tensor).all())
        return labels, (paddle.stack(flags) if flags else None)


_COPY_LABEL = {"param": "", "master": " (AMP master)", "ema": " (EMA shadow)"}


class LayerWeights(WeightAccess):
    """:class:`WeightAccess` over a dygraph Layer, its optimizer's masters and a ``ModelEMA``."""

    def __init__(self, model, optimizer=None, ema=None):
        self.model, self.optimizer, self.ema = model, optimizer, ema
        self._state = model.state_dict()

    def copies(self, name: str) -> dict:
        p = self._state[name]
        out = {"param": lambda: p}
        master = master_weights(self.optimizer).get(p.name) if self.optimizer is not None else None
        if master is not None:
            out["master"] = lambda: master
        shadow = getattr(self.ema, "shadow", None) or {}
        if name in shadow:
            out["ema"] = lambda: shadow[name]
        return out

    def read(self, name: str) -> np.ndarray:
        p = self._state[name]
        value = master_weights(self.optimizer).get(p.name, p) if self.optimizer is not None else p
        return (value if value.dtype == paddle.float32 else value.astype("float32")).numpy()

    def masters_pending(self, name: str) -> bool:
        p = self._state[name]
        return (self.optimizer is not None and p.dtype in LOW_PRECISION
                and p.name not in master_weights(self.optimizer))
