"""Paddle's optimizers as registered factories (``OPTIMIZERS``): ``(lr, groups, cfg, multi_precision)``
-> optimizer; the parameter groups (which parameters decay) and gradient clipping they share."""
from __future__ import annotations

import paddle

from ppdlx.registry import OPTIMIZERS


# Which parameters a recipe decays (``optimizer.decay_params``); the others get no weight decay.
#   all          every parameter
#   all_but_bn   BatchNorm scales and shifts excluded, biases decay: NVIDIA's Paddle ResNet50
#                (``bn_weight_decay`` off: ``L2Decay(0.0)`` on BatchNorm parameters only), and TF's
#                EfficientNet(-Lite) recipe (every variable but batch_normalization's)
#   all_but_1d   every 1-D parameter excluded (BatchNorm and biases): timm's ``filter_bias_and_bn``
#   conv_kernels only 4-D parameters (conv, depthwise and pointwise kernels): EfficientDet
DECAY_PARAMS = ("all", "all_but_bn", "all_but_1d", "conv_kernels")
BATCH_NORMS = (paddle.nn.BatchNorm, paddle.nn.BatchNorm1D, paddle.nn.BatchNorm2D, paddle.nn.BatchNorm3D,
               paddle.nn.SyncBatchNorm)


def is_no_decay(name: str, param) -> bool:
    """timm's rule: BN scales/shifts and biases (every 1-D parameter) get no weight decay."""
    return len(param.shape) <= 1


def batch_norm_parameters(model) -> set:
    """ids of the scale and shift parameters of every BatchNorm layer of ``model``."""
    return {id(p) for layer in model.sublayers(include_self=True) if isinstance(layer, BATCH_NORMS)
            for p in layer.parameters(include_sublayers=False)}


def decays(model, decay_params: str):
    """``decays(name, param) -> bool`` for the rule ``decay_params`` (one of ``DECAY_PARAMS``)."""
    if decay_params == "all":
        return lambda name, p: True
    if decay_params == "all_but_bn":
        bn = batch_norm_parameters(model)
        return lambda name, p: id(p) not in bn
    if decay_params == "all_but_1d":
        return lambda name, p: not is_no_decay(name, p)
    if decay_params == "conv_kernels":
        return lambda name, p: len(p.shape) == 4
    raise ValueError(f"decay_params must be one of {', '.join(DECAY_PARAMS)}, got {decay_params!r}")


def param_groups(model, weight_decay: float, decay_params: str = "all_but_1d"):
    """``[{"params": decayed, "weight_decay": weight_decay}, {"params": the others, "weight_decay": 0.0}]``
    (one group when every parameter decays or ``weight_decay`` is 0); ``decay_params`` as ``DECAY_PARAMS``."""
    params = [p for p in model.parameters() if not p.stop_gradient]
    rule = decays(model, decay_params)
    if decay_params == "all" or weight_decay == 0:
        return [{"params": params, "weight_decay": weight_decay}]
    names = {id(p): n for n, p in model.named_parameters()}
    decay = [p for p in params if rule(names.get(id(p), ""), p)]
    no_decay = [p for p in params if not rule(names.get(id(p), ""), p)]
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
