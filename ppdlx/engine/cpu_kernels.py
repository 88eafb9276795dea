"""CPU kernel choices the trainer makes for a model it built (the model itself knows nothing of them).

Paddle 3.3.1's CPU convolution is im2col + one MKL GEMM *per sample* (~80 % of a ResNet50 training
step), and its NHWC convolutions are transposed to NCHW inside the kernel. ``global.cpu_fast_kernels``
trains in NHWC instead, where

- a stride-1 1x1 convolution is exactly one GEMM over all ``N*H*W`` pixels, which ``paddle.matmul``
  runs 20-30 % faster than the conv kernel on ResNet50's 1x1 shapes;
- every other convolution runs through oneDNN's batched NHWC kernels (``ppdlx.ops.onednn``,
  the oneDNN library inside Paddle's wheel), 1.2-2.2x faster than Paddle's kernels per layer;
- every ``ppdlx.layers.BatchNormAct2D`` followed by ReLU or by nothing (the BatchNorms of every model
  family) trains in one oneDNN pass instead of two Paddle kernels (evaluation keeps Paddle's), and
  max pooling runs through oneDNN too;
- a ResNet bottleneck ends its training forward with one oneDNN add + ReLU pass instead of Paddle's
  add and ReLU kernels (exact in float32; one pass over the block's output, forward and backward).

Weights keep their ``[Cout, Cin/groups, kh, kw]`` layout, so checkpoints and exports are unchanged
(docs/cpu_speed.md has the measurements).
"""
from __future__ import annotations

import logging
import types

import paddle

from ppdlx.cpu_env import keep_freed_memory
from ppdlx.engine.cpu_bf16_activations import use_bf16_activations
from ppdlx.errors import UnsupportedError
from ppdlx.layers import BatchNormAct2D
from ppdlx.models.resnet import Bottleneck
from ppdlx.ops import onednn

log = logging.getLogger("ppdlx")


def _conv1x1_matmul_forward(self, x):
    stride = _stride_of(self)
    if stride > 1:
        x = x[:, ::stride, ::stride, :]
    y = paddle.matmul(x, self.weight.reshape(self.weight.shape[:2]), transpose_y=True)
    return y if self.bias is None else y + self.bias


def _stride_of(layer) -> int:
    return layer._stride[0] if isinstance(layer._stride, (list, tuple)) else layer._stride


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


def _is_matmul_1x1(layer, strided: bool) -> bool:
    return _is_plain_1x1(layer) and (strided or _stride_of(layer) == 1)


def conv1x1_as_matmul(model, strided: bool = True) -> int:
    """Run every plain NHWC 1x1 ``Conv2D`` of ``model`` (groups 1, no padding, square stride; with
    ``strided=False`` stride 1 only) as one ``paddle.matmul``; returns how many layers now do."""
    count = 0
    for layer in model.sublayers(include_self=True):
        if _is_matmul_1x1(layer, strided):
            layer.forward = types.MethodType(_conv1x1_matmul_forward, layer)
            count += 1
    return count


def _applies(device: str, graph: str, distill_enabled: bool, qat_enabled: bool = False) -> str | None:
    """Why the fast CPU kernels do not apply to this run, or None."""
    if qat_enabled:
        return "qat.enabled (quantization-aware training runs Paddle's Conv2D with fake quantization)"
    if device != "cpu":
        return f"device is {device}"
    if graph != "dynamic":
        return f"train.graph={graph} (dynamic graph only)"
    if distill_enabled:
        return "distillation is on (the teacher keeps its own layout)"
    return None


def plan_fast_cpu_kernels(setting, device: str, graph: str, distill_enabled: bool, qat_enabled: bool = False) -> bool:
    """Whether a training run uses the fast CPU kernels, from ``global.cpu_fast_kernels`` (``setting``):
    ``auto`` turns them on where they apply and the oneDNN op builds (otherwise one log line says
    why not), ``true`` insists (error if the op cannot be built), ``false`` keeps Paddle's kernels.
    A run with them on trains in NHWC; the caller plans that layout."""
    if setting is False:
        return False
    not_here = _applies(device, graph, distill_enabled, qat_enabled)
    if not_here:
        if setting is True and qat_enabled:
            raise UnsupportedError(f"global.cpu_fast_kernels=true with {not_here}: the fast kernels replace that "
                                   f"forward; set global.cpu_fast_kernels=auto or false")
        if setting is True:
            log.info("global.cpu_fast_kernels=true not applied: %s", not_here)
        return False
    reason = onednn.unavailable_reason()
    if reason is None:
        try:
            onednn.load()
        except Exception as exc:  # a compiler or linker problem: name it in one line
            reason = f"building {onednn.SOURCE.name} failed ({str(exc).strip().splitlines()[-1][:200]})"
    if reason:
        if setting is True:
            raise UnsupportedError(f"global.cpu_fast_kernels=true: {reason}; or set global.cpu_fast_kernels=false")
        log.info("global.cpu_fast_kernels=auto: off, %s; CPU training uses Paddle's slower conv kernels", reason)
        return False
    return True


