"""The classification task (``data.dataset: image_folder``): top-1/top-5, label-smoothed
cross-entropy with Mixup / CutMix, knowledge distillation, every graph mode. Every checkpoint carries the
training class list, which evaluation, resume and export check against the class folders
(``class_list``)."""
from __future__ import annotations

import os
from typing import List, Optional

from ppdlx.analysis import classification_analysis
from ppdlx.config.preprocess import classification_preprocess
from ppdlx.data.loader import build_classification_loader
from ppdlx.data.mixing import MixSpec
from ppdlx.errors import ConfigError, UnsupportedError
from ppdlx.evaluation.classification import ClassificationEvaluator
from ppdlx.losses import build_loss
from ppdlx.models.from_config import build_model
from ppdlx.registry import TASKS
from ppdlx.tasks.base import Task, TaskData
from ppdlx.tasks.class_list import ClassList, check_eval_classes, checked_class_names
from ppdlx.tasks.distill import build_distillation_objective, teacher_data_config
from ppdlx.tasks.objectives import ClassificationObjective


def classes_of(loader):
    """The class folder names a loader reads (None for synthetic data)."""
    if getattr(loader, "classes", None) is not None:
        return loader.classes
    return getattr(getattr(loader, "dataset", None), "classes", None)


def classification_export_spec(transforms, output: str, num_classes: int) -> dict:
    """Image in, logits or probabilities out; the val transform of ``data.transforms`` as pre-processing."""
    preprocess = classification_preprocess(transforms)
    return {"family": "classification", "image_size": preprocess["crop_size"], "output": output,
            "preprocess": preprocess,
            "postprocess": {"type": "topk", "output": output, "topk": min(5, int(num_classes))},
            "trt_batches": {"opt_batch": 32, "max_batch": 256}}


class Classification(Task):
    name = "classification"
    datasets = ("image_folder",)
    graphs = ("dynamic", "to_static", "static")
    report_keys = ("top1", "top5", "images", "seconds")
    train_extra_keys = ("loss",)
    best = "top1"
    headline = eval_headline = ("top1", "top5")
    class_source = "class folders"
    dali_float16_images = True  # the classification DALI pipeline's data.dali.output_dtype
    classifies_images = True

    def validate(self, cfg) -> None:
        super().validate(cfg)
        if cfg.train.graph == "static" and cfg.distill.enabled:
            raise UnsupportedError("train.graph=static does not support distill.enabled (the teacher runs in the "
                                   "dynamic objective); use train.graph=dynamic")

    def build_data(self, cfg, rank: int, world: int) -> TaskData:
        train_cfg = cfg
        if cfg.distill.enabled:  # training batches at the teacher's resolution (ppdlx.tasks.distill)
            train_cfg = teacher_data_config(cfg)
        train_loader = build_classification_loader(train_cfg, "train", rank, world)
        classes = classes_of(train_loader)
        num_classes = cfg.model.num_classes
        if classes is not None and len(classes) != num_classes:
            raise ConfigError(f"model.num_classes={num_classes} but {cfg.data.root}/{cfg.data.train_split} has "
                              f"{len(classes)} class folders; set model.num_classes={len(classes)}")
        val_loader = build_classification_loader(cfg, "val", rank, world, batch_size=cfg.eval.batch_size,
                                                 classes=classes)
        return TaskData(train_loader, val_loader, num_classes)

    def build_model(self, cfg, num_classes: int):
        return build_model(cfg, num_classes)

    def hooks(self, cfg, data: TaskData) -> list:
        classes = classes_of(data.train_loader)
        if classes is None:  # synthetic data: no class folders
            return []
        return [ClassList(classes, os.path.join(cfg.data.root, cfg.data.train_split))]

    def saved_class_names(self, cfg, weights):
        return checked_class_names(cfg, weights)

    def build_objective(self, cfg, model, data: TaskData, world: int):
        criterion = build_loss(cfg, data.num_classes)
        if cfg.distill.enabled:
            return build_distillation_objective(cfg, criterion)
        return ClassificationObjective(criterion, MixSpec.of(cfg.train), cfg.global_.seed, cfg.model.data_format)

    def build_evaluator(self, cfg, model, val_loader, rank: int, world: int):
        return ClassificationEvaluator(val_loader, cfg.eval.topk)

    def keep_for_analysis(self, evaluator) -> None:
        evaluator.keep_predictions = True

    def analysis_inputs(self, cfg, evaluator):
        kept = evaluator.last_predictions
        if kept is None or not len(kept["labels"]):
            return None
        names = classes_of(evaluator.loader) or [f"class {k}" for k in range(kept["logits"].shape[1])]
        return {"labels": kept["labels"], "scores": kept["logits"], "paths": kept["paths"],
                "class_names": list(names)}

    def build_eval_data(self, cfg, rank: int, world: int):
        loader = build_classification_loader(cfg, "val", rank, world, batch_size=cfg.eval.batch_size)
        classes = classes_of(loader)
        if classes is not None:
            check_eval_classes(cfg, cfg.model.weights, classes, os.path.join(cfg.data.root, cfg.data.val_split))
        return loader, cfg.model.num_classes

    def build_loss(self, cfg, num_classes: int):
        return build_loss(cfg, num_classes)

    def export_spec(self, cfg, model) -> dict:
        return classification_export_spec(cfg.data.transforms, cfg.export.output,
                                          int(getattr(model, "num_classes", cfg.model.num_classes)))

    def class_names_from_data(self, cfg) -> Optional[List[str]]:
        """The sub-directories of ``data.root/<train_split>`` (a label is the index of its sorted folder)."""
        split_dir = os.path.join(cfg.data.root, cfg.data.train_split)
        if not os.path.isdir(split_dir):
            return None
        names = sorted(d.name for d in os.scandir(split_dir) if d.is_dir())
        return names if len(names) == cfg.model.num_classes else None

    def size_changes(self, default_cfg: dict) -> dict:
        """The crop size and ``crop_pct`` (``resize_short`` follows from it) of ``data.transforms``."""
        return {"data.transforms.crop_size": default_cfg["input_size"][1],
                "data.transforms.crop_pct": default_cfg["crop_pct"]}

    def eval_transforms_changes(self, default_cfg: dict) -> dict:
        return self.preprocess_changes(default_cfg)

    def resolution(self, cfg) -> int:
        return int(cfg.data.transforms.crop_size)

    def analyse(self, out_dir: str, **inputs) -> dict:
        return classification_analysis(out_dir=out_dir, **inputs)


TASKS.register("classification")(Classification())
