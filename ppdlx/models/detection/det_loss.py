"""EfficientDet training loss: focal (classes) + Huber (boxes), automl normalisation.

``loss = cls + box_loss_weight * box`` with
``cls = sum(focal over anchors x classes, ignored anchors masked) / normaliser`` and
``box = sum(Huber(delta) over positive anchors x 4) / (normaliser * 4)``,
``normaliser = total positives in the batch + 1`` (on several devices the trainer should
all-reduce ``num_positives`` first, as the reference does). Weight decay is the trainer's.
"""
from __future__ import annotations

import paddle
import paddle.nn.functional as F

from ppdlx.errors import ConfigError
from ppdlx.models.detection.anchors import DEFAULT_ASPECT_RATIOS, flatten_head_outputs, generate_anchors
from ppdlx.models.detection.target_assigner import IGNORED, HostTargets, assign_targets


def focal_loss(logits, targets, alpha=0.25, gamma=1.5, label_smoothing=0.0):
    """Element-wise sigmoid focal loss (automl ``focal_loss``); ``targets`` are 0/1 floats."""
    # (1 - p_t) == sigmoid(-s * logits) with s = +1 for positives, -1 for negatives:
    # exp(gamma * log_sigmoid(.)) is exact and has finite gradients for gamma < 2.
    sign = 2.0 * targets - 1.0
    modulating = paddle.exp(gamma * F.log_sigmoid(-sign * logits))
    alpha_factor = targets * alpha + (1.0 - targets) * (1.0 - alpha)
    if label_smoothing:
        targets = targets * (1.0 - label_smoothing) + 0.5 * label_smoothing
    ce = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    return alpha_factor * modulating * ce


def huber_loss(pred, target, delta=0.1):
    """Element-wise Huber (Keras): 0.5 x^2 if |x| <= delta else delta * (|x| - 0.5 delta)."""
    err = (pred - target).abs()
    quad = err.clip(max=delta)
    return 0.5 * quad * quad + delta * (err - quad)


