"""The detection task (``data.dataset: coco``): EfficientDet with its focal/box loss, COCO AP.

* ``num_classes`` comes from the dataset's categories: a ``model.num_classes`` that disagrees
  is a ``ConfigError`` naming both numbers. ``data.coco.image_size`` is the network input size
  and is passed to the model (``model.args.image_size``, if given, must agree).
* With several ranks the number of positive anchors that normalises the loss is averaged
  over ranks (as the reference), gradients are averaged by ``DataParallel``.
* Evaluation is pycocotools AP sharded over ranks (``CocoEvaluator``); with
  ``detection.precise_bn_batches`` the BN statistics of the weights being evaluated are first
  re-estimated from training images (inside the evaluator, so ``tools/eval.py`` does the same).
* ``<output_dir>/classes.json`` records the category ids and names (``tools/infer.py`` reads it).
"""
from __future__ import annotations

import inspect
import json
import logging
import os
from typing import List, Optional

import numpy as np
import paddle
import paddle.distributed as pdist
from paddle.nn.layer.norm import _BatchNormBase

from ppdlx.analysis import detection_analysis
from ppdlx.config.preprocess import detection_preprocess
from ppdlx.data.coco import build_coco_loader, coco_paths
from ppdlx.errors import ConfigError, DataError, UnsupportedError
from ppdlx.evaluation.coco import STAT_KEYS, CocoEvaluator
from ppdlx.evaluation.precise_bn import recompute_bn_stats
from ppdlx.models.detection import EfficientDetLoss, EfficientDetPostProcess
from ppdlx.models.from_config import build_registered, check_builder_args, with_quantization
from ppdlx.registry import MODELS, TASKS
from ppdlx.tasks.base import Task, TaskData

log = logging.getLogger("ppdlx")
# Paddle-TRT leaves multiclass_nms3 outside TensorRT (its marker takes it only with nms_eta > 1 and
# nms_top_k >= 0), so the few ops that pad and sort its variable-length output would become an engine
# of their own whose input profile is one warm-up's detection count: a batch keeping more or fewer
# detections (or none) would stop the predictor. Groups up to this size run as Paddle GPU ops; the
# detector before NMS is one group of several hundred ops.
DETECTION_TRT_MIN_SUBGRAPH_SIZE = 200


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
        if len(batch) > 5:  # assigned by the training loader on the host (detection_targets)
            cls_t, box_t, num_pos = batch[5], batch[6], batch[7]
        else:
            cls_t, box_t, num_pos = self.loss_fn.assign(gt_boxes, gt_classes)
        num_pos = num_pos.sum()
        if self.world_size > 1:
            num_pos = num_pos.clone()
            pdist.all_reduce(num_pos)
            num_pos = num_pos / self.world_size
        losses = self.loss_fn.loss_from_targets(cls_flat.astype("float32"), box_flat.astype("float32"),
                                                cls_t, box_t, num_pos)
        self.last = losses
        return losses["total"], int(images.shape[0])


def detection_targets(cfg):
    """The training loader's host target assigner: the anchors of the configured model (built under
    ``paddle.LazyGuard``, no weights, in a name scope of its own) matched as ``EfficientDetLoss`` does."""
    with paddle.utils.unique_name.guard(), paddle.LazyGuard():
        model = build_detection_model(cfg, cfg.model.num_classes)
    return EfficientDetLoss.from_model(model).host_targets()


def check_num_classes(cfg, loader) -> int:
    n = len(loader.cat_ids)
    if cfg.model.num_classes != n:
        json_path = loader.dataset.index.json_path if hasattr(loader, "dataset") else "the annotation file"
        raise ConfigError(f"model.num_classes={cfg.model.num_classes} but {json_path} has {n} categories "
                          f"(ids {loader.cat_ids[:8]}{'...' if n > 8 else ''}); set model.num_classes={n} "
                          f"(the class index is the category's rank, not its id, so no 90/91 slots)")
    return n


def build_detection_model(cfg, num_classes: int):
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
    return with_quantization(cfg, build_registered(m.name, num_classes, {"data_format": m.data_format, **args}))


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
    d = cfg.detection
    return EfficientDetPostProcess.from_model(model, pre_nms_top_k=d.pre_nms_top_k, max_detections=d.max_detections,
                                              iou_threshold=d.iou_threshold, score_threshold=d.score_threshold)


