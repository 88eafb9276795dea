"""The task plug-in contract.

A task turns the config's task-specific sections into the pieces the generic training and
evaluation paths (``ppdlx.engine.run``) compose: data, model, objective, evaluator, and what
pre-processing, export and the tools need. ``ppdlx.registry.TASKS`` holds one instance per task;
``task_of(cfg)`` picks the one whose ``datasets`` include ``data.dataset``, ``task_of_model`` the one a
model's ``default_cfg["task"]`` names. Nothing outside the plug-ins asks which task a run is: callers
ask the task object.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import ppdlx.data.coco  # noqa: F401  (registers the "coco" dataset)
import ppdlx.data.image_folder  # noqa: F401  (registers "image_folder")
from ppdlx.errors import ConfigError, UnsupportedError
from ppdlx.registry import DATASETS, TASKS


@dataclass
class TaskData:
    train_loader: Any
    val_loader: Any
    num_classes: int


class Task:
    name = ""
    datasets: Tuple[str, ...] = ()          # data.dataset values this task trains on
    graphs: Tuple[str, ...] = ("dynamic",)  # train.graph values it supports
    report_keys: Tuple[str, ...] = ()       # evaluation metrics reported by train/evaluate
    train_extra_keys: Tuple[str, ...] = ()  # more metrics in the training report
    best = ""                               # the metric that picks the "best" checkpoint
    headline: Tuple[str, ...] = ()          # metrics on the CLIs' final line
    eval_headline: Tuple[str, ...] = ()     # ... and on tools/eval.py's
    class_source = ""                       # where the data name its classes (for messages)
    dali_float16_images = False             # its DALI pipeline can hand the model float16 images
    classifies_images = False               # its model maps one image to class scores (an export with one image
                                            # input: what benchmark infer and int8 calibration take)

    # ------------------------------------------------------------------ config
    def validate(self, cfg) -> None:
        """One line for a setting this task cannot train with (called before anything is built)."""
        if cfg.train.graph not in self.graphs:
            raise UnsupportedError(f"train.graph={cfg.train.graph}: {self.name} trains in "
                                   f"{' or '.join(self.graphs)} graph only; set train.graph={self.graphs[0]}")

    # ------------------------------------------------------------------ builders
    def build_data(self, cfg, rank: int, world: int) -> TaskData:
        raise NotImplementedError

    def build_model(self, cfg, num_classes: int):
        raise NotImplementedError

    def prepare_model(self, cfg, model) -> None:
        """Task-specific changes to a built model before weights are loaded into it."""

    def build_objective(self, cfg, model, data: TaskData, world: int):
        """``objective(model, batch, epoch, step) -> (loss, images)``."""
        raise NotImplementedError

    def build_evaluator(self, cfg, model, val_loader, rank: int, world: int):
        """``evaluator(model) -> metrics`` with a ``primary`` metric name (the "best" checkpoint's); it
        runs the float32 weights without autocast, whatever the training's AMP."""
        raise NotImplementedError

    def build_eval_data(self, cfg, rank: int, world: int):
        """``(val loader, num_classes)`` for evaluating ``model.weights`` alone."""
        raise NotImplementedError

    def build_loss(self, cfg, num_classes: int):
        """The criterion a static program traces (``train.graph=static`` only): ``loss(logits, labels)``, or
        ``loss(logits, targets=...)`` with ``targets(labels)`` for mixup."""
        raise UnsupportedError(f"train.graph=static: {self.name} has no static program")

    def start(self, cfg, data: TaskData) -> None:
        """Rank 0, once the run is built: files the task writes next to the checkpoints."""

    def hooks(self, cfg, data: TaskData) -> list:
        """Trainer hooks of this task (every rank), e.g. one whose state every checkpoint must carry."""
        return []

    def saved_class_names(self, cfg, weights):
        """The class names saved with the checkpoint ``weights``, checked against the config's data where it
        exists (one-line ``DataError`` naming what differs); None when the checkpoint carries none."""
        return None

    def describe(self, cfg, data: TaskData) -> str:
        """Extra words for the run's one-line summary (after the parameter count)."""
        return ""

    def export_spec(self, cfg, model) -> dict:
        """What export needs (``ppdlx.export.families``): family, input size, pre/post-processing."""
        raise NotImplementedError

    def evaluation_statistics(self, cfg, model, what: str) -> int:
        """Put into ``model`` the BatchNorm statistics this task's evaluator uses, where they differ from the
        checkpoint's (``what`` names the caller in log lines, e.g. "export"); returns the batches used."""
        return 0

    def class_names_from_data(self, cfg) -> Optional[List[str]]:
        """The class names the configured data give, when they match ``model.num_classes`` (else None)."""
        return None

    # ------------------------------------------------------------------ pre-processing
    def size_changes(self, default_cfg: dict) -> dict:
        """The config's input-size keys as ``default_cfg`` sets them (``Config.replace`` changes)."""
        raise NotImplementedError

    def preprocess_changes(self, default_cfg: dict) -> dict:
        """``Config.replace`` changes that pre-process a model's input as its ``default_cfg`` says: the
        task's size keys (:meth:`size_changes`), then interpolation, mean and std."""
        return {**self.size_changes(default_cfg), "data.transforms.interpolation": default_cfg["interpolation"],
                "data.transforms.mean": list(default_cfg["mean"]), "data.transforms.std": list(default_cfg["std"])}

    def eval_transforms_changes(self, default_cfg: dict) -> dict:
        """:meth:`preprocess_changes` of a model whose pre-processing is ``data.transforms``'s
        resize-shorter-side and centre-crop."""
        raise ConfigError(f"eval transforms from default_cfg: a {self.name} model's pre-processing is "
                          f"{default_cfg['preprocess']}, not resize_short_center_crop")

    def resolution(self, cfg) -> int:
        """The input size the (resolved) config runs the model at."""
        raise NotImplementedError

    def config_at_resolution(self, cfg, model, resolution: int):
        """``cfg`` building a model for ``resolution`` inputs (``cfg`` itself when any size runs)."""
        return cfg

    # ------------------------------------------------------------------ analysis
    def keep_for_analysis(self, evaluator) -> None:
        """Make ``evaluator`` keep what ``analysis_inputs`` reads (e.g. every image's logits)."""

    def analysis_inputs(self, cfg, evaluator):
        """Rank 0: the keyword arguments of :meth:`analyse` for ``evaluator``'s last evaluation, or None when
        the evaluation kept nothing."""
        raise UnsupportedError(f"analysis: the {self.name} task has no per-class analysis")

    def analyse(self, out_dir: str, **inputs) -> dict:
        """The ``ppdlx.analysis`` function of this task: ``analysis.md`` and figures in ``out_dir``."""
        raise UnsupportedError(f"analysis: the {self.name} task has no per-class analysis")

    def write_analysis(self, cfg, evaluator, out_dir: str):
        """Rank 0: ``analysis.md`` and figures in ``out_dir`` for ``evaluator``'s last evaluation; the analysis
        dict, or None when the evaluation kept nothing to analyse."""
        inputs = self.analysis_inputs(cfg, evaluator)
        return None if inputs is None else self.analyse(out_dir=out_dir, **inputs)

    # ------------------------------------------------------------------ reports
    def train_report(self, metrics: dict) -> dict:
        keys = self.report_keys + self.train_extra_keys
        return {k: metrics[k] for k in keys if k in metrics}

    def eval_report(self, metrics: dict) -> dict:
        return {k: metrics[k] for k in self.report_keys}

    @staticmethod
    def format_metrics(report: dict, keys: Sequence[str]) -> str:
        return " ".join(f"{k} {report.get(k, 0.0):.4f}" for k in keys)


def task_of(cfg) -> Task:
    """The task that trains on ``data.dataset`` (an unknown dataset is one line with "did you mean")."""
    return task_of_dataset(cfg.data.dataset)


def task_of_dataset(name: str) -> Task:
    """The task whose ``datasets`` include the ``DATASETS`` entry ``name``."""
    DATASETS.get(name)
    for task_name in TASKS.names():
        task = TASKS.get(task_name)
        if name in task.datasets:
            return task
    raise KeyError(f"no task trains on data.dataset={name}")


def task_of_model(default_cfg: dict) -> Task:
    """The task a model's ``default_cfg["task"]`` names (the one its pre-processing keys describe)."""
    return TASKS.get(default_cfg["task"])
