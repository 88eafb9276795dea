"""Static-graph AMP (``train.graph=static`` with ``amp.enabled``): the plan and the program pieces
(the probe step the plan runs on CPU is :mod:`ppdlx.engine.static.probe`).

The update is Paddle's PIR static AMP recipe: ``paddle.amp.decorate`` (O2 casts the parameters to
the low precision in the programs and makes the optimizer keep float32 masters), ``auto_cast``
around the forward, ``GradScaler.minimize``. Loss scaling follows the dynamic trainer: the config's
(dynamic) scaling for float16, none for bfloat16 (scale 1, which is also what
``paddle.static.amp.decorator.OptimizerWithMixedPrecision`` chooses for bf16 before
``GradScaler.minimize`` overrides it). The EMA update (``ema.enabled``) is appended after the
optimizer ops and runs every step, as the dynamic trainer updates its EMA after every scaler step.
"""
from __future__ import annotations

from typing import Callable, Optional, Tuple

import paddle

from ppdlx.engine.amp import AmpPlan, clip_norms_in_float32, plan_amp
from ppdlx.engine.static.state import LossScaling
from ppdlx.errors import UnsupportedError


def plan(amp_cfg, device: str, use_pir: bool, probe: Callable[[str, str], Tuple[bool, str]]) -> AmpPlan:
    """``plan_amp`` (same one-line errors: fp16 needs a GPU) plus what static AMP can do here.

    On CPU, ``probe(dtype, level)`` runs one static AMP train step of the configured model and
    optimizer and returns ``(ok, why)``.
    """
    if amp_cfg.enabled and device.startswith("gpu"):
        check_gpu_static_amp(amp_cfg, use_pir)
    plan = plan_amp(amp_cfg, device)  # raises for fp16 on CPU; probes dygraph bf16 on CPU
    if not amp_cfg.enabled:
        return plan
    if not use_pir:
        return AmpPlan(False, "float32", "O0", False,
                       f"amp: static AMP under legacy IR inserts no casts in Paddle {paddle.__version__}'s CPU build "
                       f"(paddle.static.amp.decorate leaves the program float32): training runs in float32")
    if plan.enabled:
        return plan  # GPU: fp16/bf16 O1/O2 through Paddle's PIR static AMP
    ok, why = probe("bfloat16", amp_cfg.level)
    if ok:
        return AmpPlan(True, "bfloat16", amp_cfg.level, False)
    return AmpPlan(False, "float32", "O0", False,
                   f"amp: bfloat16 {amp_cfg.level} requested, but a static bf16 train step of this model fails on "
                   f"this CPU in Paddle {paddle.__version__} ({why}): training runs in float32")


def check_gpu_static_amp(amp_cfg, use_pir: bool) -> None:
    """What a static AMP program on a GPU would get wrong, refused in one line."""
    if not use_pir:
        raise UnsupportedError("train.graph=static with amp.enabled under legacy IR (FLAGS_enable_pir_api=0): "
                               "ppdlx's static AMP is Paddle's PIR recipe; leave FLAGS_enable_pir_api unset, or "
                               "use train.graph=dynamic")
    if amp_cfg.dtype == "float16" and not amp_cfg.use_dynamic_loss_scaling:
        # only the update_loss_scaling op zeroes overflowed gradients, and Paddle's static recipe adds it
        # with dynamic scaling only (static/amp/decorator.py): a fixed scale writes inf into the weights
        raise UnsupportedError("train.graph=static with amp.dtype=float16 and amp.use_dynamic_loss_scaling=false: "
                               "Paddle's static program applies overflowed gradients to the weights with a fixed "
                               "loss scale; use amp.use_dynamic_loss_scaling=true or train.graph=dynamic")


def check_combination(amp: AmpPlan, accumulate: int, world: int) -> None:
    if amp.enabled and (accumulate > 1 or world > 1):
        what = f"train.accumulate={accumulate}" if accumulate > 1 else f"{world} ranks"
        raise UnsupportedError(f"train.graph=static with amp.enabled and {what}: paddle.static.amp owns the backward "
                               f"and the update (loss scaling); use train.graph=dynamic for this combination")


def decorate(amp: AmpPlan, model, optimizer):
    """``(model, amp_optimizer)``; call before tracing the forward (O2 casts the parameters)."""
    if amp.level == "O2":
        clip_norms_in_float32()
    return paddle.amp.decorate(models=model, optimizers=optimizer, level=amp.level, dtype=amp.dtype,
                               master_weight=True)


def append_update(amp: AmpPlan, scaler, amp_optimizer, loss, ema_update: Optional[Callable]) -> Optional[LossScaling]:
    """Backward, unscale, update [, EMA]; returns the loss-scaling variables to checkpoint (None
    without loss scaling, as the dynamic trainer has no scaler then). ``scaler``: the
    ``paddle.amp.GradScaler`` the config asks for (:func:`ppdlx.engine.amp.build_scaler`), or None."""
    if scaler is None:
        scaler = paddle.amp.GradScaler(init_loss_scaling=1.0, use_dynamic_loss_scaling=False)
    scaled = scaler.scale(loss)  # may switch dynamic scaling off (Paddle does for non-fp16 dtypes)
    if not scaler._use_dynamic_loss_scaling and scaler._init_loss_scaling != 1.0:
        # Paddle 3.3.1 (amp/grad_scaler.py): under PIR, GradScaler.scale returns the loss unscaled
        # without dynamic scaling, yet minimize still divides the gradients by the scale
        scaled = paddle.multiply(paddle.cast(loss, "float32"), scaler._scale)
    scaler.minimize(amp_optimizer, scaled)
    if ema_update is not None:
        ema_update()
    if not amp.use_scaler:
        return None
    dynamic = bool(scaler._use_dynamic_loss_scaling)
    return LossScaling(
        scale=scaler._scale.name,
        incr_count=amp_optimizer._num_good_steps.name if dynamic else None,
        decr_count=amp_optimizer._num_bad_steps.name if dynamic else None,
        settings={"incr_ratio": scaler._incr_ratio, "decr_ratio": scaler._decr_ratio,
                  "incr_every_n_steps": scaler._incr_every_n_steps,
                  "decr_every_n_nan_or_inf": scaler._decr_every_n_nan_or_inf,
                  "use_dynamic_loss_scaling": dynamic})