def build_precise_bn_loader(cfg, rank, world, cat_ids):
    """Training images through the *evaluation* transform, ``eval.batch_size`` per batch: BN
    statistics for evaluation must come from inputs like the evaluated ones (docs/detection.md
    has the measurements against augmented batches and running statistics)."""
    bn_cfg = cfg.replace({"data.coco.val_json": cfg.data.coco.train_json,
                          "data.coco.val_images": cfg.data.coco.train_images})
    return build_coco_loader(bn_cfg, "val", rank, world, batch_size=cfg.eval.batch_size, cat_ids=cat_ids)


def build_evaluator(cfg, model, val_loader, results_name="detections_val.json",
                    precise_bn_loader=None):
    d = cfg.detection
    results = os.path.join(cfg.global_.output_dir, results_name) if d.save_results else None
    precise_bn = (precise_bn_loader, d.precise_bn_batches) if precise_bn_loader is not None and d.precise_bn_batches \
        else None
    return CocoEvaluator(val_loader, build_postprocess(cfg, model), val_loader.coco_gt, val_loader.cat_ids,
                         nms=d.nms, soft_nms_sigma=d.soft_nms_sigma, score_threshold=d.score_threshold,
                         results_path=results, precise_bn=precise_bn)


def write_classes(path: str, loader) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"category_ids": list(loader.cat_ids), "names": list(loader.classes)}, f, ensure_ascii=False,
                  indent=1)
    os.replace(tmp, path)


def detection_export_spec(transforms, image_size: int, num_classes: int, anchors: dict, nms: dict | None = None,
                          score_threshold: float = 0.4) -> dict:
    """Image and ``image_scale`` in, decoded boxes after NMS out; resize-longer-side-and-pad pre-processing.
    ``score_threshold`` is the predictor's display threshold (the graph keeps every detection)."""
    size = int(image_size)
    return {"family": "detection", "image_size": size, "num_classes": int(num_classes),
            "anchors": dict(anchors), "nms": dict(nms or {}), "preprocess": detection_preprocess(transforms, size),
            "postprocess": {"type": "detections", "box_format": "xyxy", "coords": "original",
                            "score_threshold": float(score_threshold)},
            "trt_batches": {"opt_batch": 8, "max_batch": 32},
            "trt_min_subgraph_size": DETECTION_TRT_MIN_SUBGRAPH_SIZE}


