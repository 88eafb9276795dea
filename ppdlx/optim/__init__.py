"""Optimizers and LR schedules (registered in ``OPTIMIZERS`` / ``LR_SCHEDULES``).

LR schedules are stepped once per optimizer step (not per epoch), so warm-up and
decay are smooth and resume restores them exactly from ``last_epoch``.
"""
from __future__ import annotations

import paddle

from ppdlx.registry import LR_SCHEDULES, OPTIMIZERS


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


def is_no_decay(name: str, param) -> bool:
    """BN scales/shifts and biases (every 1-D parameter) get no weight decay."""
    return len(param.shape) <= 1


def param_groups(model, weight_decay: float, decay_bn_and_bias: bool, decay_params: str = "default"):
    """``decay_params="conv_kernels"``: only 4-D parameters decay (conv, depthwise and pointwise
    kernels; not BN, biases, fusion weights or Linear weights), as the EfficientDet recipe."""
    params = [p for p in model.parameters() if not p.stop_gradient]
    if decay_params == "conv_kernels":
        no_decay_fn = lambda name, p: len(p.shape) != 4  # noqa: E731
    else:
        no_decay_fn = is_no_decay
    if (decay_bn_and_bias and decay_params == "default") or weight_decay == 0:
        return [{"params": params, "weight_decay": weight_decay}]
    names = {id(p): n for n, p in model.named_parameters()}
    decay = [p for p in params if not no_decay_fn(names.get(id(p), ""), p)]
    no_decay = [p for p in params if no_decay_fn(names.get(id(p), ""), p)]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _grad_clip(cfg):
    return paddle.nn.ClipGradByGlobalNorm(cfg.optimizer.grad_clip_norm) if cfg.optimizer.grad_clip_norm else None


@OPTIMIZERS.register("momentum")
def momentum(lr, groups, cfg, multi_precision=False):
    o = cfg.optimizer
    return paddle.optimizer.Momentum(learning_rate=lr, momentum=o.momentum, parameters=groups,
                                     use_nesterov=o.nesterov, weight_decay=o.weight_decay,
                                     grad_clip=_grad_clip(cfg), multi_precision=multi_precision)


@OPTIMIZERS.register("sgd")
def sgd(lr, groups, cfg, multi_precision=False):
    return paddle.optimizer.SGD(learning_rate=lr, parameters=groups, weight_decay=cfg.optimizer.weight_decay,
                                grad_clip=_grad_clip(cfg), multi_precision=multi_precision)


@OPTIMIZERS.register("adamw")
def adamw(lr, groups, cfg, multi_precision=False):
    return paddle.optimizer.AdamW(learning_rate=lr, parameters=groups, weight_decay=cfg.optimizer.weight_decay,
                                  grad_clip=_grad_clip(cfg), multi_precision=multi_precision)


def build_optimizer(cfg, model, lr_schedule, multi_precision=False):
    groups = param_groups(model, cfg.optimizer.weight_decay, cfg.optimizer.decay_bn_and_bias,
                          cfg.optimizer.decay_params)
    return OPTIMIZERS.build(cfg.optimizer.name, lr=lr_schedule, groups=groups, cfg=cfg,
                            multi_precision=multi_precision)


import ppdlx.optim.rmsprop_tf  # noqa: E402,F401  (registers rmsprop_tf)
