"""Detection entry points (``data.dataset: coco``): ``train(cfg, hooks)`` and ``evaluate(cfg)``.

Composes the same pieces as ``ppdlx.engine.run`` (Trainer, checkpoints, EMA, AMP plan, LR
schedule, optimizer with param groups, paddle.distributed) with the detection ones: COCO
loaders (``ppdlx.data.coco``), ``EfficientDetLoss`` as the objective, and ``CocoEvaluator``
(pycocotools AP, sharded over ranks) as the evaluator.

* ``num_classes`` comes from the dataset's categories: a ``model.num_classes`` that disagrees
  is a ``ConfigError`` naming both numbers. ``data.coco.image_size`` is the network input size
  and is passed to the model (``model.args.image_size``, if given, must agree).
* With several ranks the number of positive anchors that normalises the loss is averaged
  over ranks (as the reference), gradients are averaged by ``DataParallel``.
* ``<output_dir>/classes.json`` records the category ids and names (``tools/infer.py`` reads it).
"""
from __future__ import annotations

import copy
import inspect
import json
import logging
import os
import time

import numpy as np
import paddle

from ppdlx.config import save_config
from ppdlx.data.coco import build_coco_loader
from ppdlx.engine import checkpoint as ckpt
from ppdlx.engine import dist
from ppdlx.engine.amp import build_scaler, decorate_o2, plan_amp
from ppdlx.engine.builders import check_builder_args, count_params, seed_everything
from ppdlx.engine.coco_eval import STAT_KEYS, CocoEvaluator
from ppdlx.engine.ema import ModelEMA
from ppdlx.engine.cpu_kernels import plan_fast_cpu_kernels, use_fast_cpu_kernels
from ppdlx.engine.run import _setup
from ppdlx.engine.trainer import Trainer
from ppdlx.errors import ConfigError, UnsupportedError
from ppdlx.optim import build_lr_schedule, build_optimizer, scaled_lr
from ppdlx.registry import MODELS

log = logging.getLogger("ppdlx")

REPORT_KEYS = STAT_KEYS + ("images", "seconds")


class DetectionObjective:
    """``(model, batch) -> (loss, n_images)`` with ``EfficientDetLoss``; ``last`` keeps the parts."""

    def __init__(self, loss_fn, world_size: int = 1):
        self.loss_fn = loss_fn
        self.world_size = world_size
        self.last = {}

    def __call__(self, model, batch, epoch: int, step: int):
        images, gt_boxes, gt_classes = batch[0], batch[1], batch[2]
        outputs = model(images)
        cls_flat, box_flat = self.loss_fn.flatten(outputs)
        cls_t, box_t, num_pos = self.loss_fn.assign(gt_boxes, gt_classes)
        num_pos = num_pos.sum()
        if self.world_size > 1:
            import paddle.distributed as pdist
            num_pos = num_pos.clone()
            pdist.all_reduce(num_pos)
            num_pos = num_pos / self.world_size
        losses = self.loss_fn.loss_from_targets(cls_flat.astype("float32"), box_flat.astype("float32"),
                                                cls_t, box_t, num_pos)
        self.last = losses
        return losses["total"], int(images.shape[0])


def check_num_classes(cfg, loader) -> int:
    n = len(loader.cat_ids)
    if cfg.model.num_classes != n:
        json_path = loader.dataset.index.json_path if hasattr(loader, "dataset") else "the annotation file"
        raise ConfigError(f"model.num_classes={cfg.model.num_classes} but {json_path} has {n} categories "
                          f"(ids {loader.cat_ids[:8]}{'...' if n > 8 else ''}); set model.num_classes={n} "
                          f"(the class index is the category's rank, not its id, so no 90/91 slots)")
    return n


def build_detection_model(cfg, num_classes: int):
    import ppdlx.models  # noqa: F401  (registers every family)
    m, size = cfg.model, cfg.data.coco.image_size
    builder = MODELS.get(m.name)
    if "image_size" not in inspect.signature(builder).parameters:
        raise ConfigError(f"model.name={m.name} is not a detection model (data.dataset=coco needs e.g. "
                          f"efficientdet_d0)")
    args = dict(m.args)
    if args.get("image_size", size) != size:
        raise ConfigError(f"model.args.image_size={args['image_size']} differs from data.coco.image_size={size}; "
                          f"drop model.args.image_size (the data's size is used)")
    args["image_size"] = size
    check_builder_args(m.name, args)
    return MODELS.build(m.name, num_classes=num_classes, data_format=m.data_format, **args)


