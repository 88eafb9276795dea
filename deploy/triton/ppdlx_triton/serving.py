"""What a served model computes, apart from Triton's request plumbing (``model.py``): encoded image
files in, the results ``deploy/python/infer.py`` prints out, as named arrays. Pure numpy/Pillow on
top of ppdlx_deploy, so it is tested without a server.

The interface every generated model shares (``ppdlx_triton.config`` writes it into config.pbtxt):

* in: ``image_bytes``, UINT8 ``[batch, -1]``: one encoded JPEG/PNG/... file per row. A request with
  several files of different lengths pads the shorter rows with zeros (decoders stop at the file's
  own end); one file per request is the usual case and the dynamic batcher groups them.
* classification out: ``class_ids`` INT64 ``[k]`` and ``scores`` FP32 ``[k]`` (top-k, best first),
  ``probabilities`` FP32 ``[classes]`` (Triton's classification extension names them from
  ``labels.txt``: ask for it with ``class_count=k``).
* detection out: ``boxes`` FP32 ``[-1, 4]`` (xyxy, original pixels), ``scores`` FP32 ``[-1]``,
  ``class_ids`` INT64 ``[-1]``, ``count`` INT32 ``[1]``: the detections at or above the score
  threshold, best first; rows of a multi-image request are padded to its longest (class -1).

Why UINT8 and not Triton's BYTES type: the Python-backend stub that the ``nvidia-pytriton`` 0.7.0
wheel bundles (Triton 2.51) is built with pybind11 2.10, which reads NumPy 2's dtype descriptor at
NumPy 1's offsets. Under NumPy 2 every tensor it converts through NumPy comes out wrong (a BYTES
input crashes the stub, outputs are sent empty); tensors passed by DLPack are exact under NumPy 1
and 2, and DLPack has no string type. UINT8 files are also how NVIDIA's DALI backend takes images.
"""
from __future__ import annotations

import io
import json
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from PIL import Image

from ppdlx_deploy import OnnxPredictor, Pipeline, Preprocessor, default_threads, postprocess
from ppdlx_deploy.errors import DeployError
from ppdlx_deploy.postprocess import clip_to_images, complete_outputs, softmax, topk_classes

IMAGE_INPUT = "image_bytes"
CLASSIFICATION_OUTPUTS = ("class_ids", "scores", "probabilities")
DETECTION_OUTPUTS = ("boxes", "scores", "class_ids", "count")
# Between the steps of the ONNX ensemble: the original (width, height) of each image, for clipping.
IMAGE_SIZE = "image_size"
ROLES = ("pipeline", "preprocess", "network", "postprocess")


def result_names(meta: dict) -> Tuple[str, ...]:
    return family_outputs(meta["model"]["family"])


def family_outputs(family: str) -> Tuple[str, ...]:
    """The outputs a served model of ``family`` declares (the interface above)."""
    return CLASSIFICATION_OUTPUTS if family == "classification" else DETECTION_OUTPUTS


def served_family(model: str, outputs) -> str:
    """The family of a served model, told by the outputs its configuration declares."""
    for family in ("classification", "detection"):
        if set(family_outputs(family)) <= set(outputs):
            return family
    raise DeployError(f"model {model}: outputs {sorted(outputs)} are not a ppdlx served model's")


def served_results(family: str, arrays: Dict[str, np.ndarray], label) -> List[list]:
    """Per image, a served model's answer as ``ppdlx_deploy.postprocess`` gives results (``label(class_id)``
    names a class)."""
    if family == "classification":
        return [[(int(c), label(int(c)), float(s)) for c, s in zip(ids, scores)]
                for ids, scores in zip(arrays["class_ids"], arrays["scores"])]
    return [[(box.tolist(), float(score), int(c), label(int(c)))
             for box, score, c in zip(boxes[:n], scores[:n], classes[:n])]
            for boxes, scores, classes, n in zip(arrays["boxes"], arrays["scores"], arrays["class_ids"],
                                                 arrays["count"].reshape(-1))]


def decode_images(rows: np.ndarray) -> List[Image.Image]:
    """One RGB image per row of encoded bytes (UINT8 ``[batch, length]``); an unreadable row is a
    :class:`DeployError` naming it."""
    rows = np.asarray(rows)
    if rows.dtype != np.uint8 or rows.ndim != 2:
        raise DeployError(f"{IMAGE_INPUT}: expected UINT8 [batch, bytes], got {rows.dtype} {list(rows.shape)}")
    images = []
    for index, row in enumerate(rows):
        try:
            with Image.open(io.BytesIO(row.tobytes())) as img:
                images.append(img.convert("RGB"))
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
            raise DeployError(f"{IMAGE_INPUT} row {index}: cannot read image ({err})") from None
    return images


def encode_files(files: Sequence[bytes]) -> np.ndarray:
    """The ``image_bytes`` input for these encoded files: one row each, zero-padded to the longest."""
    if not files:
        raise DeployError("no image files to send")
    rows = np.zeros((len(files), max(len(f) for f in files)), np.uint8)
    for row, data in zip(rows, files):
        row[:len(data)] = np.frombuffer(data, np.uint8)
    return rows


