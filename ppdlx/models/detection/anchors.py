"""Multi-level anchor boxes (google/automl ``anchors.py`` layout).

Boxes are ``[ymin, xmin, ymax, xmax]`` in input-image pixels. Per level the order is
(y, x, anchor) with the 9 anchors of a location ordered octave-major then aspect ratio,
which is also the channel order of the heads (channel = anchor * C + class). Levels are
concatenated from ``min_level`` to ``max_level``: 49,104 anchors at 512x512.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Sequence, Tuple

import numpy as np
import paddle

DEFAULT_ASPECT_RATIOS = ((1.0, 1.0), (1.4, 0.7), (0.7, 1.4))  # (x, y) multipliers of the base size


def image_hw(image_size) -> Tuple[int, int]:
    if isinstance(image_size, int):
        return image_size, image_size
    h, w = image_size
    return int(h), int(w)


def feature_sizes(image_size, max_level: int = 7):
    """``[(h, w)]`` for levels 0..max_level, each level ``(s - 1) // 2 + 1`` of the previous."""
    h, w = image_hw(image_size)
    sizes = [(h, w)]
    for _ in range(max_level):
        h, w = (h - 1) // 2 + 1, (w - 1) // 2 + 1
        sizes.append((h, w))
    return sizes


def num_anchors_per_location(num_scales: int = 3, aspect_ratios: Sequence = DEFAULT_ASPECT_RATIOS) -> int:
    return num_scales * len(aspect_ratios)


def generate_anchors(image_size=512, min_level: int = 3, max_level: int = 7, num_scales: int = 3,
                     aspect_ratios: Sequence = DEFAULT_ASPECT_RATIOS, anchor_scale: float = 4.0) -> np.ndarray:
    """All anchors as a float32 array ``[num_anchors, 4]`` (ymin, xmin, ymax, xmax)."""
    return _generate(image_hw(image_size), min_level, max_level, num_scales,
                     tuple(tuple(float(v) for v in a) for a in aspect_ratios), float(anchor_scale)).copy()


@lru_cache(maxsize=16)
def _generate(hw, min_level, max_level, num_scales, aspect_ratios, anchor_scale):
    sizes = feature_sizes(hw, max_level)
    out = []
    for level in range(min_level, max_level + 1):
        fh, fw = sizes[level]
        stride_y, stride_x = hw[0] / fh, hw[1] / fw
        cy = stride_y / 2 + np.arange(fh) * stride_y
        cx = stride_x / 2 + np.arange(fw) * stride_x
        cx, cy = np.meshgrid(cx, cy)  # [fh, fw], row-major over (y, x)
        half = []
        for octave in range(num_scales):
            for ax, ay in aspect_ratios:
                base_y = anchor_scale * stride_y * 2 ** (octave / num_scales)
                base_x = anchor_scale * stride_x * 2 ** (octave / num_scales)
                half.append((base_y * ay / 2.0, base_x * ax / 2.0))
        half = np.asarray(half)  # [A, 2]
        cy, cx = cy.reshape(-1, 1), cx.reshape(-1, 1)
        boxes = np.stack([cy - half[:, 0], cx - half[:, 1], cy + half[:, 0], cx + half[:, 1]], axis=-1)
        out.append(boxes.reshape(-1, 4))
    return np.concatenate(out, 0).astype(np.float32)


def flatten_head_outputs(cls_outputs, box_outputs, num_classes, data_format="NCHW"):
    """Per-level head maps -> ``cls [N, A_total, C]``, ``box [N, A_total, 4]`` in anchor order."""
    def flat(outs, last):
        res = []
        for o in outs:
            if data_format == "NCHW":
                o = o.transpose([0, 2, 3, 1])
            res.append(o.reshape([0, -1, last]))  # 0: keep the (maybe dynamic) batch dim
        return paddle.concat(res, axis=1)

    return flat(cls_outputs, num_classes), flat(box_outputs, 4)
