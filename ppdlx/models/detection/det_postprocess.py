"""EfficientDet post-processing: top-k -> decode -> sigmoid -> per-class NMS -> clip to the input -> rescale.

``EfficientDetPostProcess(num_classes, image_size)`` is an ``nn.Layer`` built from paddle
ops only (hard NMS), so an export wrapper can call it after the model inside
``paddle.jit.save``. ``soft_nms`` is the reference's evaluation path (numpy, not exportable).

Outputs (both paths): ``boxes [N, D, 4]`` as ``[x1, y1, x2, y2]`` in original-image pixels,
``scores [N, D]`` (sigmoid, sorted descending), ``classes [N, D]`` int64 0-based (-1 = padding,
padded scores and boxes are 0), ``count [N]`` int32 valid detections; ``D = max_detections``.

The kept boxes are clipped to the network input (``[0, h] x [0, w]`` input pixels) after NMS, before the
rescale, as the TF reference does (effdet clips before its NMS, to the image itself; the exported graph is
given only the input size): an under-trained head decodes boxes far outside the image, which no COCO
score, drawing or consumer of an export can use. After NMS, because boxes clipped before it coincide at
the input's edges, where which one NMS keeps depends on how each runtime orders equal scores; a detection
ONNX graph stops before NMS, and the deploy package clips after its own NMS
(``inference.yml`` ``onnx.nms.clip_to_input_hw``).
"""
from __future__ import annotations

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

from ppdlx.models.detection.anchors import DEFAULT_ASPECT_RATIOS, flatten_head_outputs, generate_anchors, image_hw
from ppdlx.models.detection.box_coder import decode_boxes
from ppdlx.models.detection.nms import multiclass_hard_nms, multiclass_soft_nms_np


class EfficientDetPostProcess(nn.Layer):
    """``forward(cls_outputs, box_outputs, image_scales=None) -> (boxes, scores, classes, count)``.

    ``image_scales [N]``: factor that maps input-image pixels back to original pixels, i.e.
    ``original_size / resized_size`` (= 1 / min(512 / h, 512 / w) for the reference's
    resize-and-pad); ``None`` keeps input-image pixels.
    """

    def __init__(self, num_classes, image_size=512, min_level=3, max_level=7, num_scales=3,
                 aspect_ratios=DEFAULT_ASPECT_RATIOS, anchor_scale=4.0, pre_nms_top_k=5000,
                 max_detections=100, iou_threshold=0.5, score_threshold=0.001, data_format="NCHW"):
        super().__init__()
        self.num_classes = num_classes
        self.pre_nms_top_k = pre_nms_top_k
        self.max_detections = max_detections
        self.iou_threshold = iou_threshold
        self.score_threshold = score_threshold
        self.data_format = data_format
        anchors = generate_anchors(image_size, min_level, max_level, num_scales, aspect_ratios, anchor_scale)
        self.num_anchors = anchors.shape[0]
        self.register_buffer("anchors", paddle.to_tensor(anchors), persistable=False)
        self.input_hw = image_hw(image_size)
        self.register_buffer("input_limits", paddle.to_tensor(list(self.input_hw) * 2, dtype="float32"),
                             persistable=False)

    @classmethod
    def from_model(cls, model, **kwargs):
        """Build with the model's ``num_classes``, ``image_size``, anchor settings and data_format."""
        args = dict(num_classes=model.num_classes, image_size=model.image_size, data_format=model.data_format,
                    **model.anchor_args)
        args.update(kwargs)
        return cls(**args)

    def select_and_decode(self, cls_outputs, box_outputs):
        """Top-k over flattened (anchor x class) logits -> ``boxes [N, K, 4]`` (ymin, xmin, ymax,
        xmax, input pixels), ``scores [N, K]`` (sigmoid, descending), ``classes [N, K]`` int64."""
        cls_flat, box_flat = flatten_head_outputs(cls_outputs, box_outputs, self.num_classes, self.data_format)
        k = min(self.pre_nms_top_k, self.num_anchors * self.num_classes)
        top_logits, top_idx = paddle.topk(cls_flat.reshape([0, -1]), k, axis=1)
        anchor_idx = top_idx // self.num_classes
        classes = top_idx % self.num_classes
        deltas = paddle.take_along_axis(box_flat, anchor_idx.unsqueeze(-1).expand([-1, k, 4]), 1)
        anchors = paddle.gather(self.anchors, anchor_idx.reshape([-1])).reshape([-1, k, 4])
        return decode_boxes(deltas, anchors), F.sigmoid(top_logits), classes

    def _to_original(self, boxes_yxyx, image_scales):
        boxes_yxyx = paddle.minimum(boxes_yxyx.clip(min=0.0), self.input_limits)
        boxes = paddle.stack([boxes_yxyx[..., 1], boxes_yxyx[..., 0], boxes_yxyx[..., 3], boxes_yxyx[..., 2]], -1)
        if image_scales is not None:
            boxes = boxes * image_scales.astype(boxes.dtype).reshape([-1, 1, 1])
        return boxes

    def forward(self, cls_outputs, box_outputs, image_scales=None):
        boxes, scores, classes = self.select_and_decode(cls_outputs, box_outputs)
        boxes, scores, classes, count = multiclass_hard_nms(
            boxes, scores, classes, self.num_classes, self.iou_threshold, self.score_threshold,
            self.max_detections)
        return self._to_original(boxes, image_scales), scores, classes, count

    @paddle.no_grad()
    def soft_nms(self, cls_outputs, box_outputs, image_scales=None, sigma=0.5, score_threshold=0.001):
        """Reference evaluation path: per-class gaussian soft-NMS in numpy; returns numpy arrays
        laid out like ``forward``."""
        boxes, scores, classes = (t.numpy() for t in self.select_and_decode(cls_outputs, box_outputs))
        res = [multiclass_soft_nms_np(b, s, c, self.max_detections, sigma, score_threshold)
               for b, s, c in zip(boxes, scores, classes)]
        out_boxes = np.clip(np.stack([r[0] for r in res]), 0, self.input_hw * 2)[..., [1, 0, 3, 2]]
        if image_scales is not None:
            scales = image_scales.numpy() if isinstance(image_scales, paddle.Tensor) else np.asarray(image_scales)
            out_boxes = out_boxes * scales.reshape(-1, 1, 1).astype(np.float32)
        return (out_boxes.astype(np.float32), np.stack([r[1] for r in res]), np.stack([r[2] for r in res]),
                np.asarray([r[3] for r in res], np.int32))
