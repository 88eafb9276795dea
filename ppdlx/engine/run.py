"""Entry points for every task and graph mode: ``build_training(cfg, hooks)``, ``train(cfg, hooks)``,
``evaluate(cfg)``.

One assembly path: plan the run (``ppdlx.engine.plan``), let the task plug-in
(``ppdlx.engine.tasks``) build data, model, objective and evaluator, build the step strategy for
``train.graph``, register the standard hooks around the caller's, resume. The order of what is
built, and of the RNG seeding between, is what makes runs reproducible and graph modes
bit-identical: a static run builds the same dynamic model first (same initial weights, same
parameter names, hence the same ``.pdopt`` keys) and traces its programs from it.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import time

import paddle

from ppdlx.analysis.data_report import check_before_training
from ppdlx.config import save_config
from ppdlx.data.coco_index import sharing_indexes
from ppdlx.data.mixing import MixSpec
from ppdlx.engine import checkpoint as ckpt
from ppdlx.engine import hooks as std
from ppdlx.engine.amp import build_scaler, check_image_dtype, check_o2_weight_decay, decorate_o2, plan_amp
from ppdlx.engine.analysis import write_analysis
from ppdlx.engine.builders import count_trainable_params, seed_everything
from ppdlx.engine.cpu_kernels import use_fast_cpu_kernels
from ppdlx.engine.dynamic_step import DynamicStep, compile_forward
from ppdlx.engine.ema import ModelEMA
from ppdlx.engine.plan import RunPlan, plan_cpu_kernels, start_run
from ppdlx.engine.preprocess_cfg import resolve_preprocessing, resolve_with_record
from ppdlx.engine.run_dir import check_ranks_resume_alike, prepare_output_dir, release_output_dir
from ppdlx.engine.tasks import task_of
from ppdlx.engine.trainer import Trainer, optimizer_steps_per_epoch
from ppdlx.errors import ConfigError
from ppdlx.optim import batch_change_line, build_lr_schedule, build_optimizer, global_batch_record, scaled_lr
from ppdlx.quantization import qat

log = logging.getLogger("ppdlx")
ANALYSIS_MAX_SCORES = 1 << 22  # val images x classes of logits kept for the end-of-training analysis


def plan_training_amp(cfg, device: str, fast_cpu_kernels: bool = False, cpu_threads: int = 1):
    """What AMP does for this training config on ``device`` (static graph: a probe step on CPU)."""
    task = task_of(cfg)
    if cfg.train.graph != "static":
        return plan_amp(cfg.amp, device, fast_cpu_kernels, cpu_threads)
    from ppdlx.engine.static.probe import plan_static_amp
    return plan_static_amp(cfg.amp, device, task.program_spec(cfg, cfg.model.num_classes),
                           cfg.data.transforms.crop_size, cfg.model.num_classes, cfg.optimizer.name)


def _static_ir() -> str:
    from ppdlx.engine.static.ir_compat import ir_name
    return ir_name()


def build_training(cfg, hooks=(), amp=None) -> Trainer:
    """The trainer for ``cfg``, with the standard hooks around ``hooks`` (order: ``ppdlx.engine.hooks``).
    ``amp``: an AMP plan to use instead of the one planned for this machine (tests force O2)."""
    task = task_of(cfg)
    graph = cfg.train.graph
    if graph == "static":
        from ppdlx.engine.static.ir_compat import check_graph_flags
        check_graph_flags("static")
    task.validate(cfg)
    env = start_run(cfg, collective_programs=graph == "static")
    resume_path = prepare_output_dir(cfg, env.rank)  # writable, locked, and resumed or explicitly started over
    try:
        check_ranks_resume_alike(cfg.global_.output_dir, resume_path)
        with sharing_indexes():  # the data check, loaders and evaluator read each COCO json once
            return _assemble_training(cfg, hooks, amp, task, env, resume_path)
    except BaseException:
        release_output_dir(cfg.global_.output_dir)  # a training that never started holds the directory no longer
        raise


def _assemble_training(cfg, hooks, amp, task, env, resume_path) -> Trainer:
    graph = cfg.train.graph
    check_before_training(cfg)  # every rank: one that stopped alone would leave the others waiting
    fast_kernels, data_format = plan_cpu_kernels(cfg, env.device)
    # what builders read from here on: null pre-processing keys filled from the model's default_cfg
    resolved, preprocess = resolve_with_record(cfg)
    # A static run builds the dynamic model in a fresh unique-name scope, in the dynamic order (AMP
    # probe, seed, loaders, model): the names and initial weights of a dynamic run in a fresh process.
    names = paddle.utils.unique_name.guard() if graph == "static" else contextlib.nullcontext()
    with names:
        amp = amp or plan_training_amp(resolved, env.device, fast_kernels, env.cpu_threads)
        check_o2_weight_decay(amp, cfg.optimizer)
        qat.check_training(cfg.qat.enabled, amp.enabled, amp.level)
        plan = RunPlan(env.rank, env.world_size, env.device, env.cpu_threads, graph,
                       "dygraph" if graph == "dynamic" else _static_ir(), data_format, fast_kernels, amp, preprocess)
        run_cfg = plan.configure(resolved)
        check_image_dtype(cfg.data, amp, graph)
        if amp.note:
            log.info(amp.note)
        # Same initial weights on every rank; per-rank streams for dropout/drop-path afterwards.
        seed_everything(cfg.global_.seed)
        data = task.build_data(run_cfg, env.rank, env.world_size)
        model = task.build_model(run_cfg, data.num_classes)
        if cfg.qat.enabled:
            log.info(qat.describe(model, cfg.qat.moving_rate))
        if fast_kernels:
            use_fast_cpu_kernels(model, bf16=amp.cpu_bf16_convs)
        task.prepare_model(run_cfg, model)
        # A checkpoint found by train.resume wins; without one (resume=auto in a fresh directory) the run starts
        # from model.weights rather than from random weights.
        if resume_path:
            ckpt.check_resumable(resume_path, model, cfg.model.name)
        elif cfg.model.weights:
            missing = ckpt.load_weights(model, cfg.model.weights, cfg.model.reset_head, cfg.model.weights_copy)
            log.info("loaded weights %s (%d parameters not in the file)", cfg.model.weights, len(missing))
    seed_everything(cfg.global_.seed + env.rank)
    steps = optimizer_steps_per_epoch(len(data.train_loader), cfg.train.accumulate, cfg.train.steps_per_epoch)
    global_batch = cfg.data.batch_size * env.world_size * cfg.train.accumulate
    n_params = count_trainable_params(model)
    if graph == "static":
        lr_schedule = build_lr_schedule(cfg, global_batch, steps)
        step = _static_step(run_cfg, task, plan, model, data, lr_schedule)
        raw_model = None
    else:
        objective = task.build_objective(run_cfg, model, data, env.world_size)
        lr_schedule = build_lr_schedule(cfg, global_batch, steps)
        step, raw_model = _dynamic_step(run_cfg, plan, model, objective, lr_schedule)
    evaluator = task.build_evaluator(run_cfg, raw_model, data.val_loader, env.rank, env.world_size)
    hooks = [*hooks, *task.hooks(run_cfg, data), final_analysis_hook(run_cfg, task, evaluator, data, env.rank)]
    batch_record = global_batch_record(cfg, env.world_size)
    identity = {"name": cfg.model.name, "num_classes": data.num_classes, "global_batch": batch_record}
    trainer = Trainer(step, standard_hooks(cfg, env.rank, lr_schedule, evaluator, step, hooks, identity),
                      train_loader=data.train_loader, epochs=cfg.train.epochs, accumulate=cfg.train.accumulate,
                      steps_per_epoch=cfg.train.steps_per_epoch, log_interval=cfg.global_.log_interval,
                      max_nonfinite_steps=cfg.train.max_nonfinite_steps, rank=env.rank, world_size=env.world_size)
    trainer.plan = plan  # for reports; the loop does not read it
    if resume_path:
        trainer.resume(resume_path)
        changed = batch_change_line(ckpt.recorded_global_batch(resume_path), batch_record, resume_path)
        if changed and env.rank == 0:
            log.warning(changed)
    elif cfg.train.resume == "auto":
        log.info("train.resume=auto: no checkpoint in %s, starting fresh", cfg.global_.output_dir)
    if env.rank == 0:
        out = cfg.global_.output_dir
        save_config(cfg, os.path.join(out, "config.yaml"))
        plan.save(os.path.join(out, "plan.yaml"))
        task.start(run_cfg, data)
        log.info("model %s: %d parameters%s; %d train images, %d val images; global batch %d (%d x %d ranks x %d "
                 "accumulate), peak lr %.4f, %d steps/epoch", cfg.model.name, n_params, task.describe(run_cfg, data),
                 data.train_loader.num_images, data.val_loader.num_images, global_batch, cfg.data.batch_size,
                 env.world_size, cfg.train.accumulate, scaled_lr(cfg, global_batch), steps)
        log.info(plan.line())
    return trainer


def _dynamic_step(cfg, plan: RunPlan, model, objective, lr_schedule):
    optimizer = build_optimizer(cfg, model, lr_schedule, multi_precision=plan.amp.enabled)
    # EMA shadows start from the float32 weights, before O2 rounds the parameters to fp16
    ema = ModelEMA(model, cfg.ema.decay, cfg.ema.dynamic_decay) if cfg.ema.enabled else None
    model, optimizer = decorate_o2(plan.amp, model, optimizer)
    raw_model = model
    if plan.graph == "to_static":
        model = compile_forward(model)
    if plan.world_size > 1:
        model = paddle.DataParallel(model)
    step = DynamicStep(model, raw_model, optimizer, objective, plan.amp, build_scaler(plan.amp, cfg.amp), ema,
                       cfg.train.accumulate, plan.world_size)
    return step, raw_model


def _static_step(cfg, task, plan: RunPlan, model, data, lr_schedule):
    from ppdlx.engine.static.step import build_static_step
    init_state = {n: v.numpy() for n, v in model.state_dict().items()}
    dyn_names = {n: v.name for n, v in model.state_dict().items()}
    return build_static_step(task.program_spec(cfg, data.num_classes), lr_schedule, plan.amp, plan.world_size,
                             plan.device, init_state, dyn_names, MixSpec.of(cfg.train), cfg.global_.seed,
                             cfg.ema.decay, cfg.ema.dynamic_decay)


def final_analysis_hook(cfg, task, evaluator, data, rank: int):
    """``RunAnalysis`` with the final evaluation's per-class analysis when keeping it is cheap (at most
    ``ANALYSIS_MAX_SCORES`` val images x classes of logits); otherwise curves only, and the report says why."""
    scores = data.val_loader.num_images * data.num_classes
    if scores > ANALYSIS_MAX_SCORES:
        return std.RunAnalysis(cfg.global_.output_dir, rank, skipped=(
            f"skipped: {data.val_loader.num_images} val images x {data.num_classes} classes is more than "
            f"{ANALYSIS_MAX_SCORES} scores to keep; run tools/eval.py --analysis"))
    task.keep_for_analysis(evaluator)
    return std.RunAnalysis(cfg.global_.output_dir, rank, functools.partial(write_analysis, task, cfg, evaluator))


def standard_hooks(cfg, rank: int, lr_schedule, evaluator, step, hooks=(), identity=None) -> list:
    """The standard hooks around the caller's, in their documented order (``ppdlx.engine.hooks``);
    ``identity``: the model's ``name`` and ``num_classes`` for the checkpoints' manifests."""
    out = cfg.global_.output_dir
    ema = [std.EMA()] if step.ema is not None else []
    # the run's analysis reads metrics.jsonl, which MetricWriter closes in after_train: it goes last
    analysis = [h for h in hooks if isinstance(h, std.RunAnalysis)]
    hooks = [h for h in hooks if not isinstance(h, std.RunAnalysis)]
    return [std.RankSync(), std.LRScheduler(lr_schedule),
            std.Evaluation(evaluator, cfg.eval.interval, cfg.ema.eval_with_ema), *hooks, *ema,
            std.MetricWriter(out, rank, lr_schedule),
            std.Checkpoint(out, rank, cfg.train.save_interval, cfg.train.keep_epoch_checkpoints, identity), *analysis]


def train(cfg, hooks=()) -> dict:
    """Train ``cfg`` (``asp.enabled`` adds an ``ASPHook``); returns the report of the last evaluation."""
    if cfg.asp.enabled:
        from ppdlx.sparsity import ensure_asp_hook
        hooks = ensure_asp_hook(cfg, list(hooks))
    task = task_of(cfg)
    trainer = build_training(cfg, hooks)
    try:
        report = task.train_report(trainer.fit())
    finally:
        release_output_dir(cfg.global_.output_dir)
    report.update(epochs=trainer.epoch, output_dir=cfg.global_.output_dir)
    report[f"best_{task.best}"] = trainer.best_metric
    if getattr(trainer, "analysis", None) is not None:
        report["analysis"] = trainer.analysis
    return report


def evaluate(cfg, analysis_dir: str | None = None) -> dict:
    """Evaluate ``model.weights`` on the val split (the task's evaluator, sharded over ranks); with
    ``analysis_dir``, rank 0 writes the per-class analysis there and the report holds it as ``analysis``."""
    task = task_of(cfg)
    env = start_run(cfg)
    if not cfg.model.weights:
        raise ConfigError("model.weights is not set: pass -o model.weights=<checkpoint prefix>")
    cfg = resolve_preprocessing(cfg)
    loader, num_classes = task.build_eval_data(cfg, env.rank, env.world_size)
    model = task.build_model(cfg, num_classes)
    task.prepare_model(cfg, model)
    ckpt.load_weights(model, cfg.model.weights, copy=cfg.model.weights_copy)
    # Training checks its weights each step; a checkpoint given here may come from anywhere (a diverged run's).
    from ppdlx.export.checks import check_finite_weights
    check_finite_weights(model, cfg.model.weights, use="evaluate")
    start = time.perf_counter()
    evaluator = task.build_evaluator(cfg, model, loader, env.rank, env.world_size)
    if analysis_dir:
        task.keep_for_analysis(evaluator)
    metrics = evaluator(model)
    metrics["seconds"] = time.perf_counter() - start
    report = task.eval_report(metrics)
    if analysis_dir and env.rank == 0:
        report["analysis"] = write_analysis(task, cfg, evaluator, analysis_dir) or {
            "skipped": "the evaluation produced nothing to analyse"}
    return report