def classification_results(meta: dict, logits_or_probs: np.ndarray, topk: int) -> Dict[str, np.ndarray]:
    """Top-k ids and probabilities exactly as :func:`ppdlx_deploy.postprocess` ranks them, and the full
    probability vector."""
    is_logits = meta["postprocess"].get("output", "logits") == "logits"
    ids, scores = topk_classes(logits_or_probs, topk, is_logits)
    probs = softmax(logits_or_probs) if is_logits else logits_or_probs
    return {"class_ids": ids.astype(np.int64), "scores": scores.astype(np.float32),
            "probabilities": np.ascontiguousarray(probs, np.float32)}


def detection_results(meta: dict, outputs: List[np.ndarray], score_threshold: Optional[float]) -> Dict[str, np.ndarray]:
    """The detections :func:`ppdlx_deploy.postprocess` keeps, per image, padded to the batch's longest."""
    kept = postprocess(meta, outputs, score_threshold=score_threshold)
    longest = max(len(k) for k in kept)
    boxes = np.zeros((len(kept), longest, 4), np.float32)
    scores = np.zeros((len(kept), longest), np.float32)
    classes = np.full((len(kept), longest), -1, np.int64)
    for i, detections in enumerate(kept):
        for j, (box, score, class_id, _) in enumerate(detections):
            boxes[i, j], scores[i, j], classes[i, j] = box, score, class_id
    count = np.asarray([[len(k)] for k in kept], np.int32)
    return {"boxes": boxes, "scores": scores, "class_ids": classes, "count": count}


def results(meta: dict, outputs: List[np.ndarray], topk: int,
            score_threshold: Optional[float]) -> Dict[str, np.ndarray]:
    """The served outputs from the network's (``inference.yml`` ``outputs``, boxes within each image)."""
    if meta["model"]["family"] == "classification":
        return classification_results(meta, outputs[0], topk)
    return detection_results(meta, outputs, score_threshold)


def split_rows(arrays: Dict[str, np.ndarray], counts: Sequence[int]) -> List[Dict[str, np.ndarray]]:
    """Batch arrays back into one dict per request of ``counts`` rows each (detections re-padded to
    each request's own longest, so a request's answer does not depend on what it was batched with)."""
    out, start = [], 0
    for n in counts:
        part = {name: a[start:start + n] for name, a in arrays.items()}
        if "count" in part:
            longest = int(part["count"].max()) if n else 0
            for name in ("boxes", "scores", "class_ids"):
                part[name] = np.ascontiguousarray(part[name][:, :longest])
        out.append({name: np.ascontiguousarray(a) for name, a in part.items()})
        start += n
    return out


def pack_labels(meta: dict) -> str:
    """``inference.yml`` labels as the JSON text of the ``labels`` model-config parameter."""
    return json.dumps([str(x) for x in (meta.get("labels") or [])], ensure_ascii=False)


class PipelineStep:
    """Role ``pipeline``: files to results through :class:`ppdlx_deploy.Pipeline` (Paddle Inference on the
    configured backend), exactly as ``deploy/python/infer.py`` runs the export.

    Every step splits its work in two so that the dynamic batcher's requests share one network run and a
    bad request fails alone: ``prepare(inputs of one request) -> rows`` (refuses bad input with a
    :class:`DeployError`), then ``run(rows of many requests) -> arrays`` (one row each, in order)."""

    input_names = (IMAGE_INPUT,)

    def __init__(self, model_dir: str, options: dict):
        self.pipeline = Pipeline.open(model_dir, options["backend"], options["precision"], **options["predictor"])
        self.meta = self.pipeline.meta
        self.topk, self.score_threshold = options["topk"], options["score_threshold"]
        self.output_names = result_names(self.meta)

    def prepare(self, inputs: Dict[str, np.ndarray]) -> List[Image.Image]:
        return decode_images(inputs[IMAGE_INPUT])

    def run(self, images: List[Image.Image]) -> Dict[str, np.ndarray]:
        return results(self.meta, self.pipeline.run(images), self.topk, self.score_threshold)


class PreprocessStep:
    """Role ``preprocess`` (first step of the ONNX ensemble): files to the network's input tensor, with
    each image's scale (detection; 1 for a classifier) and original size for the post-processing step."""

    input_names = (IMAGE_INPUT,)

    def __init__(self, meta: dict):
        self.meta = meta
        self.preprocessor = Preprocessor(meta)
        self.output_names = (self.preprocessor.input_name, "image_scale", IMAGE_SIZE)

    def prepare(self, inputs: Dict[str, np.ndarray]) -> List[Image.Image]:
        return decode_images(inputs[IMAGE_INPUT])

    def run(self, images: List[Image.Image]) -> Dict[str, np.ndarray]:
        arrays, scales = zip(*(self.preprocessor(img) for img in images))
        return {self.preprocessor.input_name: np.stack(arrays).astype(np.float32),
                "image_scale": np.asarray(scales, np.float32).reshape(-1, 1),
                IMAGE_SIZE: np.asarray([img.size for img in images], np.int32)}


