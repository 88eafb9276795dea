"""Optimizers and LR schedules: ``build_optimizer`` / ``build_lr_schedule`` pick them by name
from ``OPTIMIZERS`` / ``LR_SCHEDULES``, where the implementation modules register them
(``optimizers``: paddle's momentum, sgd, adamw; ``rmsprop_tf``; ``schedules``).
"""
from __future__ import annotations

import ppdlx.optim.rmsprop_tf  # noqa: F401  (registers rmsprop_tf)
from ppdlx.optim.optimizers import flat_optimizer, grad_clip, is_no_decay, param_groups
from ppdlx.optim.schedules import batch_change_line, build_lr_schedule, global_batch_record, scaled_lr
from ppdlx.registry import OPTIMIZERS

__all__ = ["batch_change_line", "build_lr_schedule", "build_optimizer", "flat_optimizer", "global_batch_record",
           "grad_clip", "is_no_decay", "optimizer_groups", "param_groups", "scaled_lr"]


def optimizer_groups(cfg, model) -> list:
    """:func:`param_groups` of ``model`` as ``cfg.optimizer`` asks (which parameters decay)."""
    return param_groups(model, cfg.optimizer.weight_decay, cfg.optimizer.decay_params)


def build_optimizer(cfg, model, lr_schedule, multi_precision=False):
    groups = optimizer_groups(cfg, model)
    return flat_optimizer(lambda params: OPTIMIZERS.build(cfg.optimizer.name, lr=lr_schedule, groups=params, cfg=cfg,
                                                          multi_precision=multi_precision), groups)
