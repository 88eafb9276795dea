"""The task plug-in contract.

A task turns the config's task-specific sections into the pieces the generic training and
evaluation paths (``ppdlx.engine.run``) compose: data, model, objective, evaluator, and what
export needs. ``ppdlx.registry.TASKS`` holds one instance per task; ``task_of(cfg)`` picks the
one whose ``datasets`` include ``data.dataset``. Nothing outside the plug-ins asks which task a
run is.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence, Tuple

from ppdlx.errors import UnsupportedError


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
    analysis = ""                           # its ppdlx.analysis function (``analysis_inputs`` are its arguments)

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

    def program_spec(self, cfg, num_classes: int):
        """A :class:`ppdlx.engine.static.program.ProgramSpec` (``train.graph=static`` only)."""
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

    def keep_for_analysis(self, evaluator) -> None:
        """Make ``evaluator`` keep what ``analysis_inputs`` reads (e.g. every image's logits)."""

    def analysis_inputs(self, cfg, evaluator):
        """Rank 0: the keyword arguments of this task's ``ppdlx.analysis`` function for ``evaluator``'s last
        evaluation (``ppdlx.engine.analysis`` calls it), or None when the evaluation kept nothing."""
        raise UnsupportedError(f"analysis: the {self.name} task has no per-class analysis")

    # ------------------------------------------------------------------ reports
    def train_report(self, metrics: dict) -> dict:
        keys = self.report_keys + self.train_extra_keys
        return {k: metrics[k] for k in keys if k in metrics}

    def eval_report(self, metrics: dict) -> dict:
        return {k: metrics[k] for k in self.report_keys}

    @staticmethod
    def format_metrics(report: dict, keys: Sequence[str]) -> str:
        return " ".join(f"{k} {report.get(k, 0.0):.4f}" for k in keys)