class NetworkStep:
    """Role ``network``: the ONNX graph alone, by onnxruntime on CPU (``ppdlx_deploy.OnnxPredictor``), in
    the ensemble's place of Triton's ONNX Runtime backend where a server has none (the nvidia-pytriton
    wheel's): same tensors in and out, so the ensemble around it is the one a GPU server runs."""

    def __init__(self, model_dir: str, meta: dict, options: dict):
        self.predictor = OnnxPredictor(model_dir, threads=options["predictor"]["threads"], meta=meta)
        self.input_names = tuple(self.predictor.input_names)
        self.output_names = tuple(o["name"] for o in onnx_outputs(meta))

    def prepare(self, inputs: Dict[str, np.ndarray]) -> List[Dict[str, np.ndarray]]:
        rows = len(inputs[self.input_names[0]])
        return [{name: np.asarray(inputs[name][i]) for name in self.input_names} for i in range(rows)]

    def run(self, rows: List[Dict[str, np.ndarray]]) -> Dict[str, np.ndarray]:
        feeds = {name: np.stack([row[name] for row in rows]) for name in self.input_names}
        return dict(zip(self.output_names, self.predictor.run(feeds)))


class PostprocessStep:
    """Role ``postprocess`` (last step of the ONNX ensemble): the ONNX graph's outputs to results, with
    ppdlx_deploy's NMS for a detector (its ONNX graph stops before NMS) and the same clipping and
    ranking as the pipeline."""

    def __init__(self, meta: dict, options: dict):
        self.meta = meta
        self.topk, self.score_threshold = options["topk"], options["score_threshold"]
        self.graph_outputs = [o["name"] for o in onnx_outputs(meta)]
        self.input_names = (*self.graph_outputs, "image_scale", IMAGE_SIZE)
        self.scale_name = next((i["name"] for i in meta["inputs"] if i.get("role") == "scale"), None)
        self.output_names = result_names(meta)

    def prepare(self, inputs: Dict[str, np.ndarray]) -> List[Dict[str, np.ndarray]]:
        rows = len(inputs[IMAGE_SIZE])
        return [{name: np.asarray(inputs[name][i]) for name in self.input_names} for i in range(rows)]

    def run(self, rows: List[Dict[str, np.ndarray]]) -> Dict[str, np.ndarray]:
        batch = {name: np.stack([row[name] for row in rows]) for name in self.input_names}
        feeds = {self.scale_name: batch["image_scale"].reshape(-1)} if self.scale_name else {}
        outputs = complete_outputs(self.meta, "onnx", [batch[n] for n in self.graph_outputs], feeds)
        sizes = [(int(w), int(h)) for w, h in batch[IMAGE_SIZE]]
        return results(self.meta, clip_to_images(self.meta, outputs, sizes), self.topk, self.score_threshold)


def onnx_outputs(meta: dict) -> List[dict]:
    """The ONNX graph's outputs: ``inference.yml`` ``onnx.outputs`` where the graph differs from the
    Paddle program (a detector's stops before NMS), else the program's ``outputs``."""
    return (meta.get("onnx") or {}).get("outputs") or meta["outputs"]


def step_options(parameters: Dict[str, str], instance_kind: str = "CPU", device_id: int = 0) -> dict:
    """The step's settings from the model config's ``parameters`` (strings, as Triton passes them). A
    GPU instance runs on the card Triton gave it."""
    def number(key, kind, default):
        text = parameters.get(key, "")
        try:
            return kind(text) if text != "" else default
        except ValueError:
            raise DeployError(f"model-config parameter {key}={text!r}: not a {kind.__name__}") from None
    # the instances of a model share the cores: each predictor takes its share unless told otherwise
    shared = max(1, default_threads() // max(1, number("instance_count", int, 1)))
    predictor = {"threads": number("threads", int, shared), "batch_size": number("max_batch_size", int, 1)}
    if instance_kind == "GPU":
        predictor["gpu_id"] = device_id
    if parameters.get("trt_cache_dir"):
        predictor["cache_dir"] = parameters["trt_cache_dir"]
    return {"role": parameters.get("role", "pipeline"), "backend": parameters.get("backend", "paddle-cpu"),
            "precision": parameters.get("precision", "fp32"), "predictor": predictor,
            "topk": number("topk", int, 5), "score_threshold": number("score_threshold", float, None)}


def make_step(role: str, model_dir: str, meta: dict, options: dict):
    if role == "pipeline":
        return PipelineStep(model_dir, options)
    if role == "preprocess":
        return PreprocessStep(meta)
    if role == "network":
        return NetworkStep(model_dir, meta, options)
    if role == "postprocess":
        return PostprocessStep(meta, options)
    raise DeployError(f"model-config parameter role {role!r}: expected one of {', '.join(ROLES)}")
