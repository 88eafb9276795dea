"""``inference.yml``: everything a predictor needs, read by ``deploy/python/infer.py`` (which
does not import ppdlx) and documented in ``deploy/README.md``.

Schema (``ppdlx_inference: 1``)::

    model:      family (classification|detection), name, num_classes, data_format,
                format (pir|program), model_file, params_file, [onnx_file], paddle_version,
                [random_weights: true (exported without model.weights: predictions mean nothing)]
    inputs:     [{name, shape (-1 = dynamic batch), dtype, layout, role}]
    outputs:    [{name, role}]    roles: logits|probabilities  or  boxes|scores|classes|count
    preprocess: classification: {type: resize_short_center_crop, resize_short, crop_size,
                interpolation, mean, std (0..255 pixel units), color: RGB|BGR}
                detection: {type: resize_long_pad, size, interpolation, mean, std, color,
                pad_value (normalised units: 0 = the mean colour)}
    postprocess: classification: {type: topk, output: logits|probabilities, topk}
                detection: {type: detections, score_threshold (display), box_format: xyxy,
                coords: original, max_detections, nms_iou_threshold, pre_nms_top_k,
                nms_score_threshold}  (the NMS inside the graph)
    labels:     class names (index = class id): the class folders / COCO category names, or null
    tensorrt:   {min_subgraph_size, workspace_size_bytes (bytes, not MB), max_batch_size,
                 shape_range: {input: {min, opt, max}}}
    onnx:       detection only: the ONNX graph's own {inputs, outputs: [{name, role:
                candidate_boxes|candidate_scores|candidate_classes}], nms: {type: multiclass_nms3,
                score_threshold, iou_threshold, keep_top_k, nms_top_k, normalized, box_coords,
                clip_to_input_hw (the kept boxes are clipped to [0, h] x [0, w] input pixels; older
                exports have none and are not clipped)}} (ppdlx.export.onnx_detection: the graph stops before NMS)
    export_check: max abs differences measured at export time
    verify:     written by --verify (ppdlx.export.verify): images, reference metrics, per backend
                and precision the deployed metrics, agreement, pass/fail and the cause
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional, Sequence

import paddle
import yaml

from ppdlx.config.preprocess import classification_preprocess, detection_preprocess  # noqa: F401  (the sections)

SCHEMA_VERSION = 1
META_FILE = "inference.yml"

# Paddle-TRT defaults (the anchor's values; workspace is in BYTES: the anchor's help text said MB).
TRT_WORKSPACE_BYTES = 1 << 30
TRT_MIN_SUBGRAPH_SIZE = 3


def trt_shape_range(shape: Sequence[int], min_batch: int, opt_batch: int, max_batch: int) -> Dict[str, List[int]]:
    """min/opt/max shapes for one input whose dim 0 is the (dynamic) batch."""
    if not (1 <= min_batch <= opt_batch <= max_batch):
        raise ValueError(f"need 1 <= min_batch <= opt_batch <= max_batch, got {min_batch}, {opt_batch}, {max_batch}")
    rest = [int(d) for d in shape[1:]]
    if any(d <= 0 for d in rest):
        raise ValueError(f"only the batch dimension may be dynamic for TRT shape ranges, got {list(shape)}")
    return {"min": [min_batch] + rest, "opt": [opt_batch] + rest, "max": [max_batch] + rest}


def trt_suggestion(inputs: Sequence[dict], min_batch: int = 1, opt_batch: int = 32, max_batch: int = 256,
                   min_subgraph_size: int = TRT_MIN_SUBGRAPH_SIZE,
                   workspace_size_bytes: int = TRT_WORKSPACE_BYTES) -> dict:
    return {
        "min_subgraph_size": int(min_subgraph_size),
        "workspace_size_bytes": int(workspace_size_bytes),
        "max_batch_size": int(max_batch),
        "shape_range": {i["name"]: trt_shape_range(i["shape"], min_batch, opt_batch, max_batch) for i in inputs},
    }


def build_meta(*, family: str, name: str, num_classes: int, data_format: str, files, inputs: List[dict],
               outputs: List[dict], preprocess: dict, postprocess: dict, labels: Optional[Sequence[str]],
               tensorrt: dict, onnx_file: Optional[str] = None, extra: Optional[dict] = None,
               random_weights: bool = False) -> dict:
    meta = {
        "ppdlx_inference": SCHEMA_VERSION,
        "model": {
            "family": family,
            "name": name,
            "num_classes": int(num_classes),
            "data_format": data_format,
            "format": files.format,
            "model_file": files.model_filename,
            "params_file": files.params_filename,
            "paddle_version": paddle.__version__,
        },
        "inputs": inputs,
        "outputs": outputs,
        "preprocess": preprocess,
        "postprocess": postprocess,
        "labels": list(labels) if labels is not None else None,
        "tensorrt": tensorrt,
    }
    if onnx_file:
        meta["model"]["onnx_file"] = onnx_file
    if random_weights:
        meta["model"]["random_weights"] = True
    if extra:
        meta.update(extra)
    return meta


def write_meta(model_dir: str, meta: dict) -> str:
    path = os.path.join(model_dir, META_FILE)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        yaml.safe_dump(meta, f, sort_keys=False, allow_unicode=True, default_flow_style=None, width=120)
    os.replace(tmp, path)
    return path


def read_meta(model_dir: str) -> dict:
    with open(os.path.join(model_dir, META_FILE), encoding="utf-8") as f:
        return yaml.safe_load(f)