class Detection(Task):
    name = "detection"
    datasets = ("coco",)
    graphs = ("dynamic",)
    report_keys = STAT_KEYS + ("images", "seconds")
    best = "AP"
    class_source = "COCO categories"
    headline = ("AP", "AP50", "AP75")
    eval_headline = ("AP", "AP50", "AP75", "APs", "APm", "APl", "AR100")

    def validate(self, cfg) -> None:
        super().validate(cfg)
        if cfg.train.mixup_alpha > 0 or cfg.train.cutmix_alpha > 0:
            raise UnsupportedError("train.mixup_alpha / train.cutmix_alpha: Mixup and CutMix are classification-only; "
                                   "set both to 0")

    def build_data(self, cfg, rank: int, world: int) -> TaskData:
        train_loader = build_coco_loader(cfg, "train", rank, world, targets=detection_targets(cfg))
        num_classes = check_num_classes(cfg, train_loader)
        val_loader = build_coco_loader(cfg, "val", rank, world, batch_size=cfg.eval.batch_size,
                                       cat_ids=train_loader.cat_ids)
        return TaskData(train_loader, val_loader, num_classes)

    def build_model(self, cfg, num_classes: int):
        return build_detection_model(cfg, num_classes)

    def prepare_model(self, cfg, model) -> None:
        d = cfg.detection
        if d.bn_momentum is not None:
            set_bn_momentum(model, d.bn_momentum)
        if d.freeze_bn_max_pixels:
            frozen = freeze_small_bn(model, cfg.data.coco.image_size, d.freeze_bn_max_pixels)
            log.info("detection.freeze_bn_max_pixels=%d: %d BatchNorm layers on maps of <= %d pixels keep fixed "
                     "statistics", d.freeze_bn_max_pixels, frozen, d.freeze_bn_max_pixels)

    def build_objective(self, cfg, model, data: TaskData, world: int):
        return DetectionObjective(EfficientDetLoss.from_model(model), world)

    def build_evaluator(self, cfg, model, val_loader, rank: int, world: int):
        # the same precise-BN statistics in training and in tools/eval.py (none when it is 0)
        bn_loader = build_precise_bn_loader(cfg, rank, world, val_loader.cat_ids) \
            if cfg.detection.precise_bn_batches else None
        return build_evaluator(cfg, model, val_loader, precise_bn_loader=bn_loader)

    def analysis_inputs(self, cfg, evaluator):
        if evaluator.last_coco_eval is None:
            return None
        return {"coco_eval": evaluator.last_coco_eval, "image_dir": coco_paths(cfg, "val")[1]}

    def build_eval_data(self, cfg, rank: int, world: int):
        loader = build_coco_loader(cfg, "val", rank, world, batch_size=cfg.eval.batch_size)
        return loader, check_num_classes(cfg, loader)

    def start(self, cfg, data: TaskData) -> None:
        write_classes(os.path.join(cfg.global_.output_dir, "classes.json"), data.train_loader)

    def describe(self, cfg, data: TaskData) -> str:
        size = cfg.data.coco.image_size
        return f", {data.num_classes} classes, input {size}x{size}"

    def export_spec(self, cfg, model) -> dict:
        d = cfg.detection  # the graph post-processes with the evaluator's hard-NMS settings
        nms = {"pre_nms_top_k": d.pre_nms_top_k, "max_detections": d.max_detections, "iou_threshold": d.iou_threshold,
               "score_threshold": d.score_threshold}
        return detection_export_spec(cfg.data.transforms, model.image_size,
                                     int(getattr(model, "num_classes", cfg.model.num_classes)), model.anchor_args, nms)

    def evaluation_statistics(self, cfg, model, what: str) -> int:
        """With ``detection.precise_bn_batches`` the evaluator re-estimates the BatchNorm statistics from training
        images before scoring (the checkpoint holds the training running statistics): the same here, or the
        model predicts differently from what ``tools/eval.py`` reports."""
        batches = cfg.detection.precise_bn_batches
        if not batches:
            return 0
        try:
            loader = build_precise_bn_loader(cfg, 0, 1, None)
        except DataError as err:
            log.warning("%s: detection.precise_bn_batches=%d but the training images are not readable (%s): the %s "
                        "keeps the checkpoint's running BatchNorm statistics, unlike tools/eval.py", what, batches, err,
                        what)
            return 0
        used = recompute_bn_stats(model, loader, batches)
        log.info("%s: BatchNorm statistics re-estimated from %d training batches, as the evaluator does "
                 "(detection.precise_bn_batches=%d)", what, used, batches)
        return used

    def class_names_from_data(self, cfg) -> Optional[List[str]]:
        """The COCO category names in ascending id order (the class index is the category's rank), read from
        the val json (smaller than the train json, and required to list the same categories)."""
        for split in ("val", "train"):
            json_path = coco_paths(cfg, split)[0]
            if os.path.isfile(json_path):
                with open(json_path, encoding="utf-8") as f:
                    categories = sorted(json.load(f).get("categories", []), key=lambda c: c["id"])
                names = [str(c.get("name", c["id"])) for c in categories]
                return names if len(names) == cfg.model.num_classes else None
        return None

    def size_changes(self, default_cfg: dict) -> dict:
        return {"data.coco.image_size": default_cfg["input_size"][1]}

    def resolution(self, cfg) -> int:
        return int(cfg.data.coco.image_size)

    def config_at_resolution(self, cfg, model, resolution: int):
        """A detector is built for one input size (its anchors): ``model.args.image_size`` set to ``resolution``
        when ``model`` was built for another."""
        if model.default_cfg["input_size"][1] == resolution:
            return cfg
        return cfg.replace({"model.args": {**cfg.model.args, "image_size": resolution}})

    def analyse(self, out_dir: str, **inputs) -> dict:
        return detection_analysis(out_dir=out_dir, **inputs)


TASKS.register("detection")(Detection())
