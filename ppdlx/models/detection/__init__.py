"""Anchor-based detection pieces shared by the EfficientDet family: anchors, box coder,
target assignment, loss and post-processing (exported with the model)."""
from ppdlx.models.detection.anchors import (DEFAULT_ASPECT_RATIOS, feature_sizes, flatten_head_outputs,  # noqa: F401
                                            generate_anchors)
from ppdlx.models.detection.box_coder import decode_boxes, decode_boxes_np, encode_boxes, encode_boxes_np  # noqa: F401
from ppdlx.models.detection.det_loss import EfficientDetLoss, focal_loss, huber_loss  # noqa: F401
from ppdlx.models.detection.det_postprocess import EfficientDetPostProcess  # noqa: F401
from ppdlx.models.detection.nms import multiclass_hard_nms, multiclass_soft_nms_np, soft_nms_np  # noqa: F401
from ppdlx.models.detection.target_assigner import HostTargets, assign_targets, assign_targets_np, box_iou  # noqa: F401
