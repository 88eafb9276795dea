"""Automatic mixed precision: what the config asks for vs what this build can do.

Paddle 3.3.1's CPU build has no bf16 conv/matmul/batch_norm kernels and its
``auto_cast`` needs a CUDAPlace, so bf16 autocast on CPU changes nothing. We probe
that once and say so in one line instead of pretending.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import paddle

from ppdlx.errors import UnsupportedError

log = logging.getLogger("ppdlx.amp")


@dataclass
class AmpPlan:
    enabled: bool          # autocast actually runs
    dtype: str             # "float16" | "bfloat16" | "float32"
    level: str
    use_scaler: bool
    note: str = ""


def bf16_autocast_works_on_cpu() -> bool:
    """Run one conv under bf16 autocast and look at the output dtype."""
    import warnings
    conv = paddle.nn.Conv2D(4, 4, 3)
    x = paddle.ones([1, 4, 8, 8])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with paddle.amp.auto_cast(True, dtype="bfloat16", level="O1"):
                y = conv(x)
        except Exception:  # noqa: BLE001 - any failure means "not usable"
            return False
    return y.dtype == paddle.bfloat16


def plan_amp(amp_cfg, device: str) -> AmpPlan:
    if not amp_cfg.enabled:
        return AmpPlan(False, "float32", "O0", False)
    on_gpu = device.startswith("gpu")
    if amp_cfg.dtype == "float16":
        if not on_gpu:
            why = "this Paddle build has no CUDA" if not paddle.is_compiled_with_cuda() else "global.device is cpu"
            raise UnsupportedError(f"amp.dtype=float16 needs a GPU and {why}; "
                                   f"use amp.dtype=bfloat16 or amp.enabled=false on CPU")
        return AmpPlan(True, "float16", amp_cfg.level, True)
    if on_gpu:
        return AmpPlan(True, "bfloat16", amp_cfg.level, False)
    if bf16_autocast_works_on_cpu():
        return AmpPlan(True, "bfloat16", amp_cfg.level, False)
    note = ("amp: bfloat16 requested, but Paddle %s's CPU build has no bf16 conv/matmul/batch_norm kernels "
            "(autocast is a no-op): training runs in float32; bf16 inference via oneDNN is in deploy/"
            % paddle.__version__)
    return AmpPlan(False, "float32", "O0", False, note)


def autocast(plan: AmpPlan):
    if not plan.enabled:
        return contextlib.nullcontext()
    return paddle.amp.auto_cast(True, dtype=plan.dtype, level=plan.level)


def build_scaler(plan: AmpPlan, amp_cfg):
    if not plan.use_scaler:
        return None
    return paddle.amp.GradScaler(init_loss_scaling=amp_cfg.init_loss_scaling,
                                 incr_every_n_steps=amp_cfg.incr_every_n_steps,
                                 decr_every_n_nan_or_inf=amp_cfg.decr_every_n_nan_or_inf,
                                 use_dynamic_loss_scaling=amp_cfg.use_dynamic_loss_scaling)


def decorate_o2(plan: AmpPlan, model, optimizer):
    """O2 keeps fp32 master weights in the optimizer (multi_precision) and casts the model."""
    if plan.enabled and plan.level == "O2":
        model, optimizer = paddle.amp.decorate(models=model, optimizers=optimizer, level="O2",
                                               dtype=plan.dtype, master_weight=True)
    return model, optimizer
