"""The graph each export family saves, from the *export spec*: what export needs from a task, as plain data.

An export spec is a dict a task plug-in supplies (``Task.export_spec``; ``export_model(..., export_spec=...)``;
``ppdlx.tasks.classification.classification_export_spec`` and ``ppdlx.tasks.detection.detection_export_spec``
build them):

* ``family``: ``classification`` or ``detection``; picks the graph below and is written to
  ``inference.yml``;
* ``image_size``: the side of the square network input;
* ``preprocess``, ``postprocess``: the ``inference.yml`` sections of those names (the predictor's
  side; see :mod:`ppdlx.export.meta`);
* ``trt_batches``: ``{"opt_batch", "max_batch"}``, the default TensorRT shape range;
  ``trt_min_subgraph_size`` (optional): the smallest group of ops Paddle-TRT turns into an engine;
* classification: ``output`` (``logits`` or ``probabilities``);
* detection: ``num_classes``, ``anchors`` (``min_level``, ``max_level``, ``num_scales``,
  ``aspect_ratios``, ``anchor_scale``) and ``nms`` (keyword overrides of
  ``EfficientDetPostProcess``; empty keeps its defaults): the post-processing built into the graph.

Export never tells a detector from a classifier itself: the config's task plug-in
(:mod:`ppdlx.tasks`) supplies the spec, and its ``family`` selects the entries below.

Per family, ``GRAPHS`` saves the Paddle program and ``ONNX_TARGETS`` writes ``inference.onnx``: the
same program for a classifier, the program up to NMS for a detector (:mod:`ppdlx.export.onnx_detection`).
"""
from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import paddle.nn as nn

from ppdlx.errors import ConfigError
from ppdlx.export.files import ModelFiles
from ppdlx.export.onnx_detection import (check_candidates_close, check_detections_close,
                                        integer_topk_index_division, onnx_section, save_candidates_program)
from ppdlx.export.onnx_export import OnnxRunner, check_close, export_onnx
from ppdlx.export.paddle_export import (DETECTION_ROLES, INPUT_NAME, SCALE_NAME, ClassifierForExport,
                                        DetectorForExport, image_shape, save_classifier, save_detector)
from ppdlx.models.detection.det_postprocess import EfficientDetPostProcess

log = logging.getLogger("ppdlx")

# TensorRT's TopK layer takes k <= 3840 (both the ONNX parser's engines and Paddle-TRT's converter
# build one), so an exported detector keeps at most that many candidates before NMS. With hard NMS a
# lower-ranked candidate can neither suppress nor outrank a higher one, so the kept detections only
# change when fewer than max_detections of the top 3840 survive.
TENSORRT_TOPK_MAX = 3840


@dataclass
class ExportGraph:
    """A saved inference program and what it is checked and described with."""
    files: ModelFiles
    layer: nn.Layer          # the dynamic model the program must reproduce
    inputs: List[dict]       # inference.yml inputs: name, shape, dtype, layout, role
    output_roles: List[str]  # one per program output, in order
    postprocess: dict        # inference.yml postprocess section
    compare: Callable = check_close  # (what, reference, outputs, atol, rtol) -> max diff, raises if not close


def _image_input(data_format: str, size: int) -> dict:
    return {"name": INPUT_NAME, "shape": image_shape(data_format, size, size), "dtype": "float32",
            "layout": data_format, "role": "image"}


def classification_graph(model, spec: dict, output_dir: str, data_format: str, fmt: str) -> ExportGraph:
    size, output = spec["image_size"], spec["output"]
    files = save_classifier(model, output_dir, size, size, data_format, output, fmt)
    return ExportGraph(files, ClassifierForExport(model, output), [_image_input(data_format, size)], [output],
                       dict(spec["postprocess"]))


def detection_graph(model, spec: dict, output_dir: str, data_format: str, fmt: str) -> ExportGraph:
    """The model followed by anchor decoding and NMS in one program, built from the spec's plain settings."""
    size = spec["image_size"]
    post = EfficientDetPostProcess(num_classes=spec["num_classes"], image_size=size, data_format=data_format,
                                   **spec["anchors"], **spec["nms"])
    if post.pre_nms_top_k > TENSORRT_TOPK_MAX:
        log.info("export: pre_nms_top_k %d -> %d in the exported graph (TensorRT's TopK limit; written to "
                 "inference.yml, which --verify's evaluator reads)", post.pre_nms_top_k, TENSORRT_TOPK_MAX)
        post.pre_nms_top_k = TENSORRT_TOPK_MAX
    files = save_detector(model, post, output_dir, size, data_format, fmt)
    inputs = [_image_input(data_format, size),
              {"name": SCALE_NAME, "shape": [-1], "dtype": "float32", "layout": "N", "role": "scale"}]
    postprocess = {**spec["postprocess"], "max_detections": int(post.max_detections),
                   "nms_iou_threshold": float(post.iou_threshold), "pre_nms_top_k": int(post.pre_nms_top_k),
                   "nms_score_threshold": float(post.score_threshold)}
    return ExportGraph(files, DetectorForExport(model, post), inputs, list(DETECTION_ROLES), postprocess,
                       check_detections_close)


GRAPHS: Dict[str, Callable[..., ExportGraph]] = {"classification": classification_graph,
                                                 "detection": detection_graph}


def export_graph(model, spec: dict, output_dir: str, data_format: str, fmt: str) -> ExportGraph:
    family = spec.get("family")
    if family not in GRAPHS:
        raise ConfigError(f"export spec family={family!r}: expected one of {', '.join(sorted(GRAPHS))}")
    return GRAPHS[family](model, spec, output_dir, data_format, fmt)


@dataclass
class OnnxTarget:
    """An ``inference.onnx`` and how it is checked: ``compare(what, reference, outputs, atol, rtol)``
    of ``runner``'s outputs against ``layer`` (the dynamic graph the file was converted from)."""
    file: str
    runner: OnnxRunner
    layer: nn.Layer
    inputs: List[dict]
    compare: Callable
    meta_section: Optional[dict]  # inference.yml "onnx" section when the graph differs from the program's


def classification_onnx(graph: ExportGraph, spec: dict, onnx_file: str, data_format: str, opset: int,
                        threads: int) -> OnnxTarget:
    export_onnx(graph.files, onnx_file, opset=opset)
    return OnnxTarget(onnx_file, OnnxRunner(onnx_file, threads), graph.layer, graph.inputs, check_close, None)


def detection_onnx(graph: ExportGraph, spec: dict, onnx_file: str, data_format: str, opset: int,
                   threads: int) -> OnnxTarget:
    """The graph up to NMS (:mod:`ppdlx.export.onnx_detection`); NMS runs in the deploy package."""
    files, layer, inputs = save_candidates_program(graph.layer, os.path.dirname(onnx_file), spec["image_size"],
                                                   data_format)
    try:
        export_onnx(files, onnx_file, opset=opset)
    finally:
        shutil.rmtree(files.model_dir, ignore_errors=True)
    integer_topk_index_division(onnx_file)
    runner = OnnxRunner(onnx_file, threads)
    return OnnxTarget(onnx_file, runner, layer, inputs, check_candidates_close,
                      onnx_section(runner.output_names, inputs, graph.layer.postprocess))


ONNX_TARGETS: Dict[str, Callable[..., OnnxTarget]] = {"classification": classification_onnx,
                                                      "detection": detection_onnx}


def export_onnx_target(graph: ExportGraph, spec: dict, onnx_file: str, data_format: str, opset: int,
                       threads: int = 1) -> OnnxTarget:
    return ONNX_TARGETS[spec["family"]](graph, spec, onnx_file, data_format, opset, threads)