def switch_to_fast_kernels(model, bf16: bool = False) -> dict:
    """Stride-1 1x1 convs of an NHWC ``model`` as matmuls, every other ``paddle.nn.Conv2D`` through
    the oneDNN op; with ``bf16`` every convolution through the oneDNN op, training in bf16
    (``ppdlx.engine.cpu_bf16``), and a ResNet's activations in bf16 between its layers
    (``ppdlx.engine.cpu_bf16_activations``). Returns the counts."""
    # Strided 1x1s go to oneDNN: as matmuls they need a strided slice whose gradient cost 60 ms/step.
    matmuls = 0 if bf16 else conv1x1_as_matmul(model, strided=False)
    switched, kept = onednn.use_onednn_convs(
        model, skip=lambda layer: not bf16 and _is_matmul_1x1(layer, strided=False), bf16=bf16)
    norms = add_relus = 0
    for layer in model.sublayers(include_self=True):
        if type(layer) is BatchNormAct2D and type(layer.act) in (paddle.nn.ReLU, paddle.nn.Identity):
            layer.forward = types.MethodType(_batch_norm_act_forward, layer)
            norms += 1
        elif type(layer) is Bottleneck and type(layer.relu) is paddle.nn.ReLU:
            layer.forward = types.MethodType(_bottleneck_add_relu_forward, layer)
            add_relus += 1
    pools = onednn.use_onednn_max_pools(model)
    bf16_blocks = use_bf16_activations(model) if bf16 else 0
    return {"matmul": matmuls, "onednn": switched, "paddle": kept, "batch_norm": norms, "max_pool": pools,
            "add_relu": add_relus, "bf16": bf16, "bf16_activation_blocks": bf16_blocks}


def use_fast_cpu_kernels(model, bf16: bool = False) -> dict:
    """:func:`switch_to_fast_kernels` for a training run: also keeps freed memory in the process and
    says in one line what runs where. Returns the counts."""
    counts = switch_to_fast_kernels(model, bf16)
    kept_memory = keep_freed_memory()
    log.info("global.cpu_fast_kernels: %d convs%s, %d batch norms, %d max pools and %d residual add + ReLU through "
             "oneDNN (NHWC), %d 1x1 convs as matmuls, %d convs on Paddle's kernel%s%s", counts["onednn"],
             " (bf16 while training)" if bf16 else "", counts["batch_norm"], counts["max_pool"], counts["add_relu"],
             counts["matmul"], counts["paddle"],
             f"; bf16 activations through {counts['bf16_activation_blocks']} residual blocks"
             if counts["bf16_activation_blocks"] else "",
             "" if kept_memory else "; freed memory goes back to the system (not glibc)")
    return counts


def _batch_norm_act_forward(self, x):
    # Training: BatchNorm (+ ReLU) in one oneDNN pass. A BN in eval mode or with fixed statistics
    # (frozen while the rest trains, e.g. detection.freeze_bn_max_pixels, set after this patch)
    # keeps Paddle's kernel: it must use, and not update, its running statistics.
    if not self.training or self._use_global_stats:
        return BatchNormAct2D.forward(self, x)
    return onednn.batch_norm_train(x, self, type(self.act) is paddle.nn.ReLU, self._data_format == "NHWC")


def _bottleneck_add_relu_forward(self, x):
    # Evaluation keeps Paddle's add and ReLU, as the batch norms keep Paddle's kernels there.
    identity = x if self.shortcut is None else self.shortcut(x)
    y = self.conv3(self.conv2(self.conv1(x)))
    return onednn.add_relu(y, identity) if self.training else self.relu(y + identity)
