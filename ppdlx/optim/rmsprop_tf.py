"""RMSprop with TensorFlow semantics (timm's ``RMSpropTF``, the GPUNet/EfficientNet recipe).

The update, per parameter, with gradient ``g`` (L2 weight decay already added: ``g += wd * w``,
coupled as in timm's default ``decoupled_decay=False``; BN/bias groups get ``wd = 0``)::

    ms  = rho * ms + (1 - rho) * g**2          # ms starts at 1 (TF/timm), not 0 (PyTorch/paddle)
    mom = momentum * mom + lr * g / sqrt(ms + eps)   # eps INSIDE the square root; lr inside the buffer
    w   = w - mom

This is exactly paddle's own ``rmsprop`` kernel with ``centered=False`` (its documented formula
puts ``epsilon`` inside the square root and ``lr`` inside the momentum buffer) except for one
thing: paddle starts the mean-square accumulator at 0. With ``ms0 = 0`` the first step divides by
``sqrt((1 - rho) g^2 + eps)`` ~ ``3.2 |g|``, i.e. a ~``lr * 3`` sized step on every weight at once;
TF/timm start at 1 and the first steps are ~``lr * g``. So this class is paddle's optimizer with
the mean-square accumulator created at 1.0 and nothing else changed: paddle's fused kernel does
the arithmetic, master weights (``multi_precision``), grad clipping, parameter groups,
``state_dict`` / resume all behave as paddle's. Verified against a numpy transcription of
timm's ``RMSpropTF.step`` in ``tests/optim/test_rmsprop_tf.py``.

timm's ``square_avg += (1 - alpha) * (g^2 - square_avg)`` equals ``rho * ms + (1 - rho) g^2``
up to float rounding (a few ulp).
"""
from __future__ import annotations

import paddle
from paddle.base import framework

from ppdlx.optim.optimizers import grad_clip
from ppdlx.registry import OPTIMIZERS


class RMSpropTF(paddle.optimizer.RMSProp):
    """``paddle.optimizer.RMSProp`` (non-centered) with TF's mean-square initial value of 1."""

    MEAN_SQUARE_INIT = 1.0

    def __init__(self, learning_rate, rho: float = 0.9, epsilon: float = 1e-3, momentum: float = 0.9,
                 parameters=None, weight_decay=None, grad_clip=None, multi_precision: bool = False, name=None):
        super().__init__(learning_rate=learning_rate, rho=rho, epsilon=epsilon, momentum=momentum, centered=False,
                         parameters=parameters, weight_decay=weight_decay, grad_clip=grad_clip, name=name)
        self._multi_precision = bool(multi_precision)

    def _create_accumulators(self, block, parameters):
        if not isinstance(block, (framework.Block, paddle.pir.Block)):
            raise TypeError("block is not instance of Block.")
        if isinstance(parameters, dict):
            parameters = parameters.get("params")
        for p in parameters:
            if p.name in self._already_create_accumulator:
                continue
            target = p
            if self._multi_precision and self._is_dtype_fp16_or_bf16(p.dtype):
                target = self._create_master_weight(p)
            self._add_accumulator(self._momentum_acc_str, target)
            self._add_accumulator(self._mean_square_acc_str, target, fill_value=self.MEAN_SQUARE_INIT)
            # unused when centered=False, but paddle's kernel takes it as an input
            self._add_accumulator(self._mean_grad_acc_str, target)
            self._already_create_accumulator.add(p.name)


@OPTIMIZERS.register("rmsprop_tf")
def rmsprop_tf(lr, groups, cfg, multi_precision=False):
    """``optimizer.rho`` (timm ``alpha``, 0.9), ``optimizer.epsilon`` (1e-3 for GPUNet),
    ``optimizer.momentum`` (0.9 in the recipe), ``optimizer.weight_decay`` (L2, coupled)."""
    o = cfg.optimizer
    return RMSpropTF(learning_rate=lr, rho=o.rho, epsilon=o.epsilon, momentum=o.momentum, parameters=groups,
                     weight_decay=o.weight_decay, grad_clip=grad_clip(cfg), multi_precision=multi_precision)
