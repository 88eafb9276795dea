"""Paddle's optimizers as registered factories (``OPTIMIZERS``): ``(lr, groups, cfg, multi_precision)``
-> optimizer; the parameter groups (which parameters decay) and gradient clipping they share."""
from __future__ import annotations

import paddle

from ppdlx.registry import OPTIMIZERS


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


def flat_optimizer(build, groups: list):
    """``build(params)`` over one flat parameter list, the groups' weight-decay exemptions kept per
    parameter: ``L2Decay(0)`` regularizers for the coupled decays (Momentum fuses it exactly as a
    group with weight_decay 0) or AdamW's ``apply_decay_param_fun``. Paddle applies ``grad_clip``
    once per parameter group (``Optimizer._apply_optimize`` runs per group), so a global-norm clip
    over two groups clipped each to the norm on its own; over one list the norm is global, as in a
    static program, whose ``minimize`` takes no groups."""
    params = [p for g in groups for p in g["params"]]
    optimizer = build(params)
    no_decay = {p.name for g in groups if len(groups) > 1 and not g["weight_decay"] for p in g["params"]}
    if no_decay:
        if hasattr(optimizer, "_apply_decay_param_fun"):
            optimizer._apply_decay_param_fun = lambda name: name not in no_decay
        else:
            for p in params:
                if p.name in no_decay:
                    p.regularizer = paddle.regularizer.L2Decay(0.0)
    return optimizer


def grad_clip(cfg):
    """Global-norm clipping at ``optimizer.grad_clip_norm`` (None when 0: off)."""
    return paddle.nn.ClipGradByGlobalNorm(cfg.optimizer.grad_clip_norm) if cfg.optimizer.grad_clip_norm else None


@OPTIMIZERS.register("momentum")
def momentum(lr, groups, cfg, multi_precision=False):
    o = cfg.optimizer
    return paddle.optimizer.Momentum(learning_rate=lr, momentum=o.momentum, parameters=groups,
                                     use_nesterov=o.nesterov, weight_decay=o.weight_decay,
                                     grad_clip=grad_clip(cfg), multi_precision=multi_precision)


@OPTIMIZERS.register("sgd")
def sgd(lr, groups, cfg, multi_precision=False):
    return paddle.optimizer.SGD(learning_rate=lr, parameters=groups, weight_decay=cfg.optimizer.weight_decay,
                                grad_clip=grad_clip(cfg), multi_precision=multi_precision)


@OPTIMIZERS.register("adamw")
def adamw(lr, groups, cfg, multi_precision=False):
    return paddle.optimizer.AdamW(learning_rate=lr, parameters=groups, weight_decay=cfg.optimizer.weight_decay,
                                  grad_clip=grad_clip(cfg), multi_precision=multi_precision)