class EfficientDetLoss:
    """``loss_fn((cls_outputs, box_outputs), gt_boxes, gt_classes) -> dict``.

    * ``cls_outputs`` / ``box_outputs``: what ``EfficientDet.forward`` returns (lists per level).
    * ``gt_boxes [N, M, 4]`` float in input-image pixels, ``[ymin, xmin, ymax, xmax]``
      (or ``[x1, y1, x2, y2]`` with ``gt_box_format="xyxy"``); ``gt_classes [N, M]`` int with
      0-based class ids and -1 for padding rows.
    * returns ``{"total", "cls", "box"}`` scalar tensors (``total`` is differentiable) and
      ``"num_positives"`` (float tensor, whole batch).
    * ``image_size`` (constructor, or per call) is the network input size the anchors are made for.
    """

    def __init__(self, num_classes, image_size=512, min_level=3, max_level=7, num_scales=3,
                 aspect_ratios=DEFAULT_ASPECT_RATIOS, anchor_scale=4.0, alpha=0.25, gamma=1.5,
                 delta=0.1, box_loss_weight=50.0, matched_threshold=0.5, unmatched_threshold=0.5,
                 label_smoothing=0.0, gt_box_format="yxyx", data_format="NCHW", assign_backend="auto"):
        if gt_box_format not in ("yxyx", "xyxy"):
            raise ValueError(f"gt_box_format must be 'yxyx' or 'xyxy', got {gt_box_format!r}")
        self.num_classes = num_classes
        self.anchor_args = dict(min_level=min_level, max_level=max_level, num_scales=num_scales,
                                aspect_ratios=aspect_ratios, anchor_scale=anchor_scale)
        self.image_size = image_size
        self.alpha, self.gamma, self.delta = alpha, gamma, delta
        self.box_loss_weight = box_loss_weight
        self.matched_threshold, self.unmatched_threshold = matched_threshold, unmatched_threshold
        self.label_smoothing = label_smoothing
        self.gt_box_format = gt_box_format
        self.data_format = data_format
        self.assign_backend = assign_backend  # see target_assigner.assign_targets
        self._anchors = {}

    @classmethod
    def from_model(cls, model, **kwargs):
        """Build with the model's ``num_classes``, ``image_size``, anchor settings and data_format."""
        args = dict(num_classes=model.num_classes, image_size=model.image_size, data_format=model.data_format,
                    **model.anchor_args)
        args.update(kwargs)
        return cls(**args)

    def anchors(self, image_size=None):
        key = image_size or self.image_size
        key = (key, key) if isinstance(key, int) else tuple(key)
        if key not in self._anchors:
            self._anchors[key] = paddle.to_tensor(generate_anchors(key, **self.anchor_args))
        return self._anchors[key]

    def host_targets(self, image_size=None) -> HostTargets:
        """The same assignment on the host (numpy), for the data pipeline (``yxyx`` boxes)."""
        return HostTargets(generate_anchors(image_size or self.image_size, **self.anchor_args),
                           self.matched_threshold, self.unmatched_threshold)

    def __call__(self, outputs, gt_boxes, gt_classes, image_size=None):
        cls_flat, box_flat = self.flatten(outputs)
        cls_targets, box_targets, num_pos = self.assign(gt_boxes, gt_classes, image_size)
        if cls_flat.shape[1] != cls_targets.shape[1]:
            raise ConfigError(f"the heads give {cls_flat.shape[1]} anchors but image_size "
                              f"{image_size or self.image_size} gives {cls_targets.shape[1]}; set the model's "
                              f"image_size to the input size")
        return self.loss_from_targets(cls_flat, box_flat, cls_targets, box_targets, num_pos.sum())

    def flatten(self, outputs):
        """``(cls_outputs, box_outputs)`` lists per level -> ``cls [N, A, C]``, ``box [N, A, 4]``."""
        return flatten_head_outputs(outputs[0], outputs[1], self.num_classes, self.data_format)

    def assign(self, gt_boxes, gt_classes, image_size=None):
        """Padded ground truth -> ``cls_targets [N, A]``, ``box_targets [N, A, 4]``, ``num_positives [N]``.

        With several devices: ``t = loss_fn.assign(...)``, all-reduce ``t[2].sum()`` (mean over
        devices, as the reference), then ``loss_fn.loss_from_targets(*loss_fn.flatten(out), t[0], t[1], n)``.
        """
        if not isinstance(gt_boxes, paddle.Tensor):
            gt_boxes = paddle.to_tensor(gt_boxes, dtype="float32")
        if not isinstance(gt_classes, paddle.Tensor):
            gt_classes = paddle.to_tensor(gt_classes, dtype="int64")
        if self.gt_box_format == "xyxy":
            gt_boxes = paddle.index_select(gt_boxes.astype("float32"), paddle.to_tensor([1, 0, 3, 2]), axis=-1)
        return assign_targets(self.anchors(image_size), gt_boxes, gt_classes, self.matched_threshold,
                              self.unmatched_threshold, self.assign_backend)

    def loss_from_targets(self, cls_flat, box_flat, cls_targets, box_targets, num_positives):
        """Loss from flattened outputs and already assigned targets (e.g. made by the data pipeline)."""
        normaliser = num_positives.astype("float32") + 1.0
        positive = (cls_targets >= 0).astype("float32")
        onehot = F.one_hot(cls_targets.clip(min=0), self.num_classes) * positive.unsqueeze(-1)
        cls_loss = focal_loss(cls_flat, onehot, self.alpha, self.gamma, self.label_smoothing)
        keep = (cls_targets != IGNORED).astype("float32").unsqueeze(-1)
        cls_loss = (cls_loss * keep).sum() / normaliser
        box_loss = (huber_loss(box_flat, box_targets, self.delta) * positive.unsqueeze(-1)).sum()
        box_loss = box_loss / (normaliser * 4.0)
        total = cls_loss + self.box_loss_weight * box_loss
        return {"total": total, "cls": cls_loss, "box": box_loss, "num_positives": num_positives}

