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

import contextlib
import functools
import logging
import os
import shutil
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import paddle.nn as nn

from ppdlx.errors import ConfigError, UnsupportedError
from ppdlx.export.files import ModelFiles
from ppdlx.export.int8 import save_int8_program
from ppdlx.export.onnx_detection import (SOURCE_DIR, check_candidates_close, check_detections_close,
                                        integer_topk_index_division, onnx_section, save_candidates_program)
from ppdlx.export.onnx_export import OnnxRunner, check_close, export_onnx
from ppdlx.export.onnx_qdq import insert_qdq, quantized_check
from ppdlx.export.paddle_export import (DETECTION_ROLES, INPUT_NAME, SCALE_NAME, ClassifierForExport,
                                        DetectorForExport, image_shape, run_dynamic, save_classifier, save_detector)
from ppdlx.models.detection.det_postprocess import EfficientDetPostProcess
from ppdlx.models.qat import (is_quantized, layer_scales, quantized_weights, simulated_quantization, widened_ranges,
                              without_quanters)

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
    activation_headroom: float = 1.0  # an int8 program's widened activation ranges
    # a QAT model's float program with its quantization simulated (detection_graph): checked against the model
    # computing the same ops (a rounding step flipped by another kernel's float error moves a quantized network's
    # detections), simulated_quantization's equivalence with the fake quantize ops is its own (tested)
    simulated: bool = False

    def reference(self, inputs, feeds):
        """What the saved program must reproduce on ``feeds``: the dynamic graph's outputs."""
        context = simulated_quantization(self.layer) if self.simulated else \
            widened_ranges(self.layer, self.activation_headroom)
        with context:
            return run_dynamic(self.layer, inputs, feeds)


def _image_input(data_format: str, size: int) -> dict:
    return {"name": INPUT_NAME, "shape": image_shape(data_format, size, size), "dtype": "float32",
            "layout": data_format, "role": "image"}


def classification_graph(model, spec: dict, output_dir: str, data_format: str, fmt: str,
                         activation_headroom: float = 1.0) -> ExportGraph:
    """The classifier's program; a quantization-aware-trained one's is the int8 program
    (:mod:`ppdlx.export.int8`), a legacy ``.pdmodel``."""
    size, output = spec["image_size"], spec["output"]
    if is_quantized(model):
        if fmt != "program":
            raise UnsupportedError(f"--format {fmt}: a quantization-aware-trained model exports its int8 program as a "
                                   f"legacy .pdmodel (Paddle Inference runs quantize ops in int8 only there, "
                                   f"docs/int8.md); use --format program")
        files = save_int8_program(model, lambda: save_classifier(model, output_dir, size, size, data_format, output,
                                                                 "program"), activation_headroom)
    else:
        files, activation_headroom = save_classifier(model, output_dir, size, size, data_format, output, fmt), 1.0
    return ExportGraph(files, ClassifierForExport(model, output), [_image_input(data_format, size)], [output],
                       dict(spec["postprocess"]), activation_headroom=activation_headroom)


def detection_graph(model, spec: dict, output_dir: str, data_format: str, fmt: str,
                    activation_headroom: float = 1.0) -> ExportGraph:
    """The model followed by anchor decoding and NMS in one program, built from the spec's plain settings."""
    size = spec["image_size"]
    post = EfficientDetPostProcess(num_classes=spec["num_classes"], image_size=size, data_format=data_format,
                                   **spec["anchors"], **spec["nms"])
    if post.pre_nms_top_k > TENSORRT_TOPK_MAX:
        log.info("export: pre_nms_top_k %d -> %d in the exported graph (TensorRT's TopK limit; written to "
                 "inference.yml, which --verify's evaluator reads)", post.pre_nms_top_k, TENSORRT_TOPK_MAX)
        post.pre_nms_top_k = TENSORRT_TOPK_MAX
    if is_quantized(model):
        # No int8 Paddle program: the detector's post-processing (exp, sum, multiclass_nms3) traces into PIR
        # only, where Paddle Inference's CPU passes delete quantize ops; its int8 graph is the ONNX QDQ file
        # (docs/int8.md). The program computes the QAT model in float with its quantization simulated: the
        # same weights without it are another model, whose BatchNorm statistics and activations never met.
        log.info("export: %s is quantization-aware trained; its Paddle program computes it in float (the "
                 "quantization simulated), its int8 graph is the ONNX QDQ file (--onnx)", type(model).__name__)
        with simulated_quantization(model):
            files = save_detector(model, post, output_dir, size, data_format, fmt)
    else:
        files = save_detector(model, post, output_dir, size, data_format, fmt)
    inputs = [_image_input(data_format, size),
              {"name": SCALE_NAME, "shape": [-1], "dtype": "float32", "layout": "N", "role": "scale"}]
    postprocess = {**spec["postprocess"], "max_detections": int(post.max_detections),
                   "nms_iou_threshold": float(post.iou_threshold), "pre_nms_top_k": int(post.pre_nms_top_k),
                   "nms_score_threshold": float(post.score_threshold)}
    return ExportGraph(files, DetectorForExport(model, post), inputs, list(DETECTION_ROLES), postprocess,
                       check_detections_close, simulated=is_quantized(model))


