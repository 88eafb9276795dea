"""EfficientDet to ONNX: the graph stops before NMS.

paddle2onnx 2.1 converts the Paddle program's ``multiclass_nms3`` into a graph whose outputs have
wrong shapes in onnxruntime, so the detection ONNX file is converted from a second program: the
model, top-k over (anchor x class) logits and box decoding, i.e. the Paddle program up to the
NMS call. It outputs ``candidate_boxes [N, K, 4]`` (x1, y1, x2, y2 in network-input pixels),
``candidate_scores [N, K]`` (sigmoid, descending) and ``candidate_classes [N, K]`` int64, and
``inference.yml`` gets an ``onnx`` section with these outputs and the NMS settings; the deploy
package runs NMS in numpy (``ppdlx_deploy.postprocess.multiclass_nms``, a mirror of Paddle's
kernel), clips the kept boxes to the input and scales them to original pixels. TensorRT (trtexec)
takes the same graph, and its convolution weights are initializers, so a 2:4-pruned model keeps its
pattern.

Candidates whose scores tie (an untrained head scores every anchor alike, a trained one fed random
inputs saturates) may come out of top-k and NMS in a different order in each runtime, so
:func:`check_candidates_close` and :func:`check_detections_close` compare them as sets.
"""
from __future__ import annotations

import os
import shutil
from typing import List, Sequence

import numpy as np
import paddle
import paddle.nn as nn

from ppdlx.export.files import find_model_files
from ppdlx.export.onnx_export import ExportCheckError
from ppdlx.export.paddle_export import INPUT_NAME, image_shape

CANDIDATE_ROLES = ("candidate_boxes", "candidate_scores", "candidate_classes")
SOURCE_DIR = "_onnx_source"


class DetectionCandidates(nn.Layer):
    """``image -> (candidate_boxes xyxy input pixels, candidate_scores, candidate_classes)``."""

    def __init__(self, model: nn.Layer, postprocess: nn.Layer):
        super().__init__()
        self.model = model
        self.postprocess = postprocess

    def forward(self, image):
        cls_outputs, box_outputs = self.model(image)
        boxes, scores, classes = self.postprocess.select_and_decode(cls_outputs, box_outputs)
        boxes = paddle.stack([boxes[..., 1], boxes[..., 0], boxes[..., 3], boxes[..., 2]], -1)
        return boxes, scores, classes


def save_candidates_program(detector: nn.Layer, output_dir: str, image_size: int, data_format: str):
    """The candidates program of ``detector`` (a :class:`ppdlx.export.paddle_export.DetectorForExport`)
    in ``output_dir/_onnx_source``; returns ``(files, layer, inputs)``. The caller removes the folder."""
    layer = DetectionCandidates(detector.model, detector.postprocess)
    layer.eval()
    source = os.path.join(output_dir, SOURCE_DIR)
    shutil.rmtree(source, ignore_errors=True)
    os.makedirs(source)
    spec = [paddle.static.InputSpec(image_shape(data_format, image_size, image_size, None), "float32", INPUT_NAME)]
    paddle.jit.save(layer, os.path.join(source, "inference"), input_spec=spec)
    inputs = [{"name": INPUT_NAME, "shape": image_shape(data_format, image_size, image_size), "dtype": "float32",
               "layout": data_format, "role": "image"}]
    return find_model_files(source), layer, inputs


def onnx_section(output_names: Sequence[str], inputs: List[dict], postprocess) -> dict:
    """``inference.yml``'s ``onnx`` section: the graph's own I/O and the NMS the deploy side runs
    (the arguments ``ppdlx.models.detection.nms.multiclass_hard_nms`` gives the Paddle kernel), and the
    input size the kept boxes are clipped to after it, as the program clips them."""
    return {"inputs": inputs,
            "outputs": [{"name": n, "role": r} for n, r in zip(output_names, CANDIDATE_ROLES)],
            "nms": {"type": "multiclass_nms3", "score_threshold": float(postprocess.score_threshold),
                    "iou_threshold": float(postprocess.iou_threshold),
                    "keep_top_k": int(postprocess.max_detections), "nms_top_k": -1, "normalized": True,
                    "box_coords": "input", "clip_to_input_hw": [int(v) for v in postprocess.input_hw]}}


def _tolerance(reference: np.ndarray, atol: float, rtol: float) -> float:
    finite = reference[np.isfinite(reference)]
    return atol + rtol * (float(np.max(np.abs(finite))) if finite.size else 0.0)


def check_candidates_close(what: str, reference: List[np.ndarray], other: List[np.ndarray], atol: float,
                           rtol: float) -> float:
    """Scores compared in order (top-k values are defined even when their anchors tie); every
    candidate of ``other`` must match one of ``reference`` with the same class, score and box within
    the tolerance, except those scoring within the tolerance of the k-th score (they may have
    swapped with one just outside the top k). Returns the max abs score difference."""
    ref_boxes, ref_scores, ref_classes = reference
    boxes, scores, classes = other
    if boxes.shape != ref_boxes.shape or scores.shape != ref_scores.shape or classes.shape != ref_classes.shape:
        raise ExportCheckError(f"{what}: output shapes {[list(o.shape) for o in other]} differ from the "
                               f"reference's {[list(r.shape) for r in reference]}")
    score_tol, box_tol = _tolerance(ref_scores, atol, rtol), _tolerance(ref_boxes, atol, rtol)
    diff = float(np.max(np.abs(scores.astype(np.float64) - ref_scores))) if scores.size else 0.0
    if not diff <= score_tol:
        raise ExportCheckError(f"{what}: candidate scores differ by {diff:.3g} (tolerance {score_tol:.3g})")
    for row in range(scores.shape[0]):
        cutoff = float(ref_scores[row, -1]) + score_tol
        for j in np.flatnonzero(scores[row] > cutoff):
            same = np.flatnonzero(ref_classes[row] == classes[row, j])
            close = (np.abs(ref_scores[row, same] - scores[row, j]) <= score_tol) & \
                (np.max(np.abs(ref_boxes[row, same] - boxes[row, j]), axis=-1) <= box_tol)
            if not close.any():
                raise ExportCheckError(f"{what}: image {row} candidate {j} (class {int(classes[row, j])}, score "
                                       f"{float(scores[row, j]):.4g}, box {np.round(boxes[row, j], 2).tolist()}) has "
                                       f"no counterpart in the reference within {box_tol:.3g} px")
    return diff




def check_detections_close(what: str, reference: List[np.ndarray], other: List[np.ndarray], atol: float,
                           rtol: float) -> float:
    """The exported program's ``boxes, scores, classes, count`` against the dynamic model's: the
    counts must be equal, the detections are compared as :func:`check_candidates_close` compares
    candidates (random inputs drive a trained head to saturated, tied scores and overflowing boxes,
    whose order NMS leaves to the implementation)."""
    if len(other) != 4 or len(reference) != 4:
        raise ExportCheckError(f"{what}: {len(other)} outputs, expected boxes, scores, classes, count")
    if other[3].shape != reference[3].shape or not np.array_equal(other[3], reference[3]):
        raise ExportCheckError(f"{what}: detections per image {other[3].tolist()} differ from the reference's "
                               f"{reference[3].tolist()}")
    return check_candidates_close(what, reference[:3], other[:3], atol, rtol)
