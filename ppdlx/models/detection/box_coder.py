"""FasterRcnnBoxCoder without scale factors: ``[ty, tx, th, tw]`` relative to anchors.

ty = (yc - yca) / ha, tx = (xc - xca) / wa, th = log(h / ha), tw = log(w / wa); all
boxes ``[ymin, xmin, ymax, xmax]``. Works on paddle tensors with any leading dims
(anchors broadcast against boxes); the ``*_np`` twins do the same in numpy.
"""
from __future__ import annotations

import numpy as np
import paddle

EPS = 1e-8  # added to the sizes when encoding, as in the TF object-detection box coder


def _center_size(b, eps=0.0):
    ymin, xmin, ymax, xmax = (b[..., i] for i in range(4))
    return (ymin + ymax) / 2, (xmin + xmax) / 2, ymax - ymin + eps, xmax - xmin + eps


def _encode(boxes, anchors, lib):
    yc, xc, h, w = _center_size(boxes, EPS)
    yca, xca, ha, wa = _center_size(anchors, EPS)
    return lib.stack([(yc - yca) / ha, (xc - xca) / wa, lib.log(h / ha), lib.log(w / wa)], axis=-1)


def _decode(rel, anchors, lib):
    yca, xca, ha, wa = _center_size(anchors)
    ty, tx, th, tw = (rel[..., i] for i in range(4))
    h, w = lib.exp(th) * ha, lib.exp(tw) * wa
    yc, xc = ty * ha + yca, tx * wa + xca
    return lib.stack([yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2], axis=-1)


def encode_boxes(boxes: paddle.Tensor, anchors: paddle.Tensor) -> paddle.Tensor:
    return _encode(boxes, anchors, paddle)


def decode_boxes(rel_codes: paddle.Tensor, anchors: paddle.Tensor) -> paddle.Tensor:
    return _decode(rel_codes, anchors, paddle)


def encode_boxes_np(boxes: np.ndarray, anchors: np.ndarray) -> np.ndarray:
    return _encode(np.asarray(boxes, np.float32), np.asarray(anchors, np.float32), np).astype(np.float32)


def decode_boxes_np(rel_codes: np.ndarray, anchors: np.ndarray) -> np.ndarray:
    return _decode(np.asarray(rel_codes, np.float32), np.asarray(anchors, np.float32), np).astype(np.float32)