def set_bn_momentum(model, momentum: float) -> int:
    """Set the running-statistics momentum of every BatchNorm layer; returns how many."""
    count = 0
    for layer in model.sublayers(include_self=True):
        if isinstance(layer, paddle.nn.layer.norm._BatchNormBase):
            layer._momentum = float(momentum)
            count += 1
    return count


@paddle.no_grad()
def freeze_small_bn(model, image_size: int, max_pixels: int) -> int:
    """BatchNorm layers whose output maps have ``<= max_pixels`` pixels for a square ``image_size``
    input use fixed statistics (their initial mean 0 / variance 1) in training and eval."""
    from paddle.nn.layer.norm import _BatchNormBase
    small, hooks = set(), []
    for name, layer in model.named_sublayers():
        if isinstance(layer, _BatchNormBase):
            def hook(layer, inputs, output, name=name):
                spatial = output.shape[2:] if layer._data_format in ("NCHW", "NCL", "NCDHW") else output.shape[1:-1]
                if int(np.prod(spatial)) <= max_pixels:
                    small.add(name)
            hooks.append(layer.register_forward_post_hook(hook))
    was_training = model.training
    model.eval()
    shape = [1, 3, image_size, image_size] if model.data_format == "NCHW" else [1, image_size, image_size, 3]
    model(paddle.zeros(shape))
    for h in hooks:
        h.remove()
    for name, layer in model.named_sublayers():
        if name in small:
            layer._use_global_stats = True
            layer._mean.set_value(paddle.zeros_like(layer._mean))
            layer._variance.set_value(paddle.ones_like(layer._variance))
    if was_training:
        model.train()
    return len(small)


def build_postprocess(cfg, model):
    from ppdlx.models.detection import EfficientDetPostProcess
    d = cfg.detection
    return EfficientDetPostProcess.from_model(model, pre_nms_top_k=d.pre_nms_top_k, max_detections=d.max_detections,
                                              iou_threshold=d.iou_threshold, score_threshold=d.score_threshold)


def build_precise_bn_loader(cfg, rank, world, cat_ids):
    """Training images through the *evaluation* transform, ``eval.batch_size`` per batch: BN
    statistics for evaluation must come from inputs like the evaluated ones. Measured on the
    synthetic demo: AP 0.57 with these statistics vs 0.30 from augmented training batches of
    the same size and 0.07 from the momentum-averaged running statistics (docs/detection.md)."""
    bn_cfg = copy.deepcopy(cfg)
    bn_cfg.data.coco.val_json = cfg.data.coco.train_json
    bn_cfg.data.coco.val_images = cfg.data.coco.train_images
    return build_coco_loader(bn_cfg, "val", rank, world, batch_size=cfg.eval.batch_size, cat_ids=cat_ids)


def build_evaluator(cfg, model, val_loader, amp_plan=None, results_name="detections_val.json",
                    precise_bn_loader=None):
    d = cfg.detection
    results = os.path.join(cfg.global_.output_dir, results_name) if d.save_results else None
    precise_bn = (precise_bn_loader, d.precise_bn_batches) if precise_bn_loader is not None and d.precise_bn_batches \
        else None
    return CocoEvaluator(val_loader, build_postprocess(cfg, model), val_loader.coco_gt, val_loader.cat_ids,
                         nms=d.nms, soft_nms_sigma=d.soft_nms_sigma, score_threshold=d.score_threshold,
                         results_path=results, amp_plan=amp_plan, precise_bn=precise_bn)


def write_classes(path: str, loader) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"category_ids": list(loader.cat_ids), "names": list(loader.classes)}, f, ensure_ascii=False,
                  indent=1)
    os.replace(tmp, path)


