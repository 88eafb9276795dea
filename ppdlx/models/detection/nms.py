"""Non-maximum suppression: batched per-class hard NMS in paddle ops (exportable) and the
reference's per-class numpy soft-NMS (gaussian) for evaluation."""
from __future__ import annotations

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import _C_ops


def multiclass_hard_nms(boxes, scores, classes, num_classes, iou_threshold=0.5, score_threshold=0.001,
                        max_detections=100):
    """Per-class hard NMS for a batch, paddle ops only (works inside ``paddle.jit.save``).

    ``boxes [N, K, 4]`` (any corner order, IoU is symmetric), ``scores [N, K]`` in [0, 1],
    ``classes [N, K]`` int. Candidates with ``score <= score_threshold`` are dropped.
    Returns ``boxes [N, D, 4]``, ``scores [N, D]``, ``classes [N, D]`` int64, sorted by score,
    padded with zeros / class -1, and ``count [N]`` int32 (D = ``max_detections``).
    """
    # multiclass_nms3 wants one score row per class: zero everywhere but the box's own class
    # (zeros fall below the threshold and never become candidates of another class).
    per_class = F.one_hot(classes.astype("int64"), num_classes) * scores.unsqueeze(-1)
    per_class = per_class.transpose([0, 2, 1])  # [N, C, K]
    out, _, count = _C_ops.multiclass_nms3(boxes, per_class, None, float(score_threshold), -1,
                                           int(max_detections), float(iou_threshold), True, 1.0, -1)
    # out: [sum(count), 6] rows (label, score, 4 coords), grouped per image -> pad to [N, D, 6].
    count = count.astype("int64")
    start = paddle.cumsum(count) - count
    slots = paddle.arange(max_detections, dtype="int64")
    valid = slots.unsqueeze(0) < count.unsqueeze(1)
    # Padding row (label -1, score -1, box 0), built from `full`: a `to_tensor` constant becomes an
    # assign_value op whose double-array attribute the oneDNN inference executor rejects.
    dummy = paddle.concat([paddle.full([1, 2], -1.0, out.dtype), paddle.zeros([1, 4], out.dtype)], axis=1)
    table = paddle.concat([out.reshape([-1, 6]), dummy], axis=0)
    dummy_idx = paddle.shape(table)[0].astype("int64") - 1  # last row; dynamic under jit too
    idx = paddle.where(valid, start.unsqueeze(1) + slots.unsqueeze(0),
                       paddle.zeros_like(valid, dtype="int64") + dummy_idx)
    det = paddle.gather(table, idx.reshape([-1])).reshape([-1, max_detections, 6])
    order = paddle.argsort(det[:, :, 1], axis=1, descending=True, stable=True)  # padding score -1 last
    det = paddle.take_along_axis(det, order.unsqueeze(-1).expand([-1, max_detections, 6]), 1)
    valid_f = valid.astype(out.dtype)  # after the sort the valid rows are the first count[i]
    return (det[:, :, 2:] * valid_f.unsqueeze(-1), det[:, :, 1] * valid_f,
            det[:, :, 0].astype("int64"), count.astype("int32"))


def soft_nms_np(boxes, scores, sigma=0.5, score_threshold=0.001, method="gaussian", iou_threshold=0.3):
    """automl ``nms_np.soft_nms`` for one class (areas with the +1 pixel convention).

    ``method``: "gaussian" (weight exp(-iou^2 / sigma)), "linear" or "hard".
    Returns the retained ``boxes [R, 4]`` and their decayed ``scores [R]``, in selection order.
    """
    dets = np.concatenate([np.asarray(boxes, np.float64).reshape(-1, 4),
                           np.asarray(scores, np.float64).reshape(-1, 1)], axis=1)
    areas = (dets[:, 2] - dets[:, 0] + 1) * (dets[:, 3] - dets[:, 1] + 1)
    dets = np.concatenate([dets, areas[:, None]], axis=1)
    kept = []
    while dets.shape[0] > 0:
        top = int(np.argmax(dets[:, 4]))
        dets[[0, top]] = dets[[top, 0]]
        kept.append(dets[0, :5].copy())
        rest = dets[1:]
        inter = (np.maximum(np.minimum(dets[0, 2], rest[:, 2]) - np.maximum(dets[0, 0], rest[:, 0]) + 1, 0)
                 * np.maximum(np.minimum(dets[0, 3], rest[:, 3]) - np.maximum(dets[0, 1], rest[:, 1]) + 1, 0))
        iou = inter / (dets[0, 5] + rest[:, 5] - inter)
        if method == "gaussian":
            weight = np.exp(-(iou * iou) / sigma)
        elif method == "linear":
            weight = np.where(iou > iou_threshold, 1.0 - iou, 1.0)
        else:
            weight = np.where(iou > iou_threshold, 0.0, 1.0)
        rest[:, 4] *= weight
        dets = rest[rest[:, 4] >= score_threshold]
    kept = np.asarray(kept, np.float64).reshape(-1, 5)
    return kept[:, :4].astype(np.float32), kept[:, 4].astype(np.float32)


def multiclass_soft_nms_np(boxes, scores, classes, max_detections=100, sigma=0.5, score_threshold=0.001):
    """Per-class soft-NMS for one image (numpy); same return layout as ``multiclass_hard_nms``
    without the batch dim: ``boxes [D, 4]``, ``scores [D]``, ``classes [D]``, ``count``.

    Candidates already below ``score_threshold`` are dropped first (the reference would keep
    the best of such a class with its tiny score; no effect on mAP worth the clutter).
    """
    keep = np.asarray(scores) >= score_threshold
    boxes, scores, classes = np.asarray(boxes)[keep], np.asarray(scores)[keep], np.asarray(classes)[keep]
    out_b, out_s, out_c = [], [], []
    for c in np.unique(classes):
        sel = classes == c
        b, s = soft_nms_np(boxes[sel], scores[sel], sigma=sigma, score_threshold=score_threshold)
        out_b.append(b)
        out_s.append(s)
        out_c.append(np.full(len(s), c, np.int64))
    res_b = np.zeros((max_detections, 4), np.float32)
    res_s = np.zeros(max_detections, np.float32)
    res_c = np.full(max_detections, -1, np.int64)
    if not out_s:
        return res_b, res_s, res_c, 0
    b, s, c = np.concatenate(out_b), np.concatenate(out_s), np.concatenate(out_c)
    order = np.argsort(-s, kind="stable")[:max_detections]
    n = len(order)
    res_b[:n], res_s[:n], res_c[:n] = b[order], s[order], c[order]
    return res_b, res_s, res_c, n
