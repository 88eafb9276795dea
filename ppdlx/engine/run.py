"""Entry points used by the CLIs: ``train(cfg)`` and ``evaluate(cfg)``."""
from __future__ import annotations

import logging
import os
import time

import paddle

from ppdlx.config import save_config
from ppdlx.data.loader import build_classification_loader
from ppdlx.engine import checkpoint as ckpt
from ppdlx.engine import dist
from ppdlx.engine.amp import build_scaler, decorate_o2, plan_amp
from ppdlx.engine.builders import build_model, count_params, resolve_device, seed_everything
from ppdlx.engine.ema import ModelEMA
from ppdlx.engine.evaluator import ClassificationEvaluator
from ppdlx.engine.logger import setup_logging
from ppdlx.engine.objectives import ClassificationObjective
from ppdlx.engine.cpu_kernels import plan_fast_cpu_kernels, use_fast_cpu_kernels
from ppdlx.engine.trainer import Trainer
from ppdlx.errors import ConfigError, UnsupportedError
from ppdlx.losses import build_loss
from ppdlx.optim import build_lr_schedule, build_optimizer, scaled_lr

log = logging.getLogger("ppdlx")


def _setup(cfg):
    rank, world = dist.init()
    setup_logging(rank)
    device = resolve_device(cfg.global_.device)
    paddle.set_device(device)
    dist.configure_cpu_threads(cfg)
    return rank, world, device


def _classes_of(loader):
    if getattr(loader, "classes", None) is not None:
        return loader.classes
    return getattr(getattr(loader, "dataset", None), "classes", None)


def build_training(cfg, hooks=()):
    """Everything ``Trainer`` needs, built from the config. Returns the trainer."""
    rank, world, device = _setup(cfg)
    if cfg.train.graph == "static":
        raise UnsupportedError("train.graph=static: use ppdlx.engine.static_trainer (tools/train.py dispatches it)")
    fast_cpu = plan_fast_cpu_kernels(cfg, device)
    amp_plan = plan_amp(cfg.amp, device)
    if amp_plan.note:
        log.info(amp_plan.note)
    # Same initial weights on every rank; per-rank streams for dropout/drop-path afterwards.
    seed_everything(cfg.global_.seed)
    train_cfg = cfg
    if cfg.distill.enabled:  # training batches at the teacher's resolution (ppdlx.engine.distill)
        from ppdlx.engine.distill import teacher_data_config
        train_cfg = teacher_data_config(cfg)
    train_loader = build_classification_loader(train_cfg, "train", rank, world)
    classes = _classes_of(train_loader)
    num_classes = cfg.model.num_classes
    if classes is not None and len(classes) != num_classes:
        raise ConfigError(f"model.num_classes={num_classes} but {cfg.data.root}/{cfg.data.train_split} has "
                          f"{len(classes)} class folders; set model.num_classes={len(classes)}")
    val_loader = build_classification_loader(cfg, "val", rank, world, batch_size=cfg.eval.batch_size,
                                             classes=classes)
    model = build_model(cfg)
    if fast_cpu:
        use_fast_cpu_kernels(model)
    if cfg.model.weights and not cfg.train.resume:
        missing = ckpt.load_weights(model, cfg.model.weights)
        log.info("loaded weights %s (%d parameters not in the file)", cfg.model.weights, len(missing))
    seed_everything(cfg.global_.seed + rank)
    criterion = build_loss(cfg, num_classes)
    objective = ClassificationObjective(criterion, cfg.train.mixup_alpha, cfg.global_.seed)
    if cfg.distill.enabled:
        from ppdlx.engine.distill import build_distillation_objective
        objective = build_distillation_objective(cfg, criterion)
    global_batch = cfg.data.batch_size * world * cfg.train.accumulate
    steps = len(train_loader) // cfg.train.accumulate
    if cfg.train.steps_per_epoch:
        steps = min(steps, cfg.train.steps_per_epoch)
    steps = max(steps, 1)
    lr_schedule = build_lr_schedule(cfg, global_batch, steps)
    optimizer = build_optimizer(cfg, model, lr_schedule, multi_precision=amp_plan.enabled)
    # EMA shadows start from the float32 weights, before O2 rounds the parameters to fp16
    ema = ModelEMA(model, cfg.ema.decay, cfg.ema.dynamic_decay) if cfg.ema.enabled else None
    model, optimizer = decorate_o2(amp_plan, model, optimizer)
    raw_model = model
    if cfg.train.graph == "to_static":
        # The model only (AST, full_graph=True): bit-identical to dynamic under PIR and legacy IR;
        # the train step cannot be AST-converted (loss.backward) -- docs/graph_modes.md.
        from ppdlx.engine.static_trainer import check_graph_flags
        check_graph_flags("to_static")  # oneDNN flags break run_program ("dst_tensor ... defined")
        model = paddle.jit.to_static(model, full_graph=True)
    if world > 1:
        model = paddle.DataParallel(model)
    trainer = Trainer(
        model=model, raw_model=raw_model, optimizer=optimizer, lr_schedule=lr_schedule, objective=objective,
        train_loader=train_loader, evaluator=ClassificationEvaluator(val_loader, cfg.eval.topk),
        output_dir=cfg.global_.output_dir, epochs=cfg.train.epochs, amp=amp_plan,
        scaler=build_scaler(amp_plan, cfg.amp), ema=ema, eval_with_ema=cfg.ema.eval_with_ema,
        accumulate=cfg.train.accumulate, steps_per_epoch=cfg.train.steps_per_epoch,
        log_interval=cfg.global_.log_interval, max_nonfinite_steps=cfg.train.max_nonfinite_steps,
        eval_interval=cfg.eval.interval, save_interval=cfg.train.save_interval,
        keep_epoch_checkpoints=cfg.train.keep_epoch_checkpoints, hooks=list(hooks), rank=rank, world_size=world)
    if cfg.train.resume:
        prefix = ckpt.resolve_resume(cfg.train.resume, cfg.global_.output_dir)
        if prefix:
            trainer.resume(prefix)
        else:
            log.info("train.resume=auto: no checkpoint in %s, starting fresh", cfg.global_.output_dir)
    if rank == 0:
        save_config(cfg, os.path.join(cfg.global_.output_dir, "config.yaml"))
        log.info("model %s: %d parameters; %d train images, %d val images; global batch %d (%d x %d ranks x %d "
                 "accumulate), peak lr %.4f, %d steps/epoch; device %s (%d CPU threads); amp %s",
                 cfg.model.name, count_params(raw_model), train_loader.num_images, val_loader.num_images,
                 global_batch, cfg.data.batch_size, world, cfg.train.accumulate, scaled_lr(cfg, global_batch),
                 steps, device, cfg.global_.cpu_threads, amp_plan.dtype if amp_plan.enabled else "off (float32)")
    return trainer