def build_detection_training(cfg, hooks=()):
    rank, world, device = _setup(cfg)
    if cfg.train.graph != "dynamic":
        raise UnsupportedError(f"train.graph={cfg.train.graph}: detection trains in dynamic graph only; "
                               f"set train.graph=dynamic")
    if cfg.train.mixup_alpha > 0:
        raise UnsupportedError("train.mixup_alpha: mixup is classification-only; set train.mixup_alpha=0")
    fast_cpu = plan_fast_cpu_kernels(cfg, device)
    amp_plan = plan_amp(cfg.amp, device)
    if amp_plan.note:
        log.info(amp_plan.note)
    seed_everything(cfg.global_.seed)
    train_loader = build_coco_loader(cfg, "train", rank, world)
    num_classes = check_num_classes(cfg, train_loader)
    val_loader = build_coco_loader(cfg, "val", rank, world, batch_size=cfg.eval.batch_size,
                                   cat_ids=train_loader.cat_ids)
    model = build_detection_model(cfg, num_classes)
    if fast_cpu:
        use_fast_cpu_kernels(model)
    if cfg.detection.bn_momentum is not None:
        set_bn_momentum(model, cfg.detection.bn_momentum)
    if cfg.detection.freeze_bn_max_pixels:
        frozen = freeze_small_bn(model, cfg.data.coco.image_size, cfg.detection.freeze_bn_max_pixels)
        log.info("detection.freeze_bn_max_pixels=%d: %d BatchNorm layers on maps of <= %d pixels keep fixed "
                 "statistics", cfg.detection.freeze_bn_max_pixels, frozen, cfg.detection.freeze_bn_max_pixels)
    if cfg.model.weights and not cfg.train.resume:
        missing = ckpt.load_weights(model, cfg.model.weights)
        log.info("loaded weights %s (%d parameters not in the file)", cfg.model.weights, len(missing))
    seed_everything(cfg.global_.seed + rank)
    from ppdlx.models.detection import EfficientDetLoss
    objective = DetectionObjective(EfficientDetLoss.from_model(model), world)
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
    if world > 1:
        model = paddle.DataParallel(model)
    bn_loader = build_precise_bn_loader(cfg, rank, world, train_loader.cat_ids) if cfg.detection.precise_bn_batches \
        else None
    evaluator = build_evaluator(cfg, raw_model, val_loader, amp_plan, precise_bn_loader=bn_loader)
    trainer = Trainer(
        model=model, raw_model=raw_model, optimizer=optimizer, lr_schedule=lr_schedule, objective=objective,
        train_loader=train_loader, evaluator=evaluator, output_dir=cfg.global_.output_dir, epochs=cfg.train.epochs,
        amp=amp_plan, scaler=build_scaler(amp_plan, cfg.amp), ema=ema, eval_with_ema=cfg.ema.eval_with_ema,
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
        write_classes(os.path.join(cfg.global_.output_dir, "classes.json"), train_loader)
        log.info("model %s: %d parameters, %d classes, input %dx%d; %d train images, %d val images; global batch "
                 "%d (%d x %d ranks x %d accumulate), peak lr %.4f, %d steps/epoch; device %s (%d CPU threads); amp %s",
                 cfg.model.name, count_params(raw_model), num_classes, cfg.data.coco.image_size,
                 cfg.data.coco.image_size, train_loader.num_images, val_loader.num_images, global_batch,
                 cfg.data.batch_size, world, cfg.train.accumulate, scaled_lr(cfg, global_batch), steps, device,
                 cfg.global_.cpu_threads,
                 amp_plan.dtype if amp_plan.enabled else "off (float32)")
    return trainer


def train(cfg, hooks=()) -> dict:
    trainer = build_detection_training(cfg, hooks)
    metrics = trainer.fit()
    report = {k: metrics[k] for k in REPORT_KEYS if k in metrics}
    report.update(epochs=trainer.epoch, output_dir=cfg.global_.output_dir, best_AP=trainer.best_metric)
    return report


def evaluate(cfg) -> dict:
    rank, world, device = _setup(cfg)
    if not cfg.model.weights:
        raise ConfigError("model.weights is not set: pass -o model.weights=<checkpoint prefix>")
    loader = build_coco_loader(cfg, "val", rank, world, batch_size=cfg.eval.batch_size)
    model = build_detection_model(cfg, check_num_classes(cfg, loader))
    if cfg.detection.freeze_bn_max_pixels:
        freeze_small_bn(model, cfg.data.coco.image_size, cfg.detection.freeze_bn_max_pixels)
    ckpt.load_weights(model, cfg.model.weights)
    start = time.perf_counter()
    # the same precise-BN statistics as the evaluations during training (none when it is 0)
    bn_loader = build_precise_bn_loader(cfg, rank, world, loader.cat_ids) if cfg.detection.precise_bn_batches \
        else None
    metrics = build_evaluator(cfg, model, loader, precise_bn_loader=bn_loader)(model)
    metrics["seconds"] = time.perf_counter() - start
    return {k: metrics[k] for k in REPORT_KEYS}
