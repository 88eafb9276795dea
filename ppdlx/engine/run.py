"""Entry points for every task and graph mode: ``build_training(cfg, hooks)``, ``train(cfg, hooks)``,
``evaluate(cfg)``.

One assembly path, :class:`TrainingRun`: from one frozen config it plans the run (``ppdlx.engine.plan``; the
config the builders read from then on carries the resolved pre-processing and the planned layout), lets the
task plug-in (``ppdlx.tasks``) build data, model, objective and evaluator, builds the step strategy for
``train.graph``, registers the standard hooks around the caller's and resumes -- one ``build_*`` method per
piece, called in order, each overridable (detectron2's ``DefaultTrainer``). The order of what is built, and of
the RNG seeding between, is what makes runs reproducible and graph modes bit-identical: a static run builds the
same dynamic model first (same initial weights, same parameter names, hence the same ``.pdopt`` keys) and
traces its programs from it.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import time

import paddle

from ppdlx import checkpoint as ckpt
from ppdlx.analysis.data_report import check_before_training
from ppdlx.config import save_config
from ppdlx.cpu_env import keep_freed_memory
from ppdlx.data.coco_index import sharing_indexes
from ppdlx.data.mixing import MixSpec
from ppdlx.dist import seed_everything
from ppdlx.engine import hooks as std
from ppdlx.engine.amp import build_scaler, check_image_dtype, check_o2_weight_decay, decorate_o2, plan_amp
from ppdlx.engine.dynamic_step import DynamicStep, compile_forward
from ppdlx.engine.ema import ModelEMA
from ppdlx.engine.plan import RunPlan, plan_cpu_kernels, start_run, with_layout
from ppdlx.engine.static.ir_compat import check_graph_flags, ir_name
from ppdlx.engine.static.probe import plan_static_amp
from ppdlx.engine.static.program import ProgramSpec
from ppdlx.engine.static.step import build_static_step
from ppdlx.engine.step import check_finite_weights
from ppdlx.engine.trainer import Trainer, optimizer_steps_per_epoch
from ppdlx.errors import ConfigError
from ppdlx.layers import layer_config
from ppdlx.layers.cpu_kernels import kernel_counts, kernel_line
from ppdlx.models import qat
from ppdlx.models.info import count_trainable_params
from ppdlx.optim import (batch_change_line, build_lr_schedule, build_optimizer, global_batch_record, optimizer_groups,
                         scaled_lr)
from ppdlx.registry import OPTIMIZERS
from ppdlx.sparsity import ensure_asp_hook
from ppdlx.tasks import task_of
from ppdlx.tasks.preprocess import resolve_preprocessing, resolve_with_record

log = logging.getLogger("ppdlx")
ANALYSIS_MAX_SCORES = 1 << 22  # val images x classes of logits kept for the end-of-training analysis


def program_spec(cfg, task, num_classes: int) -> ProgramSpec:
    """What tracing a static program of ``cfg`` needs: the task's model and loss, the config's optimizer."""
    return ProgramSpec(
        build_model=lambda: task.build_model(cfg, num_classes), build_loss=lambda: task.build_loss(cfg, num_classes),
        param_groups=lambda model: optimizer_groups(cfg, model),
        build_optimizer=lambda lr, params, multi_precision: OPTIMIZERS.build(
            cfg.optimizer.name, lr=lr, groups=params, cfg=cfg, multi_precision=multi_precision),
        data_format=cfg.model.data_format, accumulate=cfg.train.accumulate, mix=MixSpec.of(cfg.train).enabled,
        ema=cfg.ema.enabled, build_scaler=lambda amp: build_scaler(amp, cfg.amp))


def plan_training_amp(cfg, device: str, fast_cpu_kernels: bool = False, cpu_threads: int = 1):
    """What AMP does for this training config on ``device`` (static graph: a probe step on CPU)."""
    if cfg.train.graph != "static":
        return plan_amp(cfg.amp, device, fast_cpu_kernels, cpu_threads)
    return plan_static_amp(cfg.amp, device, program_spec(cfg, task_of(cfg), cfg.model.num_classes),
                           cfg.data.transforms.crop_size, cfg.model.num_classes, cfg.optimizer.name)


class TrainingRun:
    """The trainer of one config, built one piece per ``build_*`` method in the order :meth:`assemble` calls them.

    ``self.cfg`` is the config every builder reads: the one given until :meth:`build_plan`, then the run's (the
    pre-processing resolved from the model's ``default_cfg``, the planned data layout); ``config.yaml`` keeps the
    one given. ``amp``: an AMP plan to use instead of the one planned for this machine (tests force O2)."""

    def __init__(self, cfg, hooks=(), amp=None):
        self.cfg, self.config_as_given = cfg, cfg
        self.hooks, self.forced_amp = list(hooks), amp
        self.task = task_of(cfg)

    def build(self) -> Trainer:
        """Settle the output directory (writable, locked, resumed or explicitly started over), then assemble."""
        if self.cfg.train.graph == "static":
            check_graph_flags("static")
        self.task.validate(self.cfg)
        self.env = start_run(self.cfg, collective_programs=self.cfg.train.graph == "static")
        self.resume_path = ckpt.prepare_output_dir(self.cfg, self.env.rank)
        try:
            ckpt.check_ranks_resume_alike(self.cfg.global_.output_dir, self.resume_path)
            with sharing_indexes():  # the data check, loaders and evaluator read each COCO json once
                return self.assemble()
        except BaseException:
            ckpt.release_output_dir(self.cfg.global_.output_dir)  # a training that never started holds it no longer
            raise

    def assemble(self) -> Trainer:
        check_before_training(self.cfg)  # every rank: one that stopped alone would leave the others waiting
        # A static run builds the dynamic model in a fresh unique-name scope, in the dynamic order (AMP
        # probe, seed, loaders, model): the names and initial weights of a dynamic run in a fresh process.
        static = self.cfg.train.graph == "static"
        with paddle.utils.unique_name.guard() if static else contextlib.nullcontext():
            self.plan = self.build_plan()
            # Same initial weights on every rank; per-rank streams for dropout/drop-path afterwards.
            seed_everything(self.cfg.global_.seed)
            self.data = self.build_data()
            self.model = self.build_model()
        seed_everything(self.cfg.global_.seed + self.env.rank)
        self.step = self.build_step()
        self.evaluator = self.build_evaluator()
        trainer = self.build_trainer()
        self.resume_or_start(trainer)
        if self.env.rank == 0:
            self.write_run_files()
        return trainer

    def build_plan(self) -> RunPlan:
        """The run plan; from here on ``self.cfg`` is the run's config (``RunPlan.configure``)."""
        cfg, env = self.cfg, self.env
        fast_kernels, data_format = plan_cpu_kernels(cfg, env.device)
        resolved, preprocess = resolve_with_record(cfg)
        self.cfg = cfg = with_layout(resolved, data_format)
        amp = self.forced_amp or plan_training_amp(cfg, env.device, fast_kernels, env.cpu_threads)
        check_o2_weight_decay(amp, cfg.optimizer)
        qat.check_training(cfg.qat.enabled, amp.enabled, amp.level)
        graph = cfg.train.graph
        plan = RunPlan(env.rank, env.world_size, env.device, env.cpu_threads, graph,
                       "dygraph" if graph == "dynamic" else ir_name(), data_format, fast_kernels, amp, preprocess)
        check_image_dtype(cfg.data, amp, graph)
        if amp.note:
            log.info(amp.note)
        return plan

    def build_data(self):
        return self.task.build_data(self.cfg, self.env.rank, self.env.world_size)

    def build_model(self):
        """The task's model, its layers on the kernels the plan picked; then the checkpoint to resume is checked
        against it, or ``model.weights`` loaded (a checkpoint found by ``train.resume`` wins; without one,
        ``resume=auto`` in a fresh directory, the run starts from ``model.weights`` rather than random weights)."""
        cfg = self.cfg
        with layer_config(self.plan.layer_config):
            model = self.task.build_model(cfg, self.data.num_classes)
        if cfg.qat.enabled:
            log.info(qat.describe(model, cfg.qat.moving_rate))
        if self.plan.fast_cpu_kernels:
            log.info(kernel_line(kernel_counts(model), keep_freed_memory()))
        self.task.prepare_model(cfg, model)
        if self.resume_path:
            ckpt.check_resumable(self.resume_path, model, cfg.model.name)
        elif cfg.model.weights:
            missing = ckpt.load_weights(model, cfg.model.weights, cfg.model.reset_head, cfg.model.weights_copy)
            log.info("loaded weights %s (%d parameters not in the file)", cfg.model.weights, len(missing))
        return model

    def build_lr_schedule(self):
        cfg = self.cfg
        self.steps_per_epoch = optimizer_steps_per_epoch(len(self.data.train_loader), cfg.train.accumulate,
                                                         cfg.train.steps_per_epoch)
        self.global_batch = cfg.data.batch_size * self.env.world_size * cfg.train.accumulate
        return build_lr_schedule(cfg, self.global_batch, self.steps_per_epoch)

    def build_step(self):
        """The step strategy of ``train.graph`` (and the LR schedule, built where each strategy needs it);
        ``self.raw_model`` is the model the evaluator runs (None: the static step evaluates its program)."""
        cfg, plan, model = self.cfg, self.plan, self.model
        if plan.graph == "static":
            self.lr_schedule = self.build_lr_schedule()
            self.raw_model = None
            init_state = {n: v.numpy() for n, v in model.state_dict().items()}
            dyn_names = {n: v.name for n, v in model.state_dict().items()}
            return build_static_step(program_spec(cfg, self.task, self.data.num_classes), self.lr_schedule, plan.amp,
                                     plan.world_size, plan.device, init_state, dyn_names, MixSpec.of(cfg.train),
                                     cfg.global_.seed, cfg.ema.decay, cfg.ema.dynamic_decay)
        objective = self.task.build_objective(cfg, model, self.data, self.env.world_size)
        self.lr_schedule = self.build_lr_schedule()
        optimizer = build_optimizer(cfg, model, self.lr_schedule, multi_precision=plan.amp.enabled)
        # EMA shadows start from the float32 weights, before O2 rounds the parameters to fp16
        ema = ModelEMA(model, cfg.ema.decay, cfg.ema.dynamic_decay) if cfg.ema.enabled else None
        model, optimizer = decorate_o2(plan.amp, model, optimizer)
        self.raw_model = model
        if plan.graph == "to_static":
            model = compile_forward(model)
        if plan.world_size > 1:
            model = paddle.DataParallel(model)
        return DynamicStep(model, self.raw_model, optimizer, objective, plan.amp, build_scaler(plan.amp, cfg.amp), ema,
                           cfg.train.accumulate, plan.world_size)

    def build_evaluator(self):
        return self.task.build_evaluator(self.cfg, self.raw_model, self.data.val_loader, self.env.rank,
                                         self.env.world_size)

    def build_hooks(self) -> list:
        """The standard hooks around the caller's and the task's, in their documented order."""
        cfg, data = self.cfg, self.data
        hooks = [*self.hooks, *self.task.hooks(cfg, data),
                 final_analysis_hook(cfg, self.task, self.evaluator, data, self.env.rank)]
        self.batch_record = global_batch_record(cfg, self.env.world_size)
        identity = {"name": cfg.model.name, "num_classes": data.num_classes, "global_batch": self.batch_record}
        return standard_hooks(cfg, self.env.rank, self.lr_schedule, self.evaluator, self.step, hooks, identity)

    def build_trainer(self) -> Trainer:
        cfg, env = self.cfg, self.env
        trainer = Trainer(self.step, self.build_hooks(), train_loader=self.data.train_loader, epochs=cfg.train.epochs,
                          accumulate=cfg.train.accumulate, steps_per_epoch=cfg.train.steps_per_epoch,
                          log_interval=cfg.global_.log_interval, max_nonfinite_steps=cfg.train.max_nonfinite_steps,
                          rank=env.rank, world_size=env.world_size, output_dir=cfg.global_.output_dir)
        trainer.plan = self.plan  # for reports; the loop does not read it
        return trainer

    def resume_or_start(self, trainer: Trainer) -> None:
        if self.resume_path:
            trainer.resume(self.resume_path)
            changed = batch_change_line(ckpt.recorded_global_batch(self.resume_path), self.batch_record,
                                        self.resume_path)
            if changed and self.env.rank == 0:
                log.warning(changed)
        elif self.cfg.train.resume == "auto":
            log.info("train.resume=auto: no checkpoint in %s, starting fresh", self.cfg.global_.output_dir)

    def write_run_files(self) -> None:
        """Rank 0: ``config.yaml`` (the config as given), ``plan.yaml``, the task's files; the run's summary lines."""
        cfg, env, data = self.cfg, self.env, self.data
        out = cfg.global_.output_dir
        save_config(self.config_as_given, os.path.join(out, "config.yaml"))
        self.plan.save(os.path.join(out, "plan.yaml"))
        self.task.start(cfg, data)
        log.info("model %s: %d parameters%s; %d train images, %d val images; global batch %d (%d x %d ranks x %d "
                 "accumulate), peak lr %.4f, %d steps/epoch", cfg.model.name, count_trainable_params(self.model),
                 self.task.describe(cfg, data), data.train_loader.num_images, data.val_loader.num_images,
                 self.global_batch, cfg.data.batch_size, env.world_size, cfg.train.accumulate,
                 scaled_lr(cfg, self.global_batch), self.steps_per_epoch)
        log.info(self.plan.line())


