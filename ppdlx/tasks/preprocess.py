"""The pre-processing a run uses: the config's values, else the model's ``default_cfg`` (timm-style).

The pre-processing keys a model's ``default_cfg`` defines (:func:`config_changes`, by the task the
``default_cfg`` names: ``data.transforms`` crop size, ``crop_pct``, interpolation, mean and std;
``data.coco.image_size`` for a detector) are null in the schema. :func:`resolve_preprocessing` is the one
place that fills them, from the ``default_cfg`` of the configured model; a value the config gives wins
(fine-tuning at another size, the 32 px demos). ``resize_short`` given in the config keeps it; otherwise it follows from
``crop_pct`` (the config's, else the model's). Train, eval and export build from the resolved config, so
the data pipelines and ``inference.yml`` see the same values; :func:`resolve_with_record` also says where
each came from (the run's ``plan.yaml``).

A model without a ``default_cfg`` resolves nothing: only what its config gives is set, and a pipeline
that needs a missing value says so (``ppdlx.config.preprocess.require_resolved``).
"""
from __future__ import annotations

from typing import Optional, Tuple

import paddle

from ppdlx.models.from_config import build_model
from ppdlx.tasks.base import task_of_model

CROP_PCT = "data.transforms.crop_pct"
RESIZE_SHORT = "data.transforms.resize_short"


def value_at(cfg, path: str):
    node = cfg
    for key in path.split("."):
        node = getattr(node, key)
    return node


def model_default_cfg(cfg) -> Optional[dict]:
    """``default_cfg`` of the configured model (None if it has none), built under ``paddle.LazyGuard`` (no
    weights are initialised, no random numbers drawn) in a unique-name scope of its own (the parameter
    names of the model the run builds next stay what they would be without this)."""
    with paddle.utils.unique_name.guard(), paddle.LazyGuard():
        model = build_model(cfg)
    return getattr(model, "default_cfg", None)


def config_changes(default_cfg: dict) -> dict:
    """The config values that pre-process a model's input the way its ``default_cfg`` says, as
    ``Config.replace`` changes (:meth:`ppdlx.tasks.base.Task.preprocess_changes` of the model's task)."""
    return task_of_model(default_cfg).preprocess_changes(default_cfg)


def eval_transforms_changes(default_cfg: dict) -> dict:
    """:func:`config_changes` of a classification model (its ``data.transforms``); a detector's is refused."""
    return task_of_model(default_cfg).eval_transforms_changes(default_cfg)


def config_resolution(cfg, default_cfg: dict) -> int:
    """The input size a (resolved) config runs the model at, by the model's task (``default_cfg["task"]``):
    ``data.coco.image_size`` for a detection model, else ``data.transforms.crop_size``."""
    return task_of_model(default_cfg).resolution(cfg)


def resolve_preprocessing(cfg):
    """``cfg`` with its null pre-processing keys taken from the model's ``default_cfg`` (``cfg`` itself when
    nothing is null). Resolving a resolved config changes nothing."""
    return resolve_with_record(cfg)[0]


def resolve_with_record(cfg) -> Tuple[object, dict]:
    """``(resolved cfg, {key: {"value", "source"}})``: the pre-processing the pipelines read (``resize_short``
    rather than the ``crop_pct`` it comes from), each with ``source`` ``config`` (given) or ``default_cfg``.
    A detection model's record has ``data.coco.image_size`` and no ``data.transforms`` sizes."""
    default_cfg = model_default_cfg(cfg)
    if default_cfg is None:
        return cfg, {}
    changes = config_changes(default_cfg)
    fill = {k: v for k, v in changes.items() if value_at(cfg, k) is None}
    if CROP_PCT in fill and value_at(cfg, RESIZE_SHORT) is not None:
        del fill[CROP_PCT]  # resize_short given (or derived from the config's crop_pct): it stays
    resolved = cfg.replace(fill) if fill else cfg
    record = {}
    for key in changes:
        if key == CROP_PCT:
            key, given = RESIZE_SHORT, value_at(cfg, RESIZE_SHORT) is not None or value_at(cfg, CROP_PCT) is not None
        else:
            given = key not in fill
        value = value_at(resolved, key)
        record[key] = {"value": list(value) if isinstance(value, (list, tuple)) else value,
                       "source": "config" if given else "default_cfg"}
    return resolved, record
