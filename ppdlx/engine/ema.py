"""Exponential moving average of a model's parameters and BN statistics."""
from __future__ import annotations

import contextlib

import paddle

from ppdlx.checkpoint.files import set_state_cast
from ppdlx.engine.amp import float32_state


def ema_decay(decay: float, dynamic: bool, updates: int) -> float:
    """The decay of the next update: ``min(decay, (1 + n) / (10 + n))`` after ``n`` updates when dynamic."""
    if dynamic:
        return min(decay, (1.0 + updates) / (10.0 + updates))
    return decay


class ModelEMA:
    """Shadows are float32 whatever the model's precision: under AMP O2 they average the optimizer's
    fp32 master weights (pass ``optimizer`` to :meth:`update`), not the rounded fp16 parameters."""

    def __init__(self, model, decay: float, dynamic_decay: bool = False):
        self.decay, self.dynamic_decay = decay, dynamic_decay
        self.updates = 0
        with paddle.no_grad():
            self.shadow = {k: v.detach().astype("float32").clone() for k, v in model.state_dict().items()
                           if paddle.is_floating_point(v)}

    def current_decay(self) -> float:
        return ema_decay(self.decay, self.dynamic_decay, self.updates)

    @paddle.no_grad()
    def update(self, model, optimizer=None) -> None:
        d = self.current_decay()
        self.updates += 1
        for k, v in float32_state(model, optimizer).items():
            if k in self.shadow:
                s = self.shadow[k]
                s.set_value(s * d + v.detach().astype("float32") * (1.0 - d))

    @contextlib.contextmanager
    def swapped_into(self, model):
        """Temporarily load the EMA weights into ``model`` (e.g. for evaluation)."""
        backup = {k: v.detach().clone() for k, v in model.state_dict().items() if k in self.shadow}
        set_state_cast(model, self.shadow)
        try:
            yield model
        finally:
            # Buffers re-estimated for the EMA weights while swapped in ("precise BN" before a
            # detection eval) belong to those weights: keep them. Eval-mode forwards leave them as is.
            with paddle.no_grad():
                for k, v in model.state_dict().items():
                    if k in self.shadow and v.stop_gradient:  # BN statistics (and frozen weights: unchanged)
                        self.shadow[k].set_value(v.detach().astype("float32"))
            set_state_cast(model, backup)

    def state_dict(self):
        return {"updates": self.updates, "shadow": {k: v.numpy() for k, v in self.shadow.items()}}

    def set_state_dict(self, state):
        self.updates = int(state["updates"])
        for k, v in state["shadow"].items():
            if k in self.shadow:
                self.shadow[k].set_value(paddle.to_tensor(v))
