"""Static-graph training (``train.graph=static``) from the same model, loss, optimizer and data.

The programs are traced from the ``paddle.nn.Layer`` that ``build_model(cfg)`` returns (no
separate static model code), with the loss from ``ppdlx.losses``, the optimizer and LR schedule
from ``ppdlx.optim`` (same weight-decay exclusions) and the loaders from ``ppdlx.data``.
Only program building and ``Executor.run`` run in static mode; the loop around them (loaders,
logging, checkpoints, evaluation metrics, collectives for metrics) stays in dygraph mode, so
every data backend feeds the executor unchanged: a loader's paddle Tensors are handed over as
their ``DenseTensor`` (:func:`as_feed`), so batches stay on their device.

One train program does a whole step: forward, loss, backward, then, inside a
``static.nn.cond``, the optimizer update. The condition is "the loss is finite" (and, with
``train.accumulate=k``, "this is the k-th micro-batch"), which gives the dynamic trainer's
semantics exactly: a non-finite step is skipped (no update, no LR step), gradients of k
micro-batches are summed in persistable buffers and applied once. With several ranks the
gradients are all-reduced (mean) inside the program (``fleet.init(is_collective=True)``
initialises the collective context; gloo on CPU, NCCL on GPU).

The eval program is traced from a second instance of the same Layer class built under the
same fresh unique-name scope, in ``eval()`` mode, so its variables have the train program's
names and read the same scope tensors. (PIR values belong to one program, so one instance
cannot be traced into two programs, and ``clone()`` + ``is_test`` would miss Python-level
``self.training`` branches such as drop-path.)

Checkpoints use the dynamic trainer's layout: ``.pdparams`` keyed by the Layer's
``state_dict`` names (so static and dynamic checkpoints load into each other and export works
from either), ``.pdopt`` keyed by the names the dynamic optimizer would use plus
``LR_Scheduler`` (and ``master_weights`` under AMP O2), ``.pdstates`` with the same keys (the
loss scaler's state under ``scaler``); all written atomically. The scope <-> checkpoint mapping,
including the float32 master weights AMP O2 keeps, is :mod:`ppdlx.engine.static_state`; static
AMP is :mod:`ppdlx.engine.static_amp`.

IR modes: PIR (Paddle's default) is the primary path. Legacy IR (``FLAGS_enable_pir_api=0``)
also trains, bit-identically for ResNets: Paddle 3.3.1's generated ``paddle.sum`` accepts only
PIR values in static mode, so while tracing under legacy IR it is routed to the legacy
``reduce_sum`` op (:func:`legacy_ir_ops`); legacy optimizers refuse to run inside ``cond``, so
there the update is unconditional and accumulation uses ``GradientMergeOptimizer``. Findings,
measurements and the static AMP / fleet status on CPU: docs/graph_modes.md.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import time
from typing import Any, Dict, Optional

import numpy as np
import paddle
from paddle.base import core
from paddle.base.framework import _dygraph_guard

from ppdlx.config import save_config
from ppdlx.data.loader import build_classification_loader
from ppdlx.engine import checkpoint as ckpt
from ppdlx.engine import dist, static_amp
from ppdlx.engine.run import _classes_of
from ppdlx.engine.cpu_kernels import plan_fast_cpu_kernels
from ppdlx.engine.run import _setup as run_setup
from ppdlx.engine.amp import AmpPlan
from ppdlx.engine.builders import build_model, count_params, seed_everything
from ppdlx.engine.evaluator import ClassificationEvaluator
from ppdlx.engine.logger import MetricLogger, format_eta
from ppdlx.engine.static_state import (ScopeState, inner_optimizer, master_weight_names, read_var,
                                       scope_tensor, share_float32_views)
from ppdlx.engine.trainer import NonFiniteLossError
from ppdlx.errors import ConfigError, UnsupportedError
from ppdlx.losses import build_loss
from ppdlx.optim import build_lr_schedule, param_groups, scaled_lr
from ppdlx.registry import OPTIMIZERS

log = logging.getLogger("ppdlx")
tlog = logging.getLogger("ppdlx.train")


# ----------------------------------------------------------------------------- graph mode
def use_pir() -> bool:
    return bool(paddle.base.framework.use_pir_api())


def ir_name() -> str:
    return "PIR" if use_pir() else "legacy IR (FLAGS_enable_pir_api=0)"


@contextlib.contextmanager
def static_graph():
    """Static mode for the duration (program building, ``Executor.run``) without touching the
    dygraph state around it (``paddle.enable_static()`` would swap the unique-name generator and
    the default programs; this only switches the tracer off)."""
    if not paddle.in_dynamic_mode():
        yield
        return
    with _dygraph_guard(None):
        yield


@contextlib.contextmanager
def legacy_ir_ops():
    """Under legacy IR, route ``paddle.sum`` / ``Tensor.sum`` to the legacy ``reduce_sum`` op.

    Paddle 3.3.1's generated ``sum`` (like ``isfinite``, ``all``, ``logical_*``, ``sigmoid``,
    ``floor``) accepts only PIR values in static mode ("must be Value, but got Variable"); the
    loss needs ``sum``, and this module avoids the others. A no-op under PIR; restored on exit.
    """
    if use_pir():
        yield
        return
    from paddle.base.framework import Variable
    from paddle.base.layer_helper import LayerHelper

    orig_sum, orig_method = paddle.sum, Variable.sum

    def legacy_sum(x, axis=None, dtype=None, keepdim=False, name=None):
        if not isinstance(x, Variable) or dtype is not None:
            return orig_sum(x, axis=axis, dtype=dtype, keepdim=keepdim, name=name)
        helper = LayerHelper("reduce_sum")
        out = helper.create_variable_for_type_inference(dtype=x.dtype)
        dims = [] if axis is None else ([axis] if isinstance(axis, int) else list(axis))
        helper.append_op(type="reduce_sum", inputs={"X": x}, outputs={"Out": out},
                         attrs={"dim": dims, "keep_dim": bool(keepdim), "reduce_all": axis is None})
        return out

    paddle.sum, Variable.sum = legacy_sum, legacy_sum
    try:
        yield
    finally:
        paddle.sum, Variable.sum = orig_sum, orig_method


def is_finite_scalar(x):
    """``x - x == 0`` is False exactly for NaN and +-inf; built from ops both IRs accept."""
    return (x - x) == 0.0


def both(a, b):
    """Logical and of two bool scalars without ``paddle.logical_and`` (PIR-only in 3.3.1)."""
    return (paddle.cast(a, "float32") * paddle.cast(b, "float32")) > 0.5


def as_feed(x, dtype: str, flat: bool = False):
    """A loader output as an executor feed of ``dtype`` (``flat``: 1-D).

    Paddle Tensors (and ``DenseTensor``s) are cast/reshaped where they live and handed over as a
    ``DenseTensor`` sharing their memory (the executor takes those as they are:
    ``Executor._pir_feed_data``); numpy input stays numpy (the executor copies it once).
    """
    if isinstance(x, core.DenseTensor):
        x = paddle.Tensor(x, place=x._place())  # same place: shares the memory
    if isinstance(x, paddle.Tensor):
        if x.dtype != getattr(paddle, dtype):
            x = x.astype(dtype)
        if flat and len(x.shape) != 1:
            x = x.reshape([-1])
        if not x.is_contiguous():
            x = x.contiguous()
        dense = core.DenseTensor()
        dense._share_data_with(x.get_tensor())  # keeps the memory alive after ``x`` is gone
        return dense
    x = np.asarray(x, dtype=dtype)
    return x.reshape(-1) if flat else x


def feed_rows(x) -> int:
    """Leading dimension of a feed value (``DenseTensor.shape`` is a method)."""
    return int(x.shape()[0] if callable(x.shape) else x.shape[0])


# ----------------------------------------------------------------------------- static AMP
def _first_line(err: BaseException) -> str:
    lines = [l.strip() for l in str(err).splitlines() if l.strip() and not l.strip().startswith("[")]
    line = (lines[-1] if lines else type(err).__name__).split(" (at /paddle")[0]
    if line == "std::exception":
        line = "a oneDNN kernel raised dnnl::error"
    return line.replace("(InvalidType) ", "").rstrip(", ")[:200]


def _probe_feed(pr, cfg, num_classes: int) -> dict:
    c = cfg.data.transforms.crop_size
    shape = [2, 3, c, c] if cfg.model.data_format == "NCHW" else [2, c, c, 3]
    half = np.asarray([0.5], np.float32)
    values = {"images": np.random.default_rng(0).standard_normal(shape).astype(np.float32),
              "labels": np.asarray([0, 1 % num_classes], np.int64), "mix_perm": np.asarray([1, 0], np.int64),
              "mix_lam": half, "mix_lam_c": half, "ema_decay": half, "ema_rest": half,
              "apply_now": np.asarray([True])}
    return {name: values[name] for name in pr.feeds}


def amp_step_trains_here(cfg, dtype: str, level: str):
    """One AMP train step of the configured model, loss and optimizer, built by :func:`build_programs`
    (batch of 2, throwaway programs and scope, CPU). Returns ``(True, "")`` or ``(False, why)``.

    Paddle 3.3.1's CPU build here: no float16 conv2d/matmul/momentum kernels (PIR refuses the ops
    while building); bf16 O1/O2 cast batch_norm's input to bf16, which has no CPU kernel, bf16
    momentum/adamw have none either, and bf16 matmul/conv2d raise ``dnnl::error`` in oneDNN without
    AVX512-BF16. The one bf16 optimizer kernel, sgd, ignores the fp32 master weights
    (paddle/phi/kernels/cpu/sgd_kernel.cc), so O2 would train the bf16 copies while the masters --
    what is saved, evaluated and averaged -- stay put: the probe checks that the masters moved.
    """
    import warnings
    probe_cfg = cfg.model_copy(deep=True)
    probe_cfg.train.accumulate = 1  # accumulation is refused with AMP separately
    num_classes = cfg.model.num_classes
    scope = paddle.static.Scope()
    try:
        with warnings.catch_warnings(), static_graph(), paddle.static.scope_guard(scope):
            warnings.simplefilter("ignore")
            pr = build_programs(probe_cfg, num_classes, 0.1, AmpPlan(True, dtype, level, False), world=1)
            exe = paddle.static.Executor(paddle.CPUPlace())
            exe.run(pr.startup, scope=scope)
            masters = {n: read_var(scope, n).copy() for n in master_weight_names(pr.optimizer).values()}
            out = exe.run(pr.main, feed=_probe_feed(pr, cfg, num_classes), fetch_list=[pr.loss], scope=scope)
        if not np.isfinite(out[0]).all():
            return False, "the probe step's loss is not finite"
        if masters and all(np.array_equal(v, read_var(scope, n)) for n, v in masters.items()):
            return False, (f"the {cfg.optimizer.name} step left the fp32 master weights unchanged: its CPU "
                           f"kernel ignores multi_precision")
        return True, ""
    except Exception as err:  # noqa: BLE001 - any failure means "not usable"
        return False, _first_line(err)


def plan_static_amp(cfg, device: str) -> AmpPlan:
    """What static AMP does for this config on ``device`` (:func:`ppdlx.engine.static_amp.plan`)."""
    return static_amp.plan(cfg.amp, device, use_pir(),
                           probe=lambda dtype, level: amp_step_trains_here(cfg, dtype, level))


# ----------------------------------------------------------------------------- programs
class _Programs:
    """The train/eval programs and the handles the loop needs."""

    def __init__(self):
        self.main = paddle.static.Program()
        self.startup = paddle.static.Program()
        self.eval = paddle.static.Program()
        self.feeds: Dict[str, Any] = {}
        self.loss = None
        self.finite = None
        self.logits = None
        self.model = None            # the static train Layer
        self.eval_model = None
        self.optimizer = None
        self.loss_scaling = None     # static_state.LossScaling under AMP with a loss scaler
        self.ema_shadow: Dict[str, str] = {}  # structured name -> shadow variable name
        self.conditional = True      # the update is skipped in-graph when the loss is not finite
        self.unskipped_note = ""     # what happens instead when it is not (warning text)


def optimizer_groups(cfg, model):
    """``ppdlx.optim.param_groups`` for this config (whichever optional knobs it takes)."""
    import inspect
    o = cfg.optimizer
    kwargs = {}
    if "decay_params" in inspect.signature(param_groups).parameters and hasattr(o, "decay_params"):
        kwargs["decay_params"] = o.decay_params
    return param_groups(model, o.weight_decay, o.decay_bn_and_bias, **kwargs)


def _static_optimizer(cfg, model, lr_schedule, multi_precision: bool):
    """The registry optimizer over a flat parameter list (static ``minimize``/``apply_gradients``
    take no parameter groups); the dynamic groups' weight-decay exclusions become per-parameter
    ``L2Decay(0)`` regularizers (coupled decay: Momentum fuses it exactly as for a group with
    weight_decay 0) or, for decoupled AdamW, ``apply_decay_param_fun``."""
    groups = optimizer_groups(cfg, model)
    params = [p for g in groups for p in g["params"]]
    optimizer = OPTIMIZERS.build(cfg.optimizer.name, lr=lr_schedule, groups=params, cfg=cfg,
                                 multi_precision=multi_precision)
    no_decay = {p.name for g in groups if len(groups) > 1 and not g["weight_decay"] for p in g["params"]}
    if no_decay:
        if hasattr(optimizer, "_apply_decay_param_fun"):
            optimizer._apply_decay_param_fun = lambda name: name not in no_decay
        else:
            for p in params:
                if p.name in no_decay:
                    p.regularizer = paddle.regularizer.L2Decay(0.0)
    return optimizer


def _global_var(name: str, shape, dtype="float32", value=0.0):
    """A persistable variable initialised to ``value`` in the startup program."""
    if use_pir():  # create_global_var mixes VarType/DataType under PIR in 3.3.1
        return paddle.pir.core.create_persistable_value(
            dtype, list(shape), name=name, initializer=paddle.nn.initializer.Constant(value))
    return paddle.static.create_global_var(shape=list(shape), value=value, dtype=dtype, persistable=True,
                                           name=name)


def build_programs(cfg, num_classes: int, lr_schedule, amp: AmpPlan, world: int) -> _Programs:
    """Trace the train and eval programs (call inside :func:`static_graph`)."""
    pr = _Programs()
    fmt, k = cfg.model.data_format, cfg.train.accumulate
    shape = [None, 3, None, None] if fmt == "NCHW" else [None, None, None, 3]
    static_amp.check_combination(amp, k, world)
    amp_ctx = (lambda: paddle.amp.auto_cast(True, level=amp.level, dtype=amp.dtype)) if amp.enabled \
        else contextlib.nullcontext
    with legacy_ir_ops(), paddle.static.program_guard(pr.main, pr.startup), paddle.utils.unique_name.guard():
        model = build_model(cfg)
        model.train()
        optimizer = _static_optimizer(cfg, model, lr_schedule, multi_precision=amp.enabled)
        amp_optimizer = None
        if amp.enabled:
            model, amp_optimizer = static_amp.decorate(amp, model, optimizer)
        images = paddle.static.data("images", shape, "float32")
        labels = paddle.static.data("labels", [None], "int64")
        pr.feeds.update(images=images, labels=labels)
        criterion = build_loss(cfg, num_classes)
        if cfg.train.mixup_alpha > 0:
            # same arithmetic as ClassificationObjective: lam and the permutation come from its RNG
            perm = paddle.static.data("mix_perm", [None], "int64")
            lam = paddle.static.data("mix_lam", [1], "float32")
            lam_c = paddle.static.data("mix_lam_c", [1], "float32")
            pr.feeds.update(mix_perm=perm, mix_lam=lam, mix_lam_c=lam_c)
            mixed = paddle.scale(images, scale=lam) + paddle.scale(paddle.gather(images, perm), scale=lam_c)
            targets = criterion.targets(labels)
            targets = paddle.scale(targets, scale=lam) + paddle.scale(paddle.gather(targets, perm), scale=lam_c)
            with amp_ctx():
                logits = model(mixed)
            loss = criterion(logits, targets=targets)
        else:
            with amp_ctx():
                logits = model(images)
            loss = criterion(logits, labels)
        finite = is_finite_scalar(loss)
        ema_update = _ema_ops(pr, model, optimizer) if cfg.ema.enabled else None
        if amp.enabled:
            pr.loss_scaling = static_amp.append_update(amp, cfg.amp, amp_optimizer, loss, ema_update)
            pr.conditional = False
            pr.unskipped_note = ("loss scaling zeroed the gradients, the optimizer op still ran"
                                 if pr.loss_scaling and pr.loss_scaling.incr_count else
                                 "update applied (static AMP without dynamic loss scaling cannot skip it)")
        else:
            _append_update(pr, optimizer, loss, finite, k, world, ema_update)
        pr.loss, pr.finite, pr.model, pr.optimizer = loss, finite, model, optimizer
    with legacy_ir_ops(), paddle.static.program_guard(pr.eval, paddle.static.Program()), \
            paddle.utils.unique_name.guard():
        eval_model = build_model(cfg)
        eval_model.eval()
        # float32 without autocast, as the dynamic trainer evaluates; under O2 it runs on a scope of
        # float32 views of the masters (StaticTrainer.eval_scope)
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
            shadows[name] = (var, _global_var(f"{var.name}@EMA", var.shape))
    pr.ema_shadow = {n: s.name for n, (_, s) in shadows.items()}

    def update():
        masters = getattr(inner_optimizer(optimizer), "_master_weights", None) or {}
        for var, shadow in shadows.values():
            source = masters.get(var.name, var)
            paddle.assign(paddle.scale(shadow, scale=ema_decay)
                          + paddle.scale(paddle.cast(source, "float32"), scale=ema_rest), output=shadow)
    return update


def _value(out, fallback):
    """``paddle.distributed.all_reduce`` returns the reduced value in PIR, None/task in legacy."""
    return out if isinstance(out, (paddle.pir.Value, paddle.base.framework.Variable)) else fallback


def _append_update(pr, optimizer, loss, finite, k: int, world: int, ema_update) -> None:
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
        bad = _value(paddle.distributed.all_reduce(bad), bad)  # any rank non-finite -> all skip (no deadlock)
        finite = bad == 0.0
        pr.finite_global = finite

    def mean_over_ranks(g):
        return paddle.scale(_value(paddle.distributed.all_reduce(g), g), scale=1.0 / world)

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
    buffers = [(p, g, _global_var(f"{p.name}@GRAD@ACC", p.shape, g.dtype)) for p, g in params_grads]

    def accumulate():
        for _, g, buf in buffers:
            paddle.assign(buf + g, output=buf)

    def apply():
        update([(p, mean_over_ranks(buf) if world > 1 else buf) for p, _, buf in buffers])

    def reset():
        for _, _, buf in buffers:
            paddle.assign(paddle.full_like(buf, 0.0), output=buf)

    paddle.static.nn.cond(local_finite, accumulate, None)
    paddle.static.nn.cond(both(apply_now, finite), apply, None)
    paddle.static.nn.cond(apply_now, reset, None)


def _append_update_legacy(pr, optimizer, loss, k: int, world: int, ema_update) -> None:
    """Legacy IR: optimizers refuse to run inside a cond block ("current block is not global_block,
    but it doesn't have backward block"), so the update is unconditional (a non-finite step is
    counted, not skipped), accumulation is ``GradientMergeOptimizer`` and several ranks go through
    ``fleet.distributed_optimizer``."""
    pr.conditional = False
    pr.unskipped_note = "update applied (legacy IR cannot skip it)"
    opt = optimizer
    if world > 1:
        from paddle.distributed import fleet
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


# ----------------------------------------------------------------------------- trainer
class _ProgramModel:
    """Looks like a Layer to ``ClassificationEvaluator``: calling it runs the eval program."""

    training = False

    def __init__(self, trainer):
        self.trainer = trainer
        trainer.bind_eval_scope()

    def eval(self):
        return self

    def train(self):
        return self

    def __call__(self, images):
        t = self.trainer
        logits = t.run(t.pr.eval, {"images": as_feed(images, "float32")}, [t.pr.logits])[0]
        return paddle.to_tensor(logits)


class StaticTrainer:
    """The static-graph counterpart of ``ppdlx.engine.trainer.Trainer`` (same loop, logs,
    checkpoints, hooks: hooks receive this object; ``scope``/``var_names`` reach the weights)."""

    def __init__(self, cfg, pr: _Programs, exe, scope, place, lr_schedule, train_loader, evaluator,
                 amp: AmpPlan, dyn_names: Dict[str, str], hooks=(), rank=0, world_size=1):
        self.cfg, self.pr, self.exe, self.scope, self.place = cfg, pr, exe, scope, place
        self.lr_schedule, self.train_loader, self.evaluator, self.amp = lr_schedule, train_loader, evaluator, amp
        self.output_dir = cfg.global_.output_dir
        self.epochs, self.accumulate = cfg.train.epochs, cfg.train.accumulate
        self.steps_per_epoch, self.log_interval = cfg.train.steps_per_epoch, cfg.global_.log_interval
        self.max_nonfinite_steps, self.eval_interval = cfg.train.max_nonfinite_steps, cfg.eval.interval
        self.save_interval, self.keep_epoch_checkpoints = cfg.train.save_interval, cfg.train.keep_epoch_checkpoints
        self.mixup_alpha, self.seed = cfg.train.mixup_alpha, cfg.global_.seed
        self.hooks, self.rank, self.world_size = list(hooks), rank, world_size
        self.model = pr.model
        self.var_names = {n: v.name for n, v in pr.model.state_dict().items()}  # structured -> scope name
        self.dyn_names = dyn_names  # structured -> the dynamic model's parameter names (for .pdopt keys)
        self.ema_updates = 0
        self.epoch, self.global_step, self.best_metric, self.last_metrics = 0, 0, -math.inf, {}
        self.logger = MetricLogger(self.output_dir, rank)
        self._nonfinite_run = 0
        self._skipped_steps = 0
        self._fetch = [pr.loss, getattr(pr, "finite_global", pr.finite)]
        param_order = [p.name for g in optimizer_groups(cfg, pr.model) for p in g["params"]]
        self.state = ScopeState(scope, place, self.var_names, dyn_names, pr.optimizer, param_order,
                                pr.loss_scaling, pr.ema_shadow)
        self.master_names = self.state.master_names  # param -> float32 master variable (AMP O2)
        # O2: the float32 eval program reads float32 views (masters, or the EMA) from its own scope
        self.eval_scope = paddle.static.Scope() if self.master_names else scope
        self._eval_shadows = None

    # ------------------------------------------------------------------ scope access
    def run(self, program, feed, fetch_list):
        scope = self.eval_scope if program is self.pr.eval else self.scope
        # scope_guard too: Paddle's PIR executor writes the LR variable into global_scope()
        with static_graph(), paddle.static.scope_guard(scope):
            return self.exe.run(program, feed=feed, fetch_list=fetch_list, scope=scope, use_program_cache=True)

    def bind_eval_scope(self) -> None:
        """Point a separate eval scope (AMP O2) at the float32 state to evaluate: the masters, or
        the EMA shadows inside :meth:`ema_swapped_in`."""
        if self.eval_scope is not self.scope:
            share_float32_views(self.scope, self.eval_scope, self.state.float32_sources(self._eval_shadows))

    def get_var(self, name: str) -> np.ndarray:
        return self.state.get(name)

    def set_var(self, name: str, value) -> None:
        self.state.set(name, value)

    def model_state(self) -> Dict[str, np.ndarray]:
        return self.state.model_state()

    def set_model_state(self, state: dict) -> None:
        """Weights into the parameters and, under AMP O2, their float32 masters."""
        self.state.set_model_state(state)

    def optimizer_state(self) -> dict:
        state = self.state.optimizer_state()
        state["LR_Scheduler"] = self.lr_schedule.state_dict()
        return state

    def set_optimizer_state(self, state: dict) -> None:
        self.state.set_optimizer_state(state)

    # ------------------------------------------------------------------ checkpoints
    def ema_state(self) -> Optional[dict]:
        return self.state.ema_state(self.ema_updates)

    def _states(self) -> dict:
        states = {"epoch": self.epoch, "global_step": self.global_step, "best_metric": self.best_metric,
                  "lr_schedule": self.lr_schedule.state_dict(), "rng": ckpt.capture_rng(),
                  "last_metrics": self.last_metrics, "graph": "static"}
        ema = self.ema_state()
        if ema is not None:
            states["ema"] = ema
        scaler = self.state.scaler_state()
        if scaler is not None:
            states["scaler"] = scaler
        for hook in self.hooks:
            if hasattr(hook, "state_dict"):
                states[f"hook:{hook.name}"] = hook.state_dict()
        return states

    def save(self, improved: bool) -> None:
        if self.rank != 0:
            return
        latest = os.path.join(self.output_dir, "latest")
        model_state = {n: paddle.to_tensor(v) for n, v in self.model_state().items()}
        ckpt.save_checkpoint(latest, model_state, self.optimizer_state(), self._states())
        copies = []
        if improved:
            copies.append("best")
        if self.keep_epoch_checkpoints and (self.epoch % self.save_interval == 0 or self.epoch == self.epochs):
            copies.append(f"epoch_{self.epoch}")
        for name in copies:
            target = os.path.join(self.output_dir, name)
            for suffix in ckpt.SUFFIXES:  # .pdstates last: marks the copy complete
                tmp = f"{target}{suffix}.tmp.{os.getpid()}"
                shutil.copyfile(latest + suffix, tmp)
                os.replace(tmp, target + suffix)

    def resume(self, prefix: str) -> None:
        model_state, opt_state, states = ckpt.load_checkpoint(prefix)
        self.set_model_state(model_state)
        if opt_state is not None:
            self.set_optimizer_state(opt_state)
        self.epoch = int(states["epoch"])
        self.global_step = int(states["global_step"])
        self.best_metric = float(states["best_metric"])
        self.last_metrics = states.get("last_metrics", {})
        self.lr_schedule.set_state_dict(states["lr_schedule"])
        if "scaler" in states:
            self.state.set_scaler_state(states["scaler"])
        if self.pr.ema_shadow and "ema" in states:
            self.ema_updates = int(states["ema"]["updates"])
            self.state.set_ema_shadow(states["ema"]["shadow"])
        for hook in self.hooks:
            key = f"hook:{getattr(hook, 'name', '')}"
            if hasattr(hook, "set_state_dict") and key in states:
                hook.set_state_dict(states[key])
        ckpt.restore_rng(states["rng"])
        log.info("resumed from %s at epoch %d (step %d)", prefix, self.epoch, self.global_step)

    # ------------------------------------------------------------------ loop
    def _call_hooks(self, method, *args):
        for hook in self.hooks:
            fn = getattr(hook, method, None)
            if fn is not None:
                fn(self, *args)

    def optimizer_steps_per_epoch(self) -> int:
        steps = len(self.train_loader) // self.accumulate
        if self.steps_per_epoch:
            steps = min(steps, self.steps_per_epoch)
        return max(steps, 1)

    def _ema_decay(self) -> float:
        c = self.cfg.ema
        if c.dynamic_decay:
            return min(c.decay, (1.0 + self.ema_updates) / (10.0 + self.ema_updates))
        return c.decay

    def _feed(self, batch, last_of_window: bool) -> dict:
        images, labels = batch
        feed = {"images": as_feed(images, "float32"), "labels": as_feed(labels, "int64", flat=True)}
        if self.mixup_alpha > 0:
            rng = np.random.default_rng([self.seed, self.epoch, self.global_step, 17])
            lam = float(rng.beta(self.mixup_alpha, self.mixup_alpha))
            feed["mix_perm"] = rng.permutation(feed_rows(feed["images"])).astype(np.int64)
            feed["mix_lam"] = np.asarray([lam], np.float32)
            feed["mix_lam_c"] = np.asarray([1.0 - lam], np.float32)
        if "apply_now" in self.pr.feeds:
            feed["apply_now"] = np.asarray([last_of_window])
        if "ema_decay" in self.pr.feeds:
            d = self._ema_decay() if last_of_window else 1.0
            feed["ema_decay"] = np.asarray([d], np.float32)
            feed["ema_rest"] = np.asarray([1.0 - d], np.float32)
        return feed

    def _check_finite(self, finite: bool) -> bool:
        if finite:
            self._nonfinite_run = 0
            return True
        self._nonfinite_run += 1
        self._skipped_steps += 1
        if self._nonfinite_run >= self.max_nonfinite_steps:
            raise NonFiniteLossError(
                f"loss was NaN/inf for {self._nonfinite_run} consecutive steps (epoch {self.epoch + 1}, "
                f"step {self.global_step}); lower lr.base_lr, enable amp loss scaling, or check the data")
        tlog.warning("non-finite loss at epoch %d step %d: %s", self.epoch + 1, self.global_step,
                     "step skipped" if self.pr.conditional else self.pr.unskipped_note)
        return False

    def train_one_epoch(self) -> None:
        self.train_loader.set_epoch(self.epoch)
        steps = self.optimizer_steps_per_epoch()
        micro_total = steps * self.accumulate
        window_images = 0
        window_start = time.perf_counter()
        epoch_start = window_start
        done_micro = 0
        for micro, batch in enumerate(self.train_loader):
            if micro >= micro_total:
                break
            last_of_window = (micro + 1) % self.accumulate == 0
            feed = self._feed(batch, last_of_window)
            loss, finite = self.run(self.pr.main, feed, self._fetch)
            loss_v = float(np.asarray(loss).reshape(-1)[0])
            # the program skipped the update iff not finite (any rank); legacy IR and static AMP
            # cannot skip it (counted all the same, as the dynamic trainer counts scaler steps)
            finite = self._check_finite(bool(np.asarray(finite).all()))
            applied = finite or not self.pr.conditional
            window_images += feed_rows(feed["images"])
            done_micro += 1
            if not last_of_window:
                continue
            if applied:
                self.lr_schedule.step()
                self.global_step += 1
                if "ema_decay" in self.pr.feeds:
                    self.ema_updates += 1
                self._call_hooks("after_optimizer_step")
            step_in_epoch = done_micro // self.accumulate
            if step_in_epoch % self.log_interval == 0 or step_in_epoch == steps:
                now = time.perf_counter()
                ips_device = window_images / max(now - window_start, 1e-9)
                ips_global = ips_device * self.world_size
                remaining = (steps - step_in_epoch) + (self.epochs - self.epoch - 1) * steps
                eta = remaining * (now - epoch_start) / max(step_in_epoch, 1)
                lr = float(self.lr_schedule())
                self.logger.record(
                    "train",
                    f"epoch {self.epoch + 1}/{self.epochs} step {step_in_epoch}/{steps} loss {loss_v:.4f} "
                    f"lr {lr:.5f} ips {ips_global:.1f} img/s global ({ips_device:.1f}/device x "
                    f"{self.world_size}) eta {format_eta(eta)}",
                    self.global_step, epoch=self.epoch + 1, loss=loss_v, lr=lr, ips_global=ips_global,
                    ips_per_device=ips_device, eta_s=round(eta, 1))
                window_images, window_start = 0, time.perf_counter()

    @contextlib.contextmanager
    def ema_swapped_in(self):
        """Within the block the eval program sees the EMA weights (swapped into the model's variables,
        or, under O2, bound into the eval scope)."""
        if not self.pr.ema_shadow:
            yield
            return
        if self.eval_scope is not self.scope:  # nothing to swap: the eval scope reads the shadows
            self._eval_shadows = self.pr.ema_shadow
            try:
                yield
            finally:
                self._eval_shadows = None
            return
        backup = {n: self.get_var(self.var_names[n]) for n in self.pr.ema_shadow}
        for n, s in self.pr.ema_shadow.items():
            self.set_var(self.var_names[n], self.get_var(s))
        try:
            yield
        finally:
            for n, value in backup.items():
                self.set_var(self.var_names[n], value)

    def evaluate(self) -> dict:
        if self.evaluator is None:
            return {}
        if self.pr.ema_shadow and self.cfg.ema.eval_with_ema:
            with self.ema_swapped_in():
                metrics = self.evaluator(_ProgramModel(self))
            metrics["weights"] = "ema"
            return metrics
        return self.evaluator(_ProgramModel(self))

    def sync_ranks(self) -> None:
        """Average the BatchNorm statistics and other floating buffers (and their EMA shadows) over
        the ranks in place, as the dynamic trainer does before it evaluates and saves (the program
        all-reduces gradients, not statistics)."""
        if self.world_size <= 1:
            return
        names = [n for n in dist.running_statistics(self.model) if n in self.var_names]
        variables = [self.var_names[n] for n in names] + [self.pr.ema_shadow[n] for n in names
                                                           if n in self.pr.ema_shadow]
        dist.average_over_ranks(scope_tensor(self.scope, name) for name in variables)  # in place in the scope

    def fit(self) -> dict:
        self._call_hooks("before_train")
        while self.epoch < self.epochs:
            self.train_one_epoch()
            self.epoch += 1
            self.sync_ranks()
            metrics = {}
            if self.evaluator is not None and (self.epoch % self.eval_interval == 0 or self.epoch == self.epochs):
                metrics = self.evaluate()
                self.last_metrics = metrics
                shown = " ".join(f"{k} {v:.4f}" for k, v in metrics.items()
                                 if isinstance(v, float) and k not in ("seconds", "loss"))
                self.logger.record("eval", f"eval epoch {self.epoch}: {shown} ({metrics.get('images', 0)} images, "
                                   f"{metrics.get('seconds', 0.0):.1f} s)", self.global_step, epoch=self.epoch,
                                   **{k: v for k, v in metrics.items() if isinstance(v, (int, float))})
            primary = metrics.get(getattr(self.evaluator, "primary", ""), None)
            improved = primary is not None and primary > self.best_metric
            if improved:
                self.best_metric = primary
            self._call_hooks("after_epoch", metrics)
            self.save(improved)
        self.logger.close()
        return self.last_metrics


# ----------------------------------------------------------------------------- entry points
def _setup(cfg):
    if dist.world_size() > 1:
        from paddle.distributed import fleet
        fleet.init(is_collective=True)  # collective context for the all_reduce ops in the program
    rank, world, device = run_setup(cfg)
    plan_fast_cpu_kernels(cfg, device)  # never applies to static graph: records false (and says why if true)
    return rank, world, device


def onednn_flag() -> Optional[str]:
    """The oneDNN flag that is switched on (``FLAGS_use_onednn`` / ``FLAGS_use_mkldnn``), if any."""
    for name in ("FLAGS_use_onednn", "FLAGS_use_mkldnn"):
        try:
            if paddle.get_flags(name)[name]:
                return name
        except Exception:  # noqa: BLE001 - flag unknown to this build
            continue
    return None


def check_graph_flags(graph: str) -> None:
    """``to_static`` and ``static`` training crash with oneDNN switched on (dygraph ignores it)."""
    flag = onednn_flag()
    if flag:
        raise UnsupportedError(
            f"train.graph={graph} with {flag}=1: Paddle {paddle.__version__}'s oneDNN kernels fail in static "
            f"training programs (to_static: 'dst_tensor shall be defined' or a segfault; static: dnnl::error in "
            f"pool2d_grad); unset {flag} (dynamic training ignores it) or use train.graph=dynamic")


def check_supported(cfg) -> None:
    """One line for what the static trainer does not do."""
    check_graph_flags("static")
    if cfg.distill.enabled:
        raise UnsupportedError("train.graph=static does not support distill.enabled (the teacher runs in the "
                               "dynamic objective); use train.graph=dynamic")
    if cfg.train.graph != "static":
        raise ConfigError(f"ppdlx.engine.static_trainer needs train.graph=static, got {cfg.train.graph}")


def _mirror_dynamic_build(cfg, rank, world, device, amp: Optional[AmpPlan]):
    amp = amp or plan_static_amp(cfg, device)
    if amp.note:
        log.info(amp.note)
    seed_everything(cfg.global_.seed)
    train_loader = build_classification_loader(cfg, "train", rank, world)
    classes = _classes_of(train_loader)
    num_classes = cfg.model.num_classes
    if classes is not None and len(classes) != num_classes:
        raise ConfigError(f"model.num_classes={num_classes} but {cfg.data.root}/{cfg.data.train_split} has "
                          f"{len(classes)} class folders; set model.num_classes={len(classes)}")
    val_loader = build_classification_loader(cfg, "val", rank, world, batch_size=cfg.eval.batch_size,
                                             classes=classes)
    dyn_model = build_model(cfg)
    if cfg.model.weights and not cfg.train.resume:
        missing = ckpt.load_weights(dyn_model, cfg.model.weights)
        log.info("loaded weights %s (%d parameters not in the file)", cfg.model.weights, len(missing))
    init_state = {n: v.numpy() for n, v in dyn_model.state_dict().items()}
    dyn_names = {n: v.name for n, v in dyn_model.state_dict().items()}
    n_params = count_params(dyn_model)
    del dyn_model
    return amp, init_state, dyn_names, n_params, train_loader, val_loader, num_classes


def build_static_training(cfg, hooks=(), amp: Optional[AmpPlan] = None) -> StaticTrainer:
    """Everything the static loop needs, built from the config (mirrors ``run.build_training``).
    ``amp``: a plan to use instead of :func:`plan_static_amp`'s (which probes this machine)."""
    check_supported(cfg)
    rank, world, device = _setup(cfg)
    # A fresh unique-name scope and the dynamic trainer's order (AMP probe, seed, loaders, model):
    # the same initial weights and the same parameter names, hence the same .pdopt keys, as a
    # dynamic run of this config in a fresh process (tools/train.py).
    with paddle.utils.unique_name.guard():
        amp, init_state, dyn_names, n_params, train_loader, val_loader, num_classes = _mirror_dynamic_build(
            cfg, rank, world, device, amp)
    seed_everything(cfg.global_.seed + rank)
    global_batch = cfg.data.batch_size * world * cfg.train.accumulate
    steps = len(train_loader) // cfg.train.accumulate
    if cfg.train.steps_per_epoch:
        steps = min(steps, cfg.train.steps_per_epoch)
    steps = max(steps, 1)
    lr_schedule = build_lr_schedule(cfg, global_batch, steps)
    with static_graph():
        pr = build_programs(cfg, num_classes, lr_schedule, amp, world)
        place = paddle.CUDAPlace(int(device.split(":")[1])) if device.startswith("gpu") else paddle.CPUPlace()
        exe = paddle.static.Executor(place)
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope):
            exe.run(pr.startup, scope=scope)
    trainer = StaticTrainer(cfg, pr, exe, scope, place, lr_schedule, train_loader,
                            ClassificationEvaluator(val_loader, cfg.eval.topk), amp, dyn_names, hooks, rank, world)
    trainer.set_model_state(init_state)
    for n, s in pr.ema_shadow.items():  # EMA starts from the initial weights, as ModelEMA does
        trainer.set_var(s, init_state[n].astype(np.float32))
    if cfg.train.resume:
        prefix = ckpt.resolve_resume(cfg.train.resume, cfg.global_.output_dir)
        if prefix:
            trainer.resume(prefix)
        else:
            log.info("train.resume=auto: no checkpoint in %s, starting fresh", cfg.global_.output_dir)
    if rank == 0:
        save_config(cfg, os.path.join(cfg.global_.output_dir, "config.yaml"))
        log.info("model %s: %d parameters; %d train images, %d val images; global batch %d (%d x %d ranks x %d "
                 "accumulate), peak lr %.4f, %d steps/epoch; device %s (%d CPU threads); amp %s; graph static (%s)",
                 cfg.model.name, n_params, train_loader.num_images, val_loader.num_images,
                 global_batch, cfg.data.batch_size, world, cfg.train.accumulate, scaled_lr(cfg, global_batch),
                 steps, device, cfg.global_.cpu_threads, amp.dtype if amp.enabled else "off (float32)", ir_name())
    return trainer


def train(cfg, hooks=()) -> dict:
    trainer = build_static_training(cfg, hooks)
    metrics = trainer.fit()
    report = {k: v for k, v in metrics.items() if k in ("top1", "top5", "images", "seconds", "loss")}
    report.update(epochs=trainer.epoch, output_dir=cfg.global_.output_dir, best_top1=trainer.best_metric)
    return report
