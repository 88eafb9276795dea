"""Convolution and max pooling that pick their training kernel when they are built (``ppdlx.layers.config``).

Paddle 3.3.1's CPU convolution is im2col + one MKL GEMM *per sample*, and its NHWC convolutions are
transposed to NCHW inside the kernel. Built under ``layer_config(cpu_kernels=True)`` (an NHWC model trained on
CPU, ``global.cpu_fast_kernels``):

- a stride-1 1x1 convolution (groups 1, no padding) is exactly one GEMM over all ``N*H*W`` pixels, which
  ``paddle.matmul`` runs faster than the conv kernel (``cpu_kernel = "matmul"``; not in bf16, where every
  convolution goes to oneDNN);
- every other zero-padded convolution runs through oneDNN's batched kernels (``ppdlx.ops.onednn``,
  ``cpu_kernel = "onednn"``), in bf16 while training under ``bf16=True``; evaluation computes in float32
  exactly what the float32 export will. Strided 1x1s go to oneDNN: as matmuls they need a strided slice
  whose gradient costs more than it saves;
- a max pool with explicit padding (floor mode, no mask) runs through oneDNN.

Weights keep their ``[Cout, Cin/groups, kh, kw]`` layout and their Paddle names (``conv2d_N.w_0``: the class
names are Paddle's), so checkpoints and exports are the same whatever was picked (docs/cpu_speed.md has the
measurements).
"""
from __future__ import annotations

import paddle
import paddle.nn as nn

from ppdlx.layers.config import get_layer_config
from ppdlx.ops import onednn


def _stride_of(layer) -> int:
    return layer._stride[0] if isinstance(layer._stride, (list, tuple)) else layer._stride


def is_plain_1x1(conv) -> bool:
    """An NHWC 1x1 convolution without groups or padding, with the same stride both ways: one GEMM."""
    if conv._data_format != "NHWC" or conv._groups != 1 or list(conv.weight.shape[2:]) != [1, 1]:
        return False
    stride = conv._stride if isinstance(conv._stride, (list, tuple)) else [conv._stride] * 2
    padding = conv._padding
    no_pad = padding in ("SAME", "VALID") or (padding == 0) or (isinstance(padding, (list, tuple))
                                                             and not any(padding))
    return no_pad and stride[0] == stride[1]


def conv1x1_matmul(conv, x):
    """``conv(x)`` of a plain NHWC 1x1 convolution (:func:`is_plain_1x1`) as one ``paddle.matmul``."""
    stride = _stride_of(conv)
    if stride > 1:
        x = x[:, ::stride, ::stride, :]
    y = paddle.matmul(x, conv.weight.reshape(conv.weight.shape[:2]), transpose_y=True)
    return y if conv.bias is None else y + conv.bias


class Conv2D(nn.Conv2D):
    """``paddle.nn.Conv2D`` whose kernel is chosen when it is built: ``cpu_kernel`` is ``"matmul"``, ``"onednn"``
    or None (Paddle's), see the module docstring."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        config = get_layer_config()
        self.cpu_kernel = None
        if config.cpu_kernels and type(self) is Conv2D:
            if not config.bf16 and is_plain_1x1(self) and _stride_of(self) == 1:
                self.cpu_kernel = "matmul"
            elif self._padding_mode == "zeros":
                self.cpu_kernel = "onednn"
                self._onednn_paddings = onednn.explicit_paddings(self)
                self._onednn_bf16 = config.bf16

    def forward(self, x):
        if self.cpu_kernel == "matmul":
            return conv1x1_matmul(self, x)
        if self.cpu_kernel == "onednn":
            # bf16 trains only: evaluation computes exactly what the float32 export will
            y = onednn.conv2d(x, self.weight, self._stride, self._onednn_paddings, self._dilation, self._groups,
                              self._data_format == "NHWC", self._onednn_bf16 and self.training, False)
            if self.bias is None:
                return y
            return y + (self.bias if self._data_format == "NHWC" else self.bias.reshape([1, -1, 1, 1]))
        return super().forward(x)


class MaxPool2D(nn.MaxPool2D):
    """``paddle.nn.MaxPool2D`` that, built under ``cpu_kernels``, runs through oneDNN (``cpu_kernel = "onednn"``)
    where oneDNN's pooling is Paddle's: floor mode, no mask, explicit padding."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cpu_kernel = None
        if (get_layer_config().cpu_kernels and type(self) is MaxPool2D and not self.ceil_mode
                and not self.return_mask and not isinstance(self.padding, str)):
            self.cpu_kernel = "onednn"
            self._onednn_paddings = onednn.four_paddings(self.padding)

    def forward(self, x):
        if self.cpu_kernel == "onednn":
            return onednn.max_pool2d(x, self.ksize, self.stride if self.stride is not None else self.ksize,
                                     self._onednn_paddings, self.data_format == "NHWC")
        return super().forward(x)