def build_training(cfg, hooks=(), amp=None) -> Trainer:
    """The trainer for ``cfg``, with the standard hooks around ``hooks`` (order: ``ppdlx.engine.hooks``).
    ``amp``: an AMP plan to use instead of the one planned for this machine (tests force O2)."""
    return TrainingRun(cfg, hooks, amp).build()


def final_analysis_hook(cfg, task, evaluator, data, rank: int):
    """``RunAnalysis`` with the final evaluation's per-class analysis when keeping it is cheap (at most
    ``ANALYSIS_MAX_SCORES`` val images x classes of logits); otherwise curves only, and the report says why."""
    scores = data.val_loader.num_images * data.num_classes
    if scores > ANALYSIS_MAX_SCORES:
        return std.RunAnalysis(cfg.global_.output_dir, rank, skipped=(
            f"skipped: {data.val_loader.num_images} val images x {data.num_classes} classes is more than "
            f"{ANALYSIS_MAX_SCORES} scores to keep; run tools/eval.py --analysis"))
    task.keep_for_analysis(evaluator)
    return std.RunAnalysis(cfg.global_.output_dir, rank, functools.partial(task.write_analysis, cfg, evaluator))


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
        hooks = ensure_asp_hook(cfg, list(hooks))
    task = task_of(cfg)
    trainer = build_training(cfg, hooks)
    try:
        report = task.train_report(trainer.fit())
    finally:
        ckpt.release_output_dir(cfg.global_.output_dir)
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
    check_finite_weights(model, cfg.model.weights, use="evaluate")
    start = time.perf_counter()
    evaluator = task.build_evaluator(cfg, model, loader, env.rank, env.world_size)
    if analysis_dir:
        task.keep_for_analysis(evaluator)
    metrics = evaluator(model)
    metrics["seconds"] = time.perf_counter() - start
    report = task.eval_report(metrics)
    if analysis_dir and env.rank == 0:
        report["analysis"] = task.write_analysis(cfg, evaluator, analysis_dir) or {
            "skipped": "the evaluation produced nothing to analyse"}
    return report
