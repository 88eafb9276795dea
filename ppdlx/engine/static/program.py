"""Tracing the train and eval programs from the same ``paddle.nn.Layer`` the dynamic step trains.

The programs are traced from the Layer that the task's model builder returns (no separate static
model code), with the task's loss, the registry optimizer over the same parameter groups, and fed
by the same loaders. Nothing here reads the config: a :class:`ProgramSpec` carries plain values and
builders.

One train program does a whole step: forward, loss, backward, then, inside a
``static.nn.cond``, the optimizer update. The condition is "the loss is finite" (and, with
``accumulate=k``, "this is the k-th micro-batch" and "every micro-batch of the window was
finite"), which gives the dynamic step's semantics exactly: a non-finite step is skipped (no
update, no LR step), gradients of k micro-batches are summed in persistable buffers and applied
once. With several ranks the gradients are all-reduced (mean) inside the program
(``fleet.init(is_collective=True)`` initialises the collective context; gloo on CPU, NCCL on GPU).
Legacy IR: optimizers refuse to run inside ``cond``, so there the update is unconditional and
accumulation uses ``GradientMergeOptimizer``.

The eval program is traced from a second instance of the same Layer class built under the
same fresh unique-name scope, in ``eval()`` mode, so its variables have the train program's
names and read the same scope tensors. (PIR values belong to one program, so one instance
cannot be traced into two programs, and ``clone()`` + ``is_test`` would miss Python-level
``self.training`` branches such as drop-path.)
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

import paddle
from paddle.distributed import fleet

from ppdlx.data.mixing import mix_batch, mix_inputs
from ppdlx.engine.amp import AmpPlan, autocast
from ppdlx.engine.static import amp as static_amp
from ppdlx.engine.static.ir_compat import (both, collective_value, global_var, is_finite_scalar, legacy_ir_ops,
                                           use_pir)
from ppdlx.engine.static.state import inner_optimizer
from ppdlx.errors import UnsupportedError
from ppdlx.optim.optimizers import flat_optimizer


@dataclass
class ProgramSpec:
    """What tracing needs, without the config.

    ``build_model()`` -> a fresh Layer; ``build_loss()`` -> a criterion called as
    ``loss(logits, labels)`` or ``loss(logits, targets=...)`` with ``targets(labels)`` (Mixup / CutMix);
    ``param_groups(model)`` -> ``ppdlx.optim.param_groups``-style groups; ``build_optimizer(lr,
    params, multi_precision)`` -> the registry optimizer over a flat parameter list;
    ``build_scaler(amp_plan)`` -> the AMP loss scaler the config asks for, or None.
    """
    build_model: Callable[[], Any]
    build_loss: Callable[[], Any]
    param_groups: Callable[[Any], List[dict]]
    build_optimizer: Callable[[Any, list, bool], Any]
    data_format: str = "NCHW"
    accumulate: int = 1
    mix: bool = False  # Mixup / CutMix: the step feeds each step's draw (ppdlx.data.mixing)
    ema: bool = False
    build_scaler: Callable[[AmpPlan], Any] = lambda amp: None


class Programs:
    """The train/eval programs and the handles the step needs."""

    def __init__(self):
        self.main = paddle.static.Program()
        self.startup = paddle.static.Program()
        self.eval = paddle.static.Program()
        self.feeds: Dict[str, Any] = {}
        self.loss = None
        self.finite = None           # this rank's verdict
        self.finite_global = None    # every rank's (with several ranks under PIR)
        self.logits = None
        self.model = None            # the static train Layer
        self.eval_model = None
        self.optimizer = None
        self.loss_scaling = None     # state.LossScaling under AMP with a loss scaler
        self.ema_shadow: Dict[str, str] = {}  # structured name -> shadow variable name
        self.conditional = True      # the update is skipped in-graph when the loss is not finite
        self.unskipped_note = ""     # what happens instead when it is not (warning text)

    @property
    def fetch(self) -> list:
        """Loss and the finite flag the update was conditioned on."""
        return [self.loss, self.finite_global if self.finite_global is not None else self.finite]


def static_optimizer(spec: ProgramSpec, model, lr_schedule, multi_precision: bool):
    """The registry optimizer over the model's parameter groups as one flat list
    (``ppdlx.optim.flat_optimizer``, as the dynamic step's)."""
    return flat_optimizer(lambda params: spec.build_optimizer(lr_schedule, params, multi_precision),
                          spec.param_groups(model))


def build_programs(spec: ProgramSpec, lr_schedule, amp: AmpPlan, world: int) -> Programs:
    """Trace the train and eval programs (call inside ``ir_compat.static_graph``)."""
    pr = Programs()
    k = spec.accumulate
    shape = [None, 3, None, None] if spec.data_format == "NCHW" else [None, None, None, 3]
    static_amp.check_combination(amp, k, world)
    amp_ctx = functools.partial(autocast, amp)  # the dynamic forward's autocast, its op lists included
    with legacy_ir_ops(), paddle.static.program_guard(pr.main, pr.startup), paddle.utils.unique_name.guard():
        model = spec.build_model()
        model.train()
        optimizer = static_optimizer(spec, model, lr_schedule, multi_precision=amp.enabled)
        amp_optimizer = None
        if amp.enabled:
            model, amp_optimizer = static_amp.decorate(amp, model, optimizer)
        images = paddle.static.data("images", shape, "float32")
        labels = paddle.static.data("labels", [None], "int64")
        pr.feeds.update(images=images, labels=labels)
        criterion = spec.build_loss()
        if spec.mix:  # ClassificationObjective's arithmetic, the step's draw fed
            lam, weight, box = mix_inputs()
            pr.feeds.update(mix_lam=lam, mix_weight=weight, mix_box=box)
            mixed, targets = mix_batch(images, criterion.targets(labels), lam, weight, box,
                                       spec.data_format == "NHWC")
            with amp_ctx():
                logits = model(mixed)
            loss = criterion(logits, targets=targets)
        else:
            with amp_ctx():
                logits = model(images)
            loss = criterion(logits, labels)
        finite = is_finite_scalar(loss)
        ema_update = _ema_ops(pr, model, optimizer) if spec.ema else None
        if amp.enabled:
            pr.loss_scaling = static_amp.append_update(amp, spec.build_scaler(amp), amp_optimizer, loss, ema_update)
            pr.conditional = False
            pr.unskipped_note = ("loss scaling zeroed the gradients, the optimizer op still ran"
                                 if pr.loss_scaling and pr.loss_scaling.incr_count else
                                 "update applied (static AMP without dynamic loss scaling cannot skip it)")
        else:
            _append_update(pr, optimizer, loss, finite, k, world, ema_update)
        pr.loss, pr.finite, pr.model, pr.optimizer = loss, finite, model, optimizer
    with legacy_ir_ops(), paddle.static.program_guard(pr.eval, paddle.static.Program()), \
            paddle.utils.unique_name.guard():
        eval_model = spec.build_model()
        eval_model.eval()
        # float32 without autocast, as the dynamic step evaluates; under O2 it runs on a scope of
        # float32 views of the masters (StaticProgramStep.eval_scope)
        eval_images = paddle.static.data("images", shape, "float32")
        pr.logits = paddle.cast(eval_model(eval_images), "float32")
        pr.eval_model = eval_model
    train_names = {n: v.name for n, v in model.state_dict().items()}
    eval_names = {n: v.name for n, v in eval_model.state_dict().items()}
    if train_names != eval_names:  # would silently evaluate other weights
        raise RuntimeError("static eval program does not share the train program's variable names")
    return pr


def _ema_ops(pr, model, optimizer):
    """Persistable EMA shadows of every floating state entry; returns ``update()`` that appends
    ``shadow = shadow * d + w * (1 - d)`` with ``d`` / ``1 - d`` fed per step (as ``ModelEMA``).
    Under AMP O2 ``w`` is the parameter's fp32 master (as ``ModelEMA`` averages the masters);
    ``update()`` must come after the optimizer ops, which create the masters."""
    ema_decay = paddle.static.data("ema_decay", [1], "float32")
    ema_rest = paddle.static.data("ema_rest", [1], "float32")
    pr.feeds.update(ema_decay=ema_decay, ema_rest=ema_rest)
    shadows = {}
    for name, var in model.state_dict().items():
        if var.dtype in (paddle.float32, paddle.float16, paddle.bfloat16):
            shadows[name] = (var, global_var(f"{var.name}@EMA", var.shape))
    pr.ema_shadow = {n: s.name for n, (_, s) in shadows.items()}

    def update():
        masters = getattr(inner_optimizer(optimizer), "_master_weights", None) or {}
        for var, shadow in shadows.values():
            source = masters.get(var.name, var)
            paddle.assign(paddle.scale(shadow, scale=ema_decay)
                          + paddle.scale(paddle.cast(source, "float32"), scale=ema_rest), output=shadow)
    return update


def _append_update(pr, optimizer, loss, finite, k: int, world: int, ema_update: Optional[Callable]) -> None:
    """PIR: backward; [all-reduce]; cond(finite [and k-th micro-batch]) -> update [+ EMA]."""
    if not use_pir():
        _append_update_legacy(pr, optimizer, loss, k, world, ema_update)
        return
    pr.conditional = True
    params_grads = optimizer.backward(loss / k if k > 1 else loss)
    optimizer._create_global_learning_rate()  # the LR variable must live outside the cond block
    local_finite = finite
    if world > 1:
        bad = 1.0 - paddle.cast(finite, "float32")
        bad = collective_value(paddle.distributed.all_reduce(bad), bad)  # any rank non-finite -> all skip
        finite = bad == 0.0
        pr.finite_global = finite

    def mean_over_ranks(g):
        return paddle.scale(collective_value(paddle.distributed.all_reduce(g), g), scale=1.0 / world)

    def update(pairs):
        optimizer.apply_gradients(pairs)
        if ema_update is not None:
            ema_update()

    if k == 1:
        if world > 1:
            params_grads = [(p, mean_over_ranks(g)) for p, g in params_grads]
        paddle.static.nn.cond(finite, lambda: update(params_grads), None)
        return
    apply_now = paddle.static.data("apply_now", [1], "bool")
    pr.feeds["apply_now"] = apply_now
    buffers = [(p, g, global_var(f"{p.name}@GRAD@ACC", p.shape, g.dtype)) for p, g in params_grads]

    def accumulate():
        for _, g, buf in buffers:
            paddle.assign(buf + g, output=buf)

    def apply():
        update([(p, mean_over_ranks(buf) if world > 1 else buf) for p, _, buf in buffers])

    # a window with a non-finite micro-batch is skipped whole, as the dynamic step skips it
    window_finite = global_var("ppdlx@WINDOW_FINITE", [1], "float32", 1.0)
    paddle.assign(window_finite * paddle.cast(finite, "float32"), output=window_finite)

    def reset():
        for _, _, buf in buffers:
            paddle.assign(paddle.full_like(buf, 0.0), output=buf)
        paddle.assign(paddle.full_like(window_finite, 1.0), output=window_finite)

    paddle.static.nn.cond(local_finite, accumulate, None)
    paddle.static.nn.cond(both(apply_now, window_finite > 0.5), apply, None)
    paddle.static.nn.cond(apply_now, reset, None)


def _append_update_legacy(pr, optimizer, loss, k: int, world: int, ema_update: Optional[Callable]) -> None:
    """Legacy IR: optimizers refuse to run inside a cond block ("current block is not global_block,
    but it doesn't have backward block"), so the update is unconditional (a non-finite step is
    counted, not skipped), accumulation is ``GradientMergeOptimizer`` and several ranks go through
    ``fleet.distributed_optimizer``."""
    pr.conditional = False
    pr.unskipped_note = "update applied (legacy IR cannot skip it)"
    opt = optimizer
    if world > 1:
        opt = fleet.distributed_optimizer(opt, fleet.DistributedStrategy())
    if k > 1:
        opt = paddle.incubate.optimizer.GradientMergeOptimizer(opt, k_steps=k, avg=True)
    try:
        opt.minimize(loss)
    except ValueError as err:
        if world > 1 and "comm_id must be generated" in str(err):
            raise UnsupportedError(
                f"train.graph=static on {world} ranks under legacy IR: fleet's collective program optimizer "
                f"needs NCCL/BKCL ('{err}' on this CPU build); unset FLAGS_enable_pir_api (PIR all-reduces over "
                f"gloo)") from None
        raise
    if ema_update is not None:
        ema_update()  # every micro-batch; the loop feeds d=1 between updates
