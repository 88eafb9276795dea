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
    h = (paddle.minimum(boxes1[..., 2:3], boxes2[:, 2]) - paddle.maximum(boxes1[..., 0:1], boxes2[:, 0])).clip(min=0)
    w = (paddle.minimum(boxes1[..., 3:4], boxes2[:, 3]) - paddle.maximum(boxes1[..., 1:2], boxes2[:, 1])).clip(min=0)
    inter = h * w
    area1 = (boxes1[..., 2] - boxes1[..., 0]) * (boxes1[..., 3] - boxes1[..., 1])
    area2 = (boxes2[:, 2] - boxes2[:, 0]) * (boxes2[:, 3] - boxes2[:, 1])
    return inter / (area1.unsqueeze(-1) + area2 - inter).clip(min=1e-12)


@paddle.no_grad()
def assign_targets(anchors, gt_boxes, gt_classes, matched_threshold=0.5, unmatched_threshold=0.5,
                   backend="auto"):
    """Target assignment for a padded batch (paddle tensors in and out; shapes in the module doc).

    Loops over the images so that each IoU matrix only holds that image's real boxes
    (``[M_i, A]``). ``backend``: "paddle" (vectorised paddle ops), "numpy" (``assign_targets_np``
    per image) or "auto" = numpy for CPU tensors (paddle's broadcasting min/max kernels are ~5x
    slower than numpy on CPU), paddle otherwise. Both give identical targets. Needs dygraph.
    """
    if backend not in ("auto", "paddle", "numpy"):
        raise ValueError(f"backend must be auto, paddle or numpy, got {backend!r}")
    if not isinstance(anchors, paddle.Tensor):
        anchors = paddle.to_tensor(anchors, dtype="float32")
    gt_boxes = gt_boxes.astype("float32")
    gt_classes = gt_classes.astype("int64")
    if backend == "numpy" or (backend == "auto" and gt_boxes.place.is_cpu_place()):
        host = HostTargets(anchors.numpy(), matched_threshold, unmatched_threshold)
        return tuple(paddle.to_tensor(t) for t in host(gt_boxes.numpy(), gt_classes.numpy()))
    outs = [_assign_one(anchors, gt_boxes[i], gt_classes[i], matched_threshold, unmatched_threshold)
            for i in range(gt_classes.shape[0])]
    return tuple(paddle.stack(t) for t in zip(*outs))


def _assign_one(anchors, boxes, classes, matched_threshold, unmatched_threshold):
    num_anchors = anchors.shape[0]
    keep = paddle.nonzero(classes >= 0).flatten()
    m = keep.shape[0]
    if m == 0:
        return (paddle.full([num_anchors], BACKGROUND, "int64"), paddle.zeros([num_anchors, 4]),
                paddle.zeros([], "float32"))
    boxes, classes = paddle.gather(boxes, keep), paddle.gather(classes, keep)
    iou = box_iou(boxes, anchors)  # [M, A]
    max_iou, match = iou.max(axis=0), iou.argmax(axis=0)
    # Force match: each gt claims its best anchor; on conflicts the lowest gt index wins.
    forced_row = paddle.put_along_axis(paddle.full([num_anchors], m, "int64"), iou.argmax(axis=1),
                                       paddle.arange(m, dtype="int64"), axis=0, reduce="amin")
    forced = forced_row < m
    match = paddle.where(forced, forced_row, match)
    positive = forced | (max_iou >= matched_threshold)
    ignored = (~positive) & (max_iou >= unmatched_threshold)
    matched_cls = paddle.gather(classes, match)
    cls_targets = paddle.where(positive, matched_cls,
                               paddle.where(ignored, paddle.full_like(matched_cls, IGNORED),
                                            paddle.full_like(matched_cls, BACKGROUND)))
    box_targets = encode_boxes(paddle.gather(boxes, match), anchors) * positive.unsqueeze(-1).astype("float32")
    return cls_targets, box_targets, positive.astype("float32").sum()


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


class HostTargets:
    """``assign_targets_np`` over a padded batch, for a data pipeline: ``(gt_boxes [N, M, 4], gt_classes [N, M])``
    numpy -> ``(cls_targets [N, A] int64, box_targets [N, A, 4] float32, num_positives [N] float32)``.

    The boxes are host data in the loader already: assigned there (in the paddle.io workers, or on the DALI
    loader's host side), a GPU step has no per-image ``nonzero`` whose length it must read back.
    """

    def __init__(self, anchors, matched_threshold=0.5, unmatched_threshold=0.5):
        self.anchors = np.asarray(anchors, np.float32)
        self.matched_threshold, self.unmatched_threshold = matched_threshold, unmatched_threshold

    def __call__(self, gt_boxes, gt_classes):
        outs = [assign_targets_np(self.anchors, boxes, classes, self.matched_threshold, self.unmatched_threshold)
                for boxes, classes in zip(gt_boxes, gt_classes)]
        return (np.stack([o[0] for o in outs]), np.stack([o[1] for o in outs]),
                np.asarray([o[2] for o in outs], np.float32))
