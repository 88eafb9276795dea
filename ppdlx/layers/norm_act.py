"""BatchNorm with its activation, and the conv -> BatchNorm -> activation block.

Knowing what follows the normalisation is what lets a ``BatchNormAct2D`` built under
``layer_config(cpu_kernels=True)`` train with ReLU (or nothing) after it in one oneDNN pass instead of two Paddle
kernels (``cpu_kernel = "onednn"``). Evaluation, and a BatchNorm with fixed statistics (frozen while the rest
trains, e.g. ``detection.freeze_bn_max_pixels``), keep Paddle's kernel: they must use, and not update, the
running statistics.
"""
from __future__ import annotations

import paddle
import paddle.nn as nn

from ppdlx.layers.activations import create_act
from ppdlx.layers.config import get_layer_config
from ppdlx.layers.conv import Conv2D
from ppdlx.layers.helpers import get_padding
from ppdlx.ops import onednn


class _BatchNorm2DParameterNames(nn.Layer):
    # Paddle names a layer's parameters after its class (``batch_norm2d_3.w_0``) and optimizer
    # checkpoints (.pdopt: accumulators, fp32 master weights) are keyed by those names; a subclass
    # keeps BatchNorm2D's, so checkpoints written with plain BatchNorm2D layers still resume.
    def __init__(self, name_scope=None, dtype="float32"):
        super().__init__(name_scope or "batch_norm2d", dtype)


class BatchNormAct2D(nn.BatchNorm2D, _BatchNorm2DParameterNames):
    """``act(batch_norm(x))``: a ``paddle.nn.BatchNorm2D`` (same parameters, same state_dict keys)
    that also owns the activation following it, ``act`` (a name for ``create_act`` or a layer)."""

    def __init__(self, num_features, act=None, eps=1e-5, momentum=0.9, data_format="NCHW",
                 zero_init_gamma=False):
        gamma = paddle.ParamAttr(initializer=nn.initializer.Constant(0.0)) if zero_init_gamma else None
        super().__init__(num_features, momentum=momentum, epsilon=eps, weight_attr=gamma, data_format=data_format)
        self.act = act if isinstance(act, nn.Layer) else create_act(act)
        self.cpu_kernel = "onednn" if (get_layer_config().cpu_kernels and type(self) is BatchNormAct2D
                                       and type(self.act) in (nn.ReLU, nn.Identity)) else None

    def forward(self, x):
        if self.cpu_kernel == "onednn" and self.training and not self._use_global_stats:
            return onednn.batch_norm_train(x, self, type(self.act) is nn.ReLU, self._data_format == "NHWC")
        return self.act(super().forward(x))


class ConvNormAct(nn.Layer):
    """Conv (no bias, Kaiming-normal weights) -> ``BatchNormAct2D``, as sub-layers ``conv`` and ``bn``.

    ``padding``: an int/list, or "SAME" (TF padding, extra pixel right/bottom); default
    ``get_padding(kernel_size, stride)``. ``zero_init_gamma`` starts the BN scale at 0 (a residual
    branch that starts as zero)."""

    def __init__(self, in_ch, out_ch, kernel_size, stride=1, groups=1, act="relu", padding=None,
                 data_format="NCHW", eps=1e-5, momentum=0.9, zero_init_gamma=False):
        super().__init__()
        if padding is None:
            padding = get_padding(kernel_size, stride)
        self.conv = Conv2D(in_ch, out_ch, kernel_size, stride=stride, padding=padding, groups=groups,
                              bias_attr=False, data_format=data_format,
                              weight_attr=nn.initializer.KaimingNormal())
        self.bn = BatchNormAct2D(out_ch, act, eps=eps, momentum=momentum, data_format=data_format,
                                 zero_init_gamma=zero_init_gamma)

    def forward(self, x):
        return self.bn(self.conv(x))
