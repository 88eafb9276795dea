"""CPU kernel choices the trainer makes for a model it built (the model itself knows nothing of them).

Paddle 3.3.1's CPU convolution is im2col + one MKL GEMM *per sample*, and NHWC convolutions are
transposed to NCHW inside the kernel. In NHWC a 1x1 convolution is exactly one GEMM over all
``N*H*W`` pixels, which ``paddle.matmul`` runs 20-30 % faster than the conv kernel on ResNet50's
1x1 shapes; a whole ResNet50 v1.5 step trains ~1.2x faster (docs/cpu_speed.md). Weights keep
their ``[Cout, Cin, 1, 1]`` layout, so checkpoints and exports are unchanged.
"""
from __future__ import annotations

import logging
import types

import paddle

log = logging.getLogger("ppdlx")


def _conv1x1_matmul_forward(self, x):
    stride = self._stride[0] if isinstance(self._stride, (list, tuple)) else self._stride
    if stride > 1:
        x = x[:, ::stride, ::stride, :]
    y = paddle.matmul(x, self.weight.reshape(self.weight.shape[:2]), transpose_y=True)
    return y if self.bias is None else y + self.bias


def _is_plain_1x1(layer) -> bool:
    if type(layer) is not paddle.nn.Conv2D or layer._data_format != "NHWC" or layer._groups != 1:
        return False
    if list(layer.weight.shape[2:]) != [1, 1]:
        return False
    stride = layer._stride if isinstance(layer._stride, (list, tuple)) else [layer._stride] * 2
    padding = layer._padding
    no_pad = padding in ("SAME", "VALID") or (padding == 0) or (isinstance(padding, (list, tuple))
                                                             and not any(padding))
    return no_pad and stride[0] == stride[1]


def conv1x1_as_matmul(model) -> int:
    """Run every plain NHWC 1x1 ``Conv2D`` of ``model`` (groups 1, no padding, square stride) as
    one ``paddle.matmul``; returns how many layers now do."""
    count = 0
    for layer in model.sublayers(include_self=True):
        if _is_plain_1x1(layer):
            layer.forward = types.MethodType(_conv1x1_matmul_forward, layer)
            count += 1
    return count


def plan_fast_cpu_kernels(cfg, device: str) -> bool:
    """``global.cpu_fast_kernels`` on a CPU dynamic-graph classification run (no distillation: the
    teacher keeps its own layout): train in NHWC with 1x1 convs as matmuls. Sets
    ``cfg.model.data_format = "NHWC"`` so that loaders, model and the saved config agree."""
    if not (cfg.global_.cpu_fast_kernels and device == "cpu" and cfg.train.graph == "dynamic"
            and not cfg.distill.enabled):
        return False
    if cfg.model.data_format != "NHWC":
        log.info("global.cpu_fast_kernels: training in NHWC with 1x1 convs as matmuls on CPU (was %s; "
                 "checkpoints are layout-free; set global.cpu_fast_kernels=false to keep it)",
                 cfg.model.data_format)
        cfg.model.data_format = "NHWC"
    return True
