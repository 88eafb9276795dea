"""The pre-processing keys whose null means "what the model's ``default_cfg`` says".

``data.transforms.{crop_size, resize_short, mean, std, interpolation}`` and ``data.coco.image_size``
default to null; ``ppdlx.tasks.preprocess.resolve_preprocessing`` fills them from the model's
``default_cfg`` (a value the config gives wins). The data pipelines and export read resolved values
only: :func:`require_resolved` is their one-line refusal of a null that was never resolved.
:func:`classification_preprocess` and :func:`detection_preprocess` are the resolved values as the
``preprocess`` section of an export's ``inference.yml`` (what the deploy package applies).
"""
from __future__ import annotations

from typing import Iterable

from ppdlx.errors import ConfigError

# the data.transforms values the classification pipelines read (resize the shorter side, centre-crop);
# detection reads data.coco.image_size (resize the longer side to it, pad) and the normalisation ones
CLASSIFICATION_KEYS = ("crop_size", "resize_short", "interpolation", "mean", "std")
NORMALISATION_KEYS = ("interpolation", "mean", "std")


def require_resolved(section, names: Iterable[str], path: str = "data.transforms") -> None:
    """ConfigError naming the first of ``names`` that ``section`` leaves null."""
    for name in names:
        if getattr(section, name, None) is None:
            raise ConfigError(f"{path}.{name} is null (= the model's default_cfg) and was not resolved: train, "
                              f"eval and export resolve it (ppdlx.tasks.preprocess.resolve_preprocessing); "
                              f"resolve the config first or set {path}.{name}")


def require_detection_resolved(cfg) -> None:
    """:func:`require_resolved` for what the COCO pipelines read."""
    require_resolved(cfg.data.coco, ("image_size",), "data.coco")
    require_resolved(cfg.data.transforms, NORMALISATION_KEYS)


def _normalisation(transforms) -> dict:
    return {"interpolation": transforms.interpolation, "mean": [float(v) for v in transforms.mean],
            "std": [float(v) for v in transforms.std]}


def classification_preprocess(transforms) -> dict:
    """The val transform of ``ppdlx.data.transforms.EvalTransform`` as data: the resolved ``data.transforms``
    the model was evaluated with (``ppdlx.tasks.preprocess``)."""
    require_resolved(transforms, CLASSIFICATION_KEYS)
    return {"type": "resize_short_center_crop", "resize_short": int(transforms.resize_short),
            "crop_size": int(transforms.crop_size), **_normalisation(transforms), "color": "RGB"}


def detection_preprocess(transforms, size: int) -> dict:
    """The COCO eval transform (``ppdlx.data.coco_dataset``) as data: the longer side resized to ``size``
    (the resolved ``data.coco.image_size``), normalised, padded bottom/right with 0 (the mean colour)."""
    require_resolved(transforms, NORMALISATION_KEYS)
    return {"type": "resize_long_pad", "size": int(size), **_normalisation(transforms), "pad_value": 0.0,
            "color": "RGB"}
