"""The detection geometry both COCO loaders share (the reference's automl ``InputProcessor``).

* train (``data.transforms.random``): scale jitter ``r ~ U(scale_range)``; the image is resized
  to fit ``r * S`` (``image_scale = min(rS/h, rS/w)``), a random ``S x S`` window of it is taken
  (offset uniform over the part larger than S) and the rest padded bottom/right.
* eval (and train with ``random: false``): resize so the longer side is S, keep the aspect
  ratio, pad bottom/right; ``image_scale = original / resized`` (what post-processing wants).

Boxes follow the image (scaled, shifted, clipped to the window, dropped when empty) and are
padded to a fixed ``max_instances`` as yxyx with class -1.
"""
from __future__ import annotations

import logging

import numpy as np
# eval: the deploy package's resize (deploy cannot import ppdlx), so exports pre-process as evaluation does
from ppdlx_deploy.preprocess import resize_long_size as eval_size  # noqa: F401 (ppdlx's name for it)

log = logging.getLogger("ppdlx.data")


def train_window(width, height, size, scale_range, rng):
    """The reference's random scale + crop: ``(scaled_w, scaled_h, offset_x, offset_y)`` (ints)."""
    r = rng.uniform(scale_range[0], scale_range[1])
    target = int(r * size)
    scale = min(target / height, target / width)
    sw, sh = max(1, int(width * scale)), max(1, int(height * scale))
    ox = int(max(0, sw - size) * rng.uniform(0.0, 1.0))
    oy = int(max(0, sh - size) * rng.uniform(0.0, 1.0))
    return sw, sh, ox, oy


def record_boxes(rec, skip_crowd: bool, flip_width=None):
    """A ``CocoIndex`` record's xyxy boxes and labels, crowd boxes left out when ``skip_crowd``, mirrored
    over an image ``flip_width`` wide when it is given (the image was flipped horizontally)."""
    boxes, labels = rec["boxes"], rec["labels"]
    if skip_crowd:
        boxes, labels = boxes[~rec["crowd"]], labels[~rec["crowd"]]
    if flip_width is not None and len(boxes):
        boxes = np.stack([flip_width - boxes[:, 2], boxes[:, 1], flip_width - boxes[:, 0], boxes[:, 3]], 1)
    return boxes, labels


def transform_boxes(boxes_xyxy, fx, fy, ox, oy, size):
    """Scale by (fx, fy), shift by (-ox, -oy), clip to [0, size], drop empty boxes.
    Returns ``(boxes xyxy, keep mask)``."""
    b = boxes_xyxy.astype(np.float32) * np.asarray([fx, fy, fx, fy], np.float32)
    b = b - np.asarray([ox, oy, ox, oy], np.float32)
    b = np.clip(b, 0.0, float(size))
    keep = ((b[:, 2] - b[:, 0]) > 0) & ((b[:, 3] - b[:, 1]) > 0)
    return b, keep


def pad_targets(boxes_xyxy, labels, max_instances):
    """xyxy boxes + labels -> fixed ``[max, 4]`` yxyx and ``[max]`` int64 with -1 padding."""
    out_b = np.zeros((max_instances, 4), np.float32)
    out_c = np.full((max_instances,), -1, np.int64)
    n = min(len(labels), max_instances)
    if n:
        out_b[:n] = boxes_xyxy[:n][:, [1, 0, 3, 2]]
        out_c[:n] = labels[:n]
    return out_b, out_c


def report_capped_boxes(index, max_instances: int, skip_crowd: bool) -> int:
    """One warning line when images of a training split hold more boxes than ``max_instances``, the fixed number
    a sample carries (:func:`pad_targets` keeps the first ones, the others are never trained on); returns how
    many images are capped."""
    counts = [(int(len(r["labels"]) - (r["crowd"].sum() if skip_crowd else 0)), r) for r in index.records]
    capped = [(n, r) for n, r in counts if n > max_instances]
    if capped:
        most, rec = max(capped, key=lambda c: c[0])
        log.warning("%s: %d training image(s) hold more than data.coco.max_instances=%d boxes (up to %d, in image id "
                    "%d (%s)); a sample carries at most %d: raise data.coco.max_instances to train on "
                    "all", index.json_path, len(capped), max_instances, most, rec["id"], rec["file"], max_instances)
    return len(capped)
