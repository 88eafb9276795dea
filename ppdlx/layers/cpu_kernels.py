"""ppdlx's CPU training kernels: where a run may use them, and what a model built with them runs.

``global.cpu_fast_kernels`` trains an NHWC model on CPU through ppdlx's oneDNN ops instead of Paddle 3.3.1's
kernels (per-sample im2col + GEMM convolutions, NHWC transposed to NCHW inside the kernel): the model is built
under ``layer_config(cpu_kernels=True)`` and each layer picks its kernel then (``ppdlx.layers.conv``,
``ppdlx.layers.norm_act``, a ResNet bottleneck's add + ReLU and bf16 activations in ``ppdlx.models.resnet``).
:func:`plan_fast_cpu_kernels` decides whether a run does (the run plan records it); :func:`kernel_counts` and
:func:`kernel_line` say what a built model runs where (docs/cpu_speed.md has the measurements).
"""
from __future__ import annotations

import logging

import paddle

from ppdlx.errors import UnsupportedError
from ppdlx.ops import onednn

log = logging.getLogger("ppdlx")


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


def kernel_counts(model) -> dict:
    """How many of ``model``'s layers train on which kernel: convolutions as matmuls, through oneDNN, or on
    Paddle's kernel; oneDNN batch norms, max pools and residual add + ReLU; whether the oneDNN convolutions
    train in bf16, and through how many residual blocks the activations stay bf16."""
    counts = {"matmul": 0, "onednn": 0, "paddle": 0, "batch_norm": 0, "max_pool": 0, "add_relu": 0, "bf16": False,
              "bf16_activation_blocks": 0}
    for layer in model.sublayers(include_self=True):
        kernel = getattr(layer, "cpu_kernel", None)
        if isinstance(layer, paddle.nn.Conv2D):
            counts[kernel or "paddle"] += 1
            counts["bf16"] = counts["bf16"] or (kernel == "onednn" and layer._onednn_bf16)
        elif isinstance(layer, paddle.nn.BatchNorm2D):
            counts["batch_norm"] += kernel == "onednn"
        elif isinstance(layer, paddle.nn.MaxPool2D):
            counts["max_pool"] += kernel == "onednn"
        elif kernel == "add_relu":
            counts["add_relu"] += 1
        counts["bf16_activation_blocks"] += getattr(layer, "bf16_activation_blocks", 0)
    return counts


def kernel_line(counts: dict, kept_memory: bool) -> str:
    """The run's one line on what its model trains on (``kept_memory``: freed memory stays in the process)."""
    return (f"global.cpu_fast_kernels: {counts['onednn']} convs{' (bf16 while training)' if counts['bf16'] else ''}, "
            f"{counts['batch_norm']} batch norms, {counts['max_pool']} max pools and {counts['add_relu']} residual "
            f"add + ReLU through oneDNN (NHWC), {counts['matmul']} 1x1 convs as matmuls, {counts['paddle']} convs "
            f"on Paddle's kernel"
            + (f"; bf16 activations through {counts['bf16_activation_blocks']} residual blocks"
               if counts["bf16_activation_blocks"] else "")
            + ("" if kept_memory else "; freed memory goes back to the system (not glibc)"))
