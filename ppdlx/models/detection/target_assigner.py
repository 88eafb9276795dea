"""Anchor target assignment: IoU similarity + ArgMaxMatcher + box encoding.

ArgMaxMatcher(matched_threshold, unmatched_threshold, negatives_lower_than_unmatched=True,
force_match_for_each_row=True): every anchor takes its best-IoU ground truth; IoU >=
matched_threshold -> positive, < unmatched_threshold -> background (-1), in between ->
ignored (-2; none with the default 0.5/0.5); then each ground truth forces its own best
anchor to be positive (if two ground truths force one anchor, the first one wins).

Inputs use padded ground truth: ``gt_boxes [N, M, 4]`` (ymin, xmin, ymax, xmax) in
input-image pixels and ``gt_classes [N, M]`` with 0-based class ids and -1 padding.
Outputs: ``cls_targets [N, A]`` int64 (class id, -1 background, -2 ignored),
``box_targets [N, A, 4]`` (encoded, zero where not positive), ``num_positives [N]``.
"""
from __future__ import annotations

import numpy as np
import paddle

from ppdlx.models.detection.box_coder import encode_boxes, encode_boxes_np

BACKGROUND = -1
IGNORED = -2


def box_iou(boxes1, boxes2):
    """IoU of ``boxes1 [..., M, 4]`` with ``boxes2 [A, 4]`` -> ``[..., M, A]`` (0 where no overlap)."""
    b1 = boxes1.unsqueeze(-2)
    ymin = paddle.maximum(b1[..., 0], boxes2[:, 0])
    xmin = paddle.maximum(b1[..., 1], boxes2[:, 1])
    ymax = paddle.minimum(b1[..., 2], boxes2[:, 2])
    xmax = paddle.minimum(b1[..., 3], boxes2[:, 3])
    inter = (ymax - ymin).clip(min=0) * (xmax - xmin).clip(min=0)
    area1 = (boxes1[..., 2] - boxes1[..., 0]) * (boxes1[..., 3] - boxes1[..., 1])
    area2 = (boxes2[:, 2] - boxes2[:, 0]) * (boxes2[:, 3] - boxes2[:, 1])
    union = area1.unsqueeze(-1) + area2 - inter
    return paddle.where(inter > 0, inter / union.clip(min=1e-12), paddle.zeros_like(inter))


@paddle.no_grad()
def assign_targets(anchors, gt_boxes, gt_classes, matched_threshold=0.5, unmatched_threshold=0.5):
    """Batched paddle target assignment; see the module docstring for shapes."""
    anchors = paddle.to_tensor(anchors, dtype="float32") if not isinstance(anchors, paddle.Tensor) else anchors
    gt_boxes = gt_boxes.astype("float32")
    gt_classes = gt_classes.astype("int64")
    n, m = gt_classes.shape[0], gt_classes.shape[1]
    num_anchors = anchors.shape[0]
    valid = gt_classes >= 0
    if paddle.in_dynamic_mode() and m > 0:
        # Drop the all-padding tail columns shared by the batch: the IoU matrix is [N, M, A].
        m_used = int(valid.astype("int32").sum(1).max())
        order = paddle.argsort(valid.astype("int32"), axis=1, descending=True, stable=True)
        order = order[:, :max(m_used, 1)]
        gt_boxes = paddle.take_along_axis(gt_boxes, order.unsqueeze(-1).expand([n, order.shape[1], 4]), 1)
        gt_classes = paddle.take_along_axis(gt_classes, order, 1)
        valid = gt_classes >= 0
        m = order.shape[1]
    iou = box_iou(gt_boxes, anchors)  # [N, M, A]
    iou = paddle.where(valid.unsqueeze(-1), iou, paddle.full_like(iou, -1.0))
    max_iou = iou.max(axis=1)  # [N, A]
    match = iou.argmax(axis=1)  # [N, A]
    # Force match: each valid gt row claims its best anchor (lowest row id wins on conflicts).
    best_anchor = iou.argmax(axis=2)  # [N, M]
    rows = paddle.arange(m, dtype="int64").unsqueeze(0).expand([n, m])
    rows = paddle.where(valid, rows, paddle.full_like(rows, m))
    forced_row = paddle.put_along_axis(paddle.full([n, num_anchors], m, dtype="int64"), best_anchor, rows,
                                       axis=1, reduce="amin")
    forced = forced_row < m
    match = paddle.where(forced, forced_row, match)
    positive = forced | (max_iou >= matched_threshold)
    ignored = (~positive) & (max_iou >= unmatched_threshold)
    matched_cls = paddle.take_along_axis(gt_classes, match, 1)
    cls_targets = paddle.where(positive, matched_cls,
                               paddle.where(ignored, paddle.full_like(matched_cls, IGNORED),
                                            paddle.full_like(matched_cls, BACKGROUND)))
    matched_boxes = paddle.take_along_axis(gt_boxes, match.unsqueeze(-1).expand([n, num_anchors, 4]), 1)
    box_targets = encode_boxes(matched_boxes, anchors) * positive.unsqueeze(-1).astype("float32")
    return cls_targets, box_targets, positive.astype("float32").sum(1)


def assign_targets_np(anchors, gt_boxes, gt_classes, matched_threshold=0.5, unmatched_threshold=0.5):
    """One image in numpy (for a data pipeline): ``gt_boxes [M, 4]``, ``gt_classes [M]`` (-1 = padding).

    Returns ``cls_targets [A]`` int64, ``box_targets [A, 4]`` float32, ``num_positives`` int.
    """
    anchors = np.asarray(anchors, np.float32)
    gt_classes = np.asarray(gt_classes, np.int64).reshape(-1)
    keep = gt_classes >= 0
    gt_boxes = np.asarray(gt_boxes, np.float32).reshape(-1, 4)[keep]
    gt_classes = gt_classes[keep]
    num_anchors = anchors.shape[0]
    cls_targets = np.full(num_anchors, BACKGROUND, np.int64)
    box_targets = np.zeros((num_anchors, 4), np.float32)
    if len(gt_classes) == 0:
        return cls_targets, box_targets, 0
    ymin = np.maximum(gt_boxes[:, None, 0], anchors[:, 0])
    xmin = np.maximum(gt_boxes[:, None, 1], anchors[:, 1])
    ymax = np.minimum(gt_boxes[:, None, 2], anchors[:, 2])
    xmax = np.minimum(gt_boxes[:, None, 3], anchors[:, 3])
    inter = np.clip(ymax - ymin, 0, None) * np.clip(xmax - xmin, 0, None)
    area1 = (gt_boxes[:, 2] - gt_boxes[:, 0]) * (gt_boxes[:, 3] - gt_boxes[:, 1])
    area2 = (anchors[:, 2] - anchors[:, 0]) * (anchors[:, 3] - anchors[:, 1])
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = np.where(inter > 0, inter / (area1[:, None] + area2 - inter), 0.0)
    max_iou, match = iou.max(0), iou.argmax(0)
    positive = max_iou >= matched_threshold
    ignored = ~positive & (max_iou >= unmatched_threshold)
    best_anchor = iou.argmax(1)
    for row in range(len(best_anchor) - 1, -1, -1):  # reversed: the lowest row wins
        match[best_anchor[row]] = row
    positive[best_anchor] = True
    ignored[best_anchor] = False
    cls_targets[ignored] = IGNORED
    cls_targets[positive] = gt_classes[match[positive]]
    box_targets[positive] = encode_boxes_np(gt_boxes[match[positive]], anchors[positive])
    return cls_targets, box_targets, int(positive.sum())
