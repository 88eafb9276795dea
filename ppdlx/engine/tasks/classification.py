"""The classification task (``data.dataset: image_folder``): top-1/top-5, label-smoothed
cross-entropy with mixup, knowledge distillation, every graph mode. Every checkpoint carries the
training class list, which evaluation, resume and export check against the class folders
(``class_list``)."""
from __future__ import annotations

import os

from ppdlx.data.loader import build_classification_loader
from ppdlx.data.mixing import MixSpec
from ppdlx.engine.amp import build_scaler
from ppdlx.engine.builders import build_model
from ppdlx.engine.evaluator import ClassificationEvaluator
from ppdlx.engine.objectives import ClassificationObjective
from ppdlx.engine.tasks.base import Task, TaskData
from ppdlx.engine.tasks.class_list import ClassList, check_eval_classes, checked_class_names
from ppdlx.errors import ConfigError, UnsupportedError
from ppdlx.losses import build_loss
from ppdlx.optim import param_groups
from ppdlx.registry import OPTIMIZERS, TASKS


def classes_of(loader):
    """The class folder names a loader reads (None for synthetic data)."""
    if getattr(loader, "classes", None) is not None:
        return loader.classes
    return getattr(getattr(loader, "dataset", None), "classes", None)


def optimizer_groups(cfg, model):
    """``ppdlx.optim.param_groups`` for this config."""
    return param_groups(model, cfg.optimizer.weight_decay, cfg.optimizer.decay_params)


class Classification(Task):
    name = "classification"
    datasets = ("image_folder",)
    graphs = ("dynamic", "to_static", "static")
    report_keys = ("top1", "top5", "images", "seconds")
    train_extra_keys = ("loss",)
    best = "top1"
    analysis = "classification_analysis"
    headline = eval_headline = ("top1", "top5")

    def validate(self, cfg) -> None:
        super().validate(cfg)
        if cfg.train.graph == "static" and cfg.distill.enabled:
            raise UnsupportedError("train.graph=static does not support distill.enabled (the teacher runs in the "
                                   "dynamic objective); use train.graph=dynamic")

    def build_data(self, cfg, rank: int, world: int) -> TaskData:
        train_cfg = cfg
        if cfg.distill.enabled:  # training batches at the teacher's resolution (ppdlx.engine.distill)
            from ppdlx.engine.distill import teacher_data_config
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
            from ppdlx.engine.distill import build_distillation_objective
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

    def program_spec(self, cfg, num_classes: int):
        from ppdlx.engine.static.program import ProgramSpec
        return ProgramSpec(
            build_model=lambda: build_model(cfg), build_loss=lambda: build_loss(cfg, num_classes),
            param_groups=lambda model: optimizer_groups(cfg, model),
            build_optimizer=lambda lr, params, multi_precision: OPTIMIZERS.build(
                cfg.optimizer.name, lr=lr, groups=params, cfg=cfg, multi_precision=multi_precision),
            data_format=cfg.model.data_format, accumulate=cfg.train.accumulate, mix=MixSpec.of(cfg.train).enabled,
            ema=cfg.ema.enabled, build_scaler=lambda amp: build_scaler(amp, cfg.amp))

    def export_spec(self, cfg, model) -> dict:
        from ppdlx.export.families import classification_export_spec
        return classification_export_spec(cfg.data.transforms, cfg.export.output,
                                          int(getattr(model, "num_classes", cfg.model.num_classes)))


TASKS.register("classification")(Classification())