def train(cfg, hooks=()) -> dict:
    if cfg.asp.enabled:
        from ppdlx.sparsity import ensure_asp_hook
        hooks = ensure_asp_hook(cfg, list(hooks))
    if cfg.data.dataset == "coco":
        from ppdlx.engine.detection import train as train_detection
        return train_detection(cfg, hooks)
    if cfg.train.graph == "static":
        from ppdlx.engine.static_trainer import train as train_static
        return train_static(cfg, hooks)
    trainer = build_training(cfg, hooks)
    metrics = trainer.fit()
    report = {k: v for k, v in metrics.items() if k in ("top1", "top5", "images", "seconds", "loss")}
    report.update(epochs=trainer.epoch, output_dir=cfg.global_.output_dir, best_top1=trainer.best_metric)
    return report


def evaluate(cfg) -> dict:
    if cfg.data.dataset == "coco":
        from ppdlx.engine.detection import evaluate as evaluate_detection
        return evaluate_detection(cfg)
    rank, world, device = _setup(cfg)
    if not cfg.model.weights:
        raise ConfigError("model.weights is not set: pass -o model.weights=<checkpoint prefix>")
    loader = build_classification_loader(cfg, "val", rank, world, batch_size=cfg.eval.batch_size)
    model = build_model(cfg)
    ckpt.load_weights(model, cfg.model.weights)
    start = time.perf_counter()
    metrics = ClassificationEvaluator(loader, cfg.eval.topk)(model)
    metrics["seconds"] = time.perf_counter() - start
    return {k: metrics[k] for k in ("top1", "top5", "images", "seconds")}