GRAPHS: Dict[str, Callable[..., ExportGraph]] = {"classification": classification_graph,
                                                 "detection": detection_graph}


# The program format an export is saved in when none is asked for, per family, for a quantization-aware-trained
# model: a classifier's int8 program is a legacy .pdmodel (Paddle Inference runs quantize ops in int8 only there);
# a detector's program is float, its quantization simulated (detection_graph), saved as any other.
QUANTIZED_FORMATS: Dict[str, str] = {"classification": "program", "detection": "pir"}


def default_format(model, spec: dict) -> str:
    """``pir``, or the family's ``QUANTIZED_FORMATS`` entry for a quantization-aware-trained model."""
    return QUANTIZED_FORMATS.get(spec.get("family"), "pir") if is_quantized(model) else "pir"


def export_graph(model, spec: dict, output_dir: str, data_format: str, fmt: str,
                 activation_headroom: float = 1.0) -> ExportGraph:
    """``activation_headroom``: the factor on a quantization-aware-trained model's activation ranges in its
    int8 program (:mod:`ppdlx.export.onednn_int8`)."""
    family = spec.get("family")
    if family not in GRAPHS:
        raise ConfigError(f"export spec family={family!r}: expected one of {', '.join(sorted(GRAPHS))}")
    return GRAPHS[family](model, spec, output_dir, data_format, fmt, activation_headroom)


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
    # the arithmetic the reference computes in: a QAT model's QDQ graph is checked against the model computing
    # its Q/DQ nodes' (simulated_quantization with onnx=True)
    reference_context: Callable = contextlib.nullcontext


def qdq_onnx(model, save_float: Callable[[str], ModelFiles], onnx_file: str, opset: int) -> dict:
    """The ONNX QDQ file of a quantization-aware-trained ``model``: ``save_float(folder)`` traces its
    float graph (quanters off) into ``folder``, paddle2onnx converts it, the trained scales go in as
    QuantizeLinear/DequantizeLinear (:mod:`ppdlx.export.onnx_qdq`). Returns the counts."""
    source = os.path.join(os.path.dirname(onnx_file), SOURCE_DIR)
    try:
        with quantized_weights(model), without_quanters(model):  # int8 weights: the training's rounding
            files = save_float(source)
        scales = layer_scales(model)
        export_onnx(files, onnx_file, opset=opset)
    finally:
        shutil.rmtree(source, ignore_errors=True)
    return insert_qdq(onnx_file, scales)


def classification_onnx(graph: ExportGraph, spec: dict, onnx_file: str, data_format: str, opset: int,
                        threads: int) -> OnnxTarget:
    section = None
    if is_quantized(graph.layer):
        size = spec["image_size"]
        section = {"qdq": qdq_onnx(graph.layer.model, lambda folder: save_classifier(
            graph.layer.model, folder, size, size, data_format, spec["output"], "program"), onnx_file, opset)}
        return OnnxTarget(onnx_file, OnnxRunner(onnx_file, threads, optimize=False), graph.layer, graph.inputs,
                          quantized_check(check_close), section,
                          functools.partial(simulated_quantization, graph.layer.model, onnx=True))
    export_onnx(graph.files, onnx_file, opset=opset)
    return OnnxTarget(onnx_file, OnnxRunner(onnx_file, threads), graph.layer, graph.inputs, check_close, None)


def detection_onnx(graph: ExportGraph, spec: dict, onnx_file: str, data_format: str, opset: int,
                   threads: int) -> OnnxTarget:
    """The graph up to NMS (:mod:`ppdlx.export.onnx_detection`); NMS runs in the deploy package. A
    quantization-aware-trained detector's is the QDQ graph."""
    folder, size, qdq = os.path.dirname(onnx_file), spec["image_size"], None
    if is_quantized(graph.layer.model):
        qdq = qdq_onnx(graph.layer.model, lambda _: save_candidates_program(graph.layer, folder, size, data_format)[0],
                       onnx_file, opset)
        _, layer, inputs = save_candidates_program(graph.layer, folder, size, data_format, save=False)
    else:
        files, layer, inputs = save_candidates_program(graph.layer, folder, size, data_format)
        try:
            export_onnx(files, onnx_file, opset=opset)
        finally:
            shutil.rmtree(files.model_dir, ignore_errors=True)
    integer_topk_index_division(onnx_file)
    runner = OnnxRunner(onnx_file, threads, optimize=qdq is None)
    section = onnx_section(runner.output_names, inputs, graph.layer.postprocess)
    if qdq:
        section["qdq"] = qdq
        return OnnxTarget(onnx_file, runner, layer, inputs, quantized_check(check_candidates_close), section,
                          functools.partial(simulated_quantization, graph.layer.model, onnx=True))
    return OnnxTarget(onnx_file, runner, layer, inputs, check_candidates_close, section)


ONNX_TARGETS: Dict[str, Callable[..., OnnxTarget]] = {"classification": classification_onnx,
                                                      "detection": detection_onnx}


def export_onnx_target(graph: ExportGraph, spec: dict, onnx_file: str, data_format: str, opset: int,
                       threads: int = 1) -> OnnxTarget:
    return ONNX_TARGETS[spec["family"]](graph, spec, onnx_file, data_format, opset, threads)
