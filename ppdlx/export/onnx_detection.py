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


def save_candidates_program(detector: nn.Layer, output_dir: str, image_size: int, data_format: str,
                            save: bool = True):
    """The candidates program of ``detector`` (a :class:`ppdlx.export.paddle_export.DetectorForExport`)
    in ``output_dir/_onnx_source``; returns ``(files, layer, inputs)`` (``files`` None with ``save=False``:
    the layer and its inputs only). The caller removes the folder."""
    layer = DetectionCandidates(detector.model, detector.postprocess)
    layer.eval()
    inputs = [{"name": INPUT_NAME, "shape": image_shape(data_format, image_size, image_size), "dtype": "float32",
               "layout": data_format, "role": "image"}]
    if not save:
        return None, layer, inputs
    source = os.path.join(output_dir, SOURCE_DIR)
    shutil.rmtree(source, ignore_errors=True)
    os.makedirs(source)
    spec = [paddle.static.InputSpec(image_shape(data_format, image_size, image_size, None), "float32", INPUT_NAME)]
    paddle.jit.save(layer, os.path.join(source, "inference"), input_spec=spec)
    return find_model_files(source), layer, inputs


def integer_topk_index_division(onnx_file: str) -> int:
    """Rewrite paddle2onnx's floor division of top-k indices into one integer ``Div``; returns how many.

    paddle2onnx 2.1 converts every integer ``//`` through float (``Cast``, ``Div``, ``Floor``, ``Cast``
    back). A candidate's anchor (its top-k index // num_classes) goes up to anchors x classes, 3.9
    million at 512 px: exact in float32, but an engine built with ``trtexec --fp16`` may run that
    ``Div`` in float16, exact to 2048 and infinite above 65504, and gather the wrong anchors. Top-k
    indices are >= 0, where ONNX's truncating integer ``Div`` is the floor."""
    import onnx  # optional (ppdlx[onnx]): only an ONNX export gets here
    from onnx import helper, numpy_helper  # optional, as above
    model = onnx.load(onnx_file)
    graph = model.graph
    producers = {out: node for node in graph.node for out in node.output}
    consumers = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    initializers = {t.name: t for t in graph.initializer}

    def only_consumer(name, op_type):
        nodes = consumers.get(name, [])
        return nodes[0] if len(nodes) == 1 and nodes[0].op_type == op_type else None

    def constant(name):
        node = producers.get(name)
        if node is not None and node.op_type == "Cast":
            name = node.input[0]
        return numpy_helper.to_array(initializers[name]) if name in initializers else None

    integers = (onnx.TensorProto.INT64, onnx.TensorProto.INT32)
    rewritten = []
    indices = [node.output[1] for node in graph.node if node.op_type == "TopK"]
    for name in indices:  # the indices and their Identity copies
        indices += [n.output[0] for n in consumers.get(name, []) if n.op_type == "Identity"]
    for to_float in [node for node in graph.node if node.op_type == "Cast" and node.input[0] in indices]:
        for div in [n for n in consumers.get(to_float.output[0], []) if n.op_type == "Div"]:
            divisor = constant(div.input[1])
            floor = only_consumer(div.output[0], "Floor")
            back = floor and only_consumer(floor.output[0], "Cast")
            if (div.input[0] != to_float.output[0] or divisor is None or divisor.size != 1
                    or float(divisor.reshape(-1)[0]) != int(divisor.reshape(-1)[0]) or not back
                    or helper.get_attribute_value(back.attribute[0]) not in integers):
                continue
            name = f"{div.name}_integer_divisor"
            graph.initializer.append(numpy_helper.from_array(divisor.reshape(-1)[:1].astype(np.int64), name))
            division = helper.make_node("Div", [to_float.input[0], name], [f"{div.output[0]}_integer"],
                                        name=f"{div.name}_integer")
            back.input[0] = division.output[0]  # the cast back to an integer now reads the integer quotient
            rewritten.append((div, floor, division))
    for div, floor, division in rewritten:
        graph.node.insert(list(graph.node).index(div), division)
        graph.node.remove(div)
        graph.node.remove(floor)
    if rewritten:
        used = {name for node in graph.node for name in node.input} | {out.name for out in graph.output}
        for node in [n for n in graph.node if n.op_type == "Cast" and not set(n.output) & used]:
            graph.node.remove(node)
        onnx.checker.check_model(model)
        onnx.save(model, onnx_file)
    return len(rewritten)


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


def _tolerance(reference: np.ndarray, atol: float, rtol: float, scale: float = 0.0) -> float:
    """``atol + rtol * max(scale, max|reference|)``."""
    finite = reference[np.isfinite(reference)]
    return atol + rtol * max(scale, float(np.max(np.abs(finite))) if finite.size else 0.0)


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
    # scores are probabilities: relative to their range, 1, not to the largest one random inputs happen to reach
    score_tol, box_tol = _tolerance(ref_scores, atol, rtol, scale=1.0), _tolerance(ref_boxes, atol, rtol)
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
    whose order NMS leaves to the implementation), both ways: each side's detections must have a counterpart
    in the other's (equal counts do not make a one-way match two-way)."""
    if len(other) != 4 or len(reference) != 4:
        raise ExportCheckError(f"{what}: {len(other)} outputs, expected boxes, scores, classes, count")
    if other[3].shape != reference[3].shape or not np.array_equal(other[3], reference[3]):
        raise ExportCheckError(f"{what}: detections per image {other[3].tolist()} differ from the reference's "
                               f"{reference[3].tolist()}")
    diff = check_candidates_close(what, reference[:3], other[:3], atol, rtol)
    check_candidates_close(f"{what}, the reference against it", other[:3], reference[:3], atol, rtol)
    return diff
