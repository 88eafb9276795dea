"""LR schedules (registered in ``LR_SCHEDULES``), stepped once per optimizer step (not per epoch),
so warm-up and decay are smooth and resume restores them exactly from ``last_epoch``."""
from __future__ import annotations

import paddle

from ppdlx.registry import LR_SCHEDULES


def scaled_lr(cfg, global_batch: int) -> float:
    lr = cfg.lr
    return lr.base_lr * (global_batch / lr.base_batch if lr.scale_with_batch else 1.0)


def _with_warmup(schedule, peak_lr, warmup_steps, start_lr):
    if warmup_steps <= 0:
        return schedule
    return paddle.optimizer.lr.LinearWarmup(schedule, warmup_steps, start_lr, peak_lr)


@LR_SCHEDULES.register("cosine")
def cosine(peak_lr, total_steps, warmup_steps, cfg):
    decay_steps = max(1, total_steps - warmup_steps)
    sched = paddle.optimizer.lr.CosineAnnealingDecay(peak_lr, decay_steps, eta_min=cfg.lr.min_lr)
    return _with_warmup(sched, peak_lr, warmup_steps, cfg.lr.warmup_start_lr)


@LR_SCHEDULES.register("step")
def step_decay(peak_lr, total_steps, warmup_steps, cfg, steps_per_epoch=1):
    """timm's StepLRScheduler, per step: after warm-up ``peak * decay_rate ** floor(step / period)``,
    ``period = decay_epochs * steps_per_epoch``, counted from step 0 as timm's ``epoch // decay_t``
    (warm-up included: after 3 warm-up epochs with decay 2.4 the lr is already ``peak * rate``)."""
    period = max(1.0, cfg.lr.decay_epochs * steps_per_epoch)
    rate = cfg.lr.decay_rate
    sched = paddle.optimizer.lr.LambdaDecay(peak_lr, lambda s: rate ** int((s + warmup_steps) / period + 1e-9))
    return _with_warmup(sched, peak_lr, warmup_steps, cfg.lr.warmup_start_lr)


@LR_SCHEDULES.register("constant")
def constant(peak_lr, total_steps, warmup_steps, cfg):
    sched = paddle.optimizer.lr.LambdaDecay(peak_lr, lambda _: 1.0)
    return _with_warmup(sched, peak_lr, warmup_steps, cfg.lr.warmup_start_lr)


def build_lr_schedule(cfg, global_batch: int, steps_per_epoch: int):
    total = cfg.train.epochs * steps_per_epoch
    warmup = int(round(cfg.lr.warmup_epochs * steps_per_epoch))
    kwargs = dict(peak_lr=scaled_lr(cfg, global_batch), total_steps=total, warmup_steps=min(warmup, total), cfg=cfg)
    if cfg.lr.name == "step":
        kwargs["steps_per_epoch"] = steps_per_epoch
    return LR_SCHEDULES.build(cfg.lr.name, **kwargs)
