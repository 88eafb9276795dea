"""``default_cfg``: what a model expects of its input, for data pipelines, export and deploy.

Every model carries ``model.default_cfg`` (a dict, the timm convention), the values its training
recipes in ``configs/`` use:

* ``task``: ``classification`` or ``detection`` (which pre-processing the other keys describe);
* ``input_size``: ``(3, H, W)``; ``mean`` / ``std``: per RGB channel in 0..255 pixel units
  (ppdlx normalises ``(pixel - mean) / std`` once, in the data pipeline; the model never does);
* ``interpolation``: ``bilinear`` or ``bicubic`` resizing;
* ``crop_pct``: classification evaluation resizes the shorter side to ``floor(H / crop_pct)`` and
  centre-crops ``H``; detection uses the whole image (1.0);
* ``preprocess``: the evaluation pre-processing, named as in ``inference.yml``:
  ``resize_short_center_crop`` (classification) or ``resize_long_pad`` (detection: the longer side is
  resized to ``H``, the image padded bottom/right with ``pad_value`` after normalisation);
* ``classifier``: the structured name of the layer ``reset_classifier`` replaces.
"""
from __future__ import annotations

from ppdlx.errors import ConfigError

IMAGENET_MEAN = (123.675, 116.28, 103.53)  # (0.485, 0.456, 0.406) x 255
IMAGENET_STD = (58.395, 57.12, 57.375)  # (0.229, 0.224, 0.225) x 255


def classification_cfg(image_size: int, crop_pct: float, interpolation: str, classifier: str,
                       mean=IMAGENET_MEAN, std=IMAGENET_STD) -> dict:
    return {"task": "classification", "input_size": (3, int(image_size), int(image_size)), "mean": tuple(mean),
            "std": tuple(std), "interpolation": interpolation, "crop_pct": float(crop_pct),
            "preprocess": "resize_short_center_crop", "classifier": classifier}


def detection_cfg(image_size: int, interpolation: str, classifier: str, mean=IMAGENET_MEAN,
                  std=IMAGENET_STD) -> dict:
    return {"task": "detection", "input_size": (3, int(image_size), int(image_size)), "mean": tuple(mean),
            "std": tuple(std), "interpolation": interpolation, "crop_pct": 1.0, "preprocess": "resize_long_pad",
            "pad_value": 0.0, "classifier": classifier}


def check_num_classes(num_classes) -> int:
    """``num_classes`` for ``reset_classifier``: a positive integer."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ConfigError(f"num_classes must be a positive integer, got {num_classes!r}")
    return num_classes
