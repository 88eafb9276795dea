"""Static-graph training (``train.graph=static``) from the same model, loss, optimizer and data.

The programs are traced from the ``paddle.nn.Layer`` that ``build_model(cfg)`` returns (no
separate static model code), with the loss from ``ppdlx.losses``, the optimizer and LR schedule
from ``ppdlx.optim`` (same weight-decay exclusions) and the loaders from ``ppdlx.data``.
Only program building and ``Executor.run`` run in static mode; the loop around them (loaders,
logging, checkpoints, evaluation metrics, collectives for metrics) stays in dygraph mode, so
every data backend feeds the executor unchanged (batches are passed as numpy arrays).

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
``LR_Scheduler``, ``.pdstates`` with the same keys; all written atomically.

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
import re
import shutil
import time
from typing import Any, Dict, List, Optional

import numpy as np
import paddle
from paddle.base.framework import _dygraph_guard

from ppdlx.config import save_config
from ppdlx.data.loader import build_classification_loader
from ppdlx.engine import checkpoint as ckpt
from ppdlx.engine import dist
from ppdlx.engine.run import _classes_of
from ppdlx.engine.cpu_kernels import plan_fast_cpu_kernels
from ppdlx.engine.run import _setup as run_setup
from ppdlx.engine.amp import AmpPlan, plan_amp
from ppdlx.engine.builders import build_model, count_params, seed_everything
from ppdlx.engine.evaluator import ClassificationEvaluator
from ppdlx.engine.logger import MetricLogger, format_eta
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


def as_numpy(x, dtype=None) -> np.ndarray:
    """A loader output (paddle Tensor, DenseTensor or ndarray) as a numpy array for the feed."""
    if isinstance(x, paddle.Tensor):
        x = x.numpy()
    else:
        x = np.asarray(x)
    if dtype is not None and x.dtype != dtype:
        x = x.astype(dtype)
    return x


# ----------------------------------------------------------------------------- static AMP
def _first_line(err: BaseException) -> str:
    lines = [l.strip() for l in str(err).splitlines() if l.strip() and not l.strip().startswith("[")]
    line = (lines[-1] if lines else type(err).__name__).split(" (at /paddle")[0]
    if line == "std::exception":
        line = "a oneDNN kernel raised dnnl::error"
    return line.replace("(InvalidType) ", "").rstrip(", ")[:200]


def static_amp_trains_on_cpu(dtype: str, level: str):
    """One AMP train step of a conv+BN+linear net through the same recipe as :func:`build_programs`
    (``paddle.amp.decorate`` + ``auto_cast`` + ``GradScaler.minimize``) in a throwaway PIR program.

    Returns ``(True, "")`` or ``(False, why)``. Paddle 3.3.1's CPU build here: fp16 has no CPU
    conv2d kernel; bf16 O1/O2 cast batch_norm's input to bf16, which has no CPU kernel (and where
    bf16 conv2d does build, oneDNN raises ``dnnl::error`` in conv2d_grad without AVX512-BF16).
    """
    import warnings
    main, startup = paddle.static.Program(), paddle.static.Program()
    scope = paddle.static.Scope()
    try:
        with warnings.catch_warnings(), static_graph(), paddle.utils.unique_name.guard(), \
                paddle.static.program_guard(main, startup), paddle.static.scope_guard(scope):
            warnings.simplefilter("ignore")
            net = paddle.nn.Sequential(paddle.nn.Conv2D(3, 4, 3, bias_attr=False), paddle.nn.BatchNorm2D(4),
                                       paddle.nn.ReLU(), paddle.nn.Flatten(), paddle.nn.Linear(144, 2))
            opt = paddle.optimizer.Momentum(0.1, parameters=net.parameters(), multi_precision=True)
            net, opt = paddle.amp.decorate(models=net, optimizers=opt, level=level, dtype=dtype, master_weight=True)
            x = paddle.static.data("x", [2, 3, 8, 8], "float32")
            with paddle.amp.auto_cast(True, level=level, dtype=dtype):
                y = net(x)
            loss = paddle.mean(paddle.cast(y, "float32"))
            scaler = paddle.amp.GradScaler(init_loss_scaling=1.0, use_dynamic_loss_scaling=False)
            scaler.minimize(opt, scaler.scale(loss))
            exe = paddle.static.Executor(paddle.CPUPlace())
            exe.run(startup, scope=scope)
            out = exe.run(main, feed={"x": np.ones((2, 3, 8, 8), np.float32)}, fetch_list=[loss], scope=scope)
        if not np.isfinite(out[0]).all():
            return False, "the probe step's loss is not finite"
        return True, ""
    except Exception as err:  # noqa: BLE001 - any failure means "not usable"
        return False, _first_line(err)


def plan_static_amp(amp_cfg, device: str) -> AmpPlan:
    """``plan_amp`` (same one-line errors: fp16 needs a GPU) plus what static AMP can do here."""
    plan = plan_amp(amp_cfg, device)  # raises for fp16 on CPU; probes dygraph bf16 on CPU
    if not amp_cfg.enabled:
        return plan
    if not use_pir():
        return AmpPlan(False, "float32", "O0", False,
                       f"amp: static AMP under legacy IR inserts no casts in Paddle {paddle.__version__} "
                       f"(paddle.static.amp.decorate leaves the program float32): training runs in float32")
    if plan.enabled:
        return plan  # GPU: fp16/bf16 O1/O2 through Paddle's PIR static AMP
    ok, why = static_amp_trains_on_cpu("bfloat16", amp_cfg.level)
    if ok:
        return AmpPlan(True, "bfloat16", amp_cfg.level, False)
    return AmpPlan(False, "float32", "O0", False,
                   f"amp: bfloat16 {amp_cfg.level} requested, but a static bf16 train step fails on this CPU in "
                   f"Paddle {paddle.__version__} ({why}): training runs in float32")


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
        self.scaler = None
        self.ema_shadow: Dict[str, str] = {}  # structured name -> shadow variable name
        self.conditional = True      # the update is skipped in-graph when the loss is not finite


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
    if amp.enabled and (k > 1 or world > 1):
        what = f"train.accumulate={k}" if k > 1 else f"{world} ranks"
        raise UnsupportedError(f"train.graph=static with amp.enabled and {what}: paddle.static.amp owns the backward "
                               f"and the update (loss scaling); use train.graph=dynamic for this combination")
    amp_ctx = (lambda: paddle.amp.auto_cast(True, level=amp.level, dtype=amp.dtype)) if amp.enabled \
        else contextlib.nullcontext
    with legacy_ir_ops(), paddle.static.program_guard(pr.main, pr.startup), paddle.utils.unique_name.guard():
        model = build_model(cfg)
        model.train()
        optimizer = _static_optimizer(cfg, model, lr_schedule, multi_precision=amp.enabled)
        amp_optimizer = None
        if amp.enabled:
            # Paddle's PIR static AMP recipe (decorate, auto_cast, GradScaler): the GPU path; on this
            # CPU-only machine only its bf16 O1 build is exercised (its backward fails in oneDNN).
            model, amp_optimizer = paddle.amp.decorate(models=model, optimizers=optimizer, level=amp.level,
                                                       dtype=amp.dtype, master_weight=True)
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
        if amp.enabled:
            scaler = paddle.amp.GradScaler(init_loss_scaling=cfg.amp.init_loss_scaling,
                                           incr_every_n_steps=cfg.amp.incr_every_n_steps,
                                           decr_every_n_nan_or_inf=cfg.amp.decr_every_n_nan_or_inf,
                                           use_dynamic_loss_scaling=amp.use_scaler)
            scaler.minimize(amp_optimizer, scaler.scale(loss))
            pr.scaler = scaler
        else:
            _append_update(pr, cfg, model, optimizer, loss, finite, k, world)
        pr.loss, pr.finite, pr.model, pr.optimizer = loss, finite, model, optimizer
    with legacy_ir_ops(), paddle.static.program_guard(pr.eval, paddle.static.Program()), \
            paddle.utils.unique_name.guard():
        eval_model = build_model(cfg)
        eval_model.eval()
        if amp.enabled and amp.level == "O2":  # the scope holds low-precision weights
            eval_model = paddle.amp.decorate(models=eval_model, level="O2", dtype=amp.dtype)
        eval_images = paddle.static.data("images", shape, "float32")
        with amp_ctx():
            pr.logits = paddle.cast(eval_model(eval_images), "float32")
        pr.eval_model = eval_model
    train_names = {n: v.name for n, v in model.state_dict().items()}
    eval_names = {n: v.name for n, v in eval_model.state_dict().items()}
    if train_names != eval_names:  # would silently evaluate other weights
        raise RuntimeError("static eval program does not share the train program's variable names")
    return pr


def _ema_ops(pr, model):
    """Persistable EMA shadows of every floating state entry; returns ``update()`` that appends
    ``shadow = shadow * d + w * (1 - d)`` with ``d`` / ``1 - d`` fed per step (as ``ModelEMA``)."""
    ema_decay = paddle.static.data("ema_decay", [1], "float32")
    ema_rest = paddle.static.data("ema_rest", [1], "float32")
    pr.feeds.update(ema_decay=ema_decay, ema_rest=ema_rest)
    shadows = {}
    for name, var in model.state_dict().items():
        if var.dtype in (paddle.float32, paddle.float16, paddle.bfloat16):
            shadows[name] = (var, _global_var(f"{var.name}@EMA", var.shape))
    pr.ema_shadow = {n: s.name for n, (_, s) in shadows.items()}

    def update():
        for var, shadow in shadows.values():
            paddle.assign(paddle.scale(shadow, scale=ema_decay)
                          + paddle.scale(paddle.cast(var, "float32"), scale=ema_rest), output=shadow)
    return update


def _value(out, fallback):
    """``paddle.distributed.all_reduce`` returns the reduced value in PIR, None/task in legacy."""
    return out if isinstance(out, (paddle.pir.Value, paddle.base.framework.Variable)) else fallback


def _append_update(pr, cfg, model, optimizer, loss, finite, k: int, world: int) -> None:
    """PIR: backward; [all-reduce]; cond(finite [and k-th micro-batch]) -> update [+ EMA]."""
    ema_update = _ema_ops(pr, model) if cfg.ema.enabled else None
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

    def eval(self):
        return self

    def train(self):
        return self

    def __call__(self, images):
        t = self.trainer
        logits = t.run(t.pr.eval, {"images": as_numpy(images, np.float32)}, [t.pr.logits])[0]
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
        fetch = [pr.loss, getattr(pr, "finite_global", pr.finite)]
        self._fetch = fetch

    # ------------------------------------------------------------------ scope access
    def run(self, program, feed, fetch_list):
        # scope_guard too: Paddle's PIR executor writes the LR variable into global_scope()
        with static_graph(), paddle.static.scope_guard(self.scope):
            return self.exe.run(program, feed=feed, fetch_list=fetch_list, scope=self.scope,
                                use_program_cache=True)

    def get_var(self, name: str) -> np.ndarray:
        tensor = self.scope.find_var(name).get_tensor()
        value = np.array(tensor)
        if value.dtype == np.uint16 and "bfloat16" in str(tensor._dtype()):  # bf16 bits (AMP O2)
            value = (value.astype(np.uint32) << 16).view(np.float32)
        return value

    def set_var(self, name: str, value) -> None:
        var = self.scope.find_var(name)
        if var is None:
            raise KeyError(name)
        tensor = var.get_tensor()
        current = np.array(tensor)
        value = np.asarray(value.numpy() if isinstance(value, paddle.Tensor) else value)
        if list(current.shape) != list(value.shape):
            raise ConfigError(f"checkpoint value for '{name}' has shape {list(value.shape)}, "
                              f"the program expects {list(current.shape)}")
        if current.dtype == np.uint16 and value.dtype != np.uint16:  # float -> bf16 bits, round to nearest even
            bits = value.astype(np.float32).view(np.uint32)
            value = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        tensor.set(value.astype(current.dtype, copy=False), self.place)

    def model_state(self) -> Dict[str, np.ndarray]:
        return {n: self.get_var(v) for n, v in self.var_names.items()}

    def set_model_state(self, state: dict) -> None:
        for name, value in state.items():
            if name in self.var_names:
                self.set_var(self.var_names[name], value)

    # ------------------------------------------------------------------ optimizer state
    def _optimizer(self):
        opt = self.pr.optimizer
        return getattr(opt, "_optimizer", opt)  # unwrap paddle.static.amp's decorator

    def _accumulators(self) -> List[tuple]:
        """``(key in .pdopt, scope variable, structured param name, accumulator kind)`` in the dynamic
        optimizer's order (parameter-group order; the names the dynamic model gives its accumulators)."""
        opt = self._optimizer()
        static_to_struct = {v: n for n, v in self.var_names.items()}
        groups = optimizer_groups(self.cfg, self.pr.model)
        order = {p.name: i for i, p in enumerate(p for g in groups for p in g["params"])}
        out = []
        for acc_name, per_param in opt._accumulators.items():
            rows = []
            for pname, var in per_param.items():
                struct = static_to_struct.get(pname)
                key = var.name
                if struct is not None and key.startswith(pname):
                    key = self.dyn_names.get(struct, pname) + key[len(pname):]
                rows.append((order.get(pname, len(order)), key, var.name, struct, acc_name))
            out += [r[1:] for r in sorted(rows)]
        return out

    def optimizer_state(self) -> dict:
        state = {key: paddle.to_tensor(self.get_var(vname)) for key, vname, _, _ in self._accumulators()}
        state["LR_Scheduler"] = self.lr_schedule.state_dict()
        return state

    def set_optimizer_state(self, state: dict) -> None:
        rows = self._accumulators()
        values = {k: v for k, v in state.items() if k not in ("LR_Scheduler", "master_weights")}
        if all(key in values for key, _, _, _ in rows):
            for key, vname, _, _ in rows:
                self.set_var(vname, values[key])
            return
        # The file's parameter names come from another process (another build history): match
        # per accumulator kind in the dynamic optimizer's parameter order, checking shapes.
        for acc_name in {r[3] for r in rows}:
            mine = [r for r in rows if r[3] == acc_name]
            pattern = re.compile(rf"_{re.escape(acc_name)}_\d+$")
            theirs = [k for k in values if pattern.search(k)]
            shapes_ok = len(theirs) == len(mine) and all(
                list(np.shape(values[k])) == list(self.get_var(r[1]).shape) for k, r in zip(theirs, mine))
            if not shapes_ok:
                raise ConfigError(f"optimizer state: the checkpoint's '{acc_name}' entries do not match this "
                                  f"model's parameters ({len(theirs)} vs {len(mine)}); resume with "
                                  f"model.weights=<prefix> instead to start the optimizer fresh")
            for k, r in zip(theirs, mine):
                self.set_var(r[1], values[k])
        log.info("optimizer state matched by parameter order (names came from another process)")

    # ------------------------------------------------------------------ checkpoints
    def ema_state(self) -> Optional[dict]:
        if not self.pr.ema_shadow:
            return None
        return {"updates": self.ema_updates,
                "shadow": {n: self.get_var(s) for n, s in self.pr.ema_shadow.items()}}

    def _states(self) -> dict:
        states = {"epoch": self.epoch, "global_step": self.global_step, "best_metric": self.best_metric,
                  "lr_schedule": self.lr_schedule.state_dict(), "rng": ckpt.capture_rng(),
                  "last_metrics": self.last_metrics, "graph": "static"}
        ema = self.ema_state()
        if ema is not None:
            states["ema"] = ema
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
        if self.pr.ema_shadow and "ema" in states:
            self.ema_updates = int(states["ema"]["updates"])
            for n, value in states["ema"]["shadow"].items():
                if n in self.pr.ema_shadow:
                    self.set_var(self.pr.ema_shadow[n], value)
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
        feed = {"images": as_numpy(images, np.float32), "labels": as_numpy(labels, np.int64).reshape(-1)}
        if self.mixup_alpha > 0:
            rng = np.random.default_rng([self.seed, self.epoch, self.global_step, 17])
            lam = float(rng.beta(self.mixup_alpha, self.mixup_alpha))
            feed["mix_perm"] = rng.permutation(feed["images"].shape[0]).astype(np.int64)
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
                     "step skipped" if self.pr.conditional else "update applied (legacy IR cannot skip it)")
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
            # the program skipped the update iff not finite (any rank); paddle.static.amp's loss
            # scaling decides its own skips
            finite = self._check_finite(bool(np.asarray(finite).all())) if self.pr.scaler is None else True
            applied = finite or not self.pr.conditional  # legacy IR applies non-finite updates too
            window_images += int(feed["images"].shape[0])
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
        """Temporarily put the EMA weights into the model's variables (e.g. for evaluation)."""
        if not self.pr.ema_shadow:
            yield
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

    def fit(self) -> dict:
        self._call_hooks("before_train")
        while self.epoch < self.epochs:
            self.train_one_epoch()
            self.epoch += 1
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


def _mirror_dynamic_build(cfg, rank, world, device):
    amp = plan_static_amp(cfg.amp, device)
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


def build_static_training(cfg, hooks=()) -> StaticTrainer:
    """Everything the static loop needs, built from the config (mirrors ``run.build_training``)."""
    check_supported(cfg)
    rank, world, device = _setup(cfg)
    # A fresh unique-name scope and the dynamic trainer's order (AMP probe, seed, loaders, model):
    # the same initial weights and the same parameter names, hence the same .pdopt keys, as a
    # dynamic run of this config in a fresh process (tools/train.py).
    with paddle.utils.unique_name.guard():
        amp, init_state, dyn_names, n_params, train_loader, val_loader, num_classes = _mirror_dynamic_build(
            cfg, rank, world, device)
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
