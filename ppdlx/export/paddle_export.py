"""``paddle.jit.save`` of classification and detection models with a dynamic batch dimension,
and a minimal Paddle Inference CPU runner used to check an export against the dynamic model.

Classification: one input ``image`` ``[N, 3, H, W]`` (or ``[N, H, W, 3]`` for NHWC models), one
output: logits, or softmax probabilities (never an argmax only: the anchor exported argmax).

Detection (a separate function, :func:`save_detector`): inputs ``image`` ``[N, 3, S, S]`` and
``image_scale`` ``[N]`` (original pixels per input pixel); outputs ``boxes [N, D, 4]`` (x1, y1,
x2, y2 in original pixels), ``scores [N, D]``, ``classes [N, D]`` int64 (-1 = padding) and
``count [N]`` int32, with decoding and NMS inside the graph.
"""
from __future__ import annotations

import contextlib
import os
import re
from typing import Dict, List, Optional, Sequence

import numpy as np
import paddle
import paddle.nn as nn
import paddle.inference as pi
import paddle.nn.functional as F
from paddle.base.layer_helper import LayerHelper

from ppdlx.errors import UnsupportedError
from ppdlx.export.files import ModelFiles, find_model_files, remove_stale

INPUT_NAME = "image"
SCALE_NAME = "image_scale"
DETECTION_ROLES = ("boxes", "scores", "classes", "count")


class ClassifierForExport(nn.Layer):
    """``image -> logits`` or ``image -> softmax(logits)``."""

    def __init__(self, model: nn.Layer, output: str = "logits"):
        super().__init__()
        if output not in ("logits", "probabilities"):
            raise ValueError(f"output must be logits or probabilities, got {output!r}")
        self.model = model
        self.probabilities = output == "probabilities"

    def forward(self, image):
        logits = self.model(image)
        return F.softmax(logits, axis=-1) if self.probabilities else logits


class DetectorForExport(nn.Layer):
    """``(image, image_scale) -> (boxes, scores, classes, count)``: model + post-processing."""

    def __init__(self, model: nn.Layer, postprocess: nn.Layer):
        super().__init__()
        self.model = model
        self.postprocess = postprocess

    def forward(self, image, image_scale):
        cls_outputs, box_outputs = self.model(image)
        return self.postprocess(cls_outputs, box_outputs, image_scale)


def image_shape(data_format: str, height: int, width: int, batch: int = -1) -> List[int]:
    return [batch, 3, height, width] if data_format == "NCHW" else [batch, height, width, 3]


@contextlib.contextmanager
def _legacy_sigmoid():
    """Paddle 3.3's ``sigmoid`` became a PIR-only binding (as did ``tanh``, ``exp``, ``sum`` and others;
    ``silu`` kept its legacy-IR branch), so squeeze-excite gates could not be traced into a legacy
    ``.pdmodel``; sigmoid is the one such op the classifiers use. During a legacy trace a static
    ``Variable`` gets the legacy ``sigmoid`` op, the one Paddle 2.x programs hold; everything else goes
    to Paddle's function."""
    original = F.sigmoid

    def sigmoid(x, name=None):
        if isinstance(x, paddle.base.framework.Variable) and not paddle.in_dynamic_mode():
            helper = LayerHelper("sigmoid", name=name)
            out = helper.create_variable_for_type_inference(x.dtype)
            helper.append_op(type="sigmoid", inputs={"X": x}, outputs={"Out": out})
            return out
        return original(x, name)

    F.sigmoid = paddle.sigmoid = sigmoid
    try:
        yield
    finally:
        F.sigmoid = paddle.sigmoid = original


def _jit_save(layer: nn.Layer, prefix: str, input_spec, fmt: str) -> None:
    layer.eval()
    if fmt == "program":
        # Legacy ProgramDesc (.pdmodel): what older Paddle Inference builds and the C library
        # of Paddle 2.x read, and the only program Paddle Inference's TensorRT subgraph engine
        # (enable_tensorrt_engine) processes: a PIR .json takes paddle.tensorrt instead.
        try:
            with paddle.pir_utils.DygraphOldIrGuard(), _legacy_sigmoid():
                paddle.jit.save(layer, prefix, input_spec=input_spec)
        except (TypeError, ValueError) as err:
            # Ops whose Python API became a PIR-only C++ binding, other than sigmoid (see
            # _legacy_sigmoid), reject the legacy IR's Variables (TypeError), or the None that dy2static
            # passes for a Variable it could not convert (ValueError).
            rejected = re.search(r"(\w+)\(\): argument .* must be Value, but got (Variable|None)", str(err))
            if rejected is None:
                raise
            raise UnsupportedError(
                f"--format program: Paddle {paddle.__version__} cannot trace {rejected.group(1)}() into a legacy "
                f".pdmodel (its API takes PIR values only); export the default PIR .json (--format pir), which "
                f"deploy --backend trt runs through paddle.tensorrt") from None
    elif fmt == "pir":
        paddle.jit.save(layer, prefix, input_spec=input_spec)
    else:
        raise ValueError(f"format must be pir or program, got {fmt!r}")


def save_classifier(model: nn.Layer, model_dir: str, height: int, width: int, data_format: str = "NCHW",
                    output: str = "logits", fmt: str = "pir", prefix: str = "inference") -> ModelFiles:
    os.makedirs(model_dir, exist_ok=True)
    remove_stale(model_dir, prefix)
    spec = [paddle.static.InputSpec(image_shape(data_format, height, width, None), "float32", INPUT_NAME)]
    _jit_save(ClassifierForExport(model, output), os.path.join(model_dir, prefix), spec, fmt)
    return find_model_files(model_dir, prefix)


def save_detector(model: nn.Layer, postprocess: nn.Layer, model_dir: str, image_size: int,
                  data_format: str = "NCHW", fmt: str = "pir", prefix: str = "inference") -> ModelFiles:
    os.makedirs(model_dir, exist_ok=True)
    remove_stale(model_dir, prefix)
    spec = [paddle.static.InputSpec(image_shape(data_format, image_size, image_size, None), "float32", INPUT_NAME),
            paddle.static.InputSpec([None], "float32", SCALE_NAME)]
    _jit_save(DetectorForExport(model, postprocess), os.path.join(model_dir, prefix), spec, fmt)
    return find_model_files(model_dir, prefix)


class PaddleInferenceRunner:
    """Paddle Inference on CPU (oneDNN, IR optimisation on): the deployment path, used to check
    an export. ``run({name: array}) -> [outputs in output-name order]``. ``ir_optim=False`` runs the
    program's ops as saved (no fusion, no oneDNN): a quantized program's quantize ops then compute
    exactly what the fake-quantized model did, where a fusion would move values across rounding steps."""

    def __init__(self, files: ModelFiles, threads: int = 1, onednn: bool = True,
                 int8_ops: Optional[Sequence[str]] = None, ir_optim: bool = True):
        config = pi.Config(files.model_file, files.params_file)
        config.disable_gpu()
        if onednn and ir_optim:
            (config.enable_onednn if hasattr(config, "enable_onednn") else config.enable_mkldnn)()
        else:  # a CPU Config starts with oneDNN on (Paddle 3.3.1: onednn_enabled() is True before any call)
            (config.disable_onednn if hasattr(config, "disable_onednn") else config.disable_mkldnn)()
        if int8_ops:  # a quantised legacy program: its quantize ops' scales become oneDNN int8 kernels
            int8 = config.enable_onednn_int8 if hasattr(config, "enable_onednn_int8") else config.enable_mkldnn_int8
            int8(set(int8_ops))
            config.enable_new_ir(False)
        config.set_cpu_math_library_num_threads(threads)
        config.switch_ir_optim(ir_optim)
        config.disable_glog_info()
        self.predictor = pi.create_predictor(config)
        self.input_names = list(self.predictor.get_input_names())
        self.output_names = list(self.predictor.get_output_names())

    def run(self, feeds: Dict[str, np.ndarray]) -> List[np.ndarray]:
        for name in self.input_names:
            handle = self.predictor.get_input_handle(name)
            array = np.ascontiguousarray(feeds[name])
            handle.reshape(list(array.shape))
            handle.copy_from_cpu(array)
        self.predictor.run()
        return [self.predictor.get_output_handle(n).copy_to_cpu() for n in self.output_names]


def random_feeds(inputs: Sequence[dict], batch: int, seed: int = 0) -> Dict[str, np.ndarray]:
    """Normalised-image-like N(0, 1) inputs; scales in [0.5, 2]."""
    rng = np.random.default_rng([seed, batch])
    feeds = {}
    for spec in inputs:
        shape = [batch] + [int(d) for d in spec["shape"][1:]]
        if spec.get("role") == "scale":
            feeds[spec["name"]] = rng.uniform(0.5, 2.0, size=shape).astype(np.float32)
        else:
            feeds[spec["name"]] = rng.standard_normal(shape).astype(np.float32)
    return feeds


@paddle.no_grad()
def run_dynamic(layer: nn.Layer, inputs: Sequence[dict], feeds: Dict[str, np.ndarray]) -> List[np.ndarray]:
    layer.eval()
    out = layer(*[paddle.to_tensor(feeds[i["name"]]) for i in inputs])
    out = out if isinstance(out, (list, tuple)) else [out]
    return [o.numpy() for o in out]


def max_abs_diffs(reference: Sequence[np.ndarray], other: Sequence[np.ndarray]) -> List[float]:
    if len(reference) != len(other):
        raise ValueError(f"{len(reference)} reference outputs but {len(other)} to compare")
    diffs = []
    for a, b in zip(reference, other):
        if a.shape != b.shape:
            raise ValueError(f"output shape {list(b.shape)} differs from the reference's {list(a.shape)}")
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        with np.errstate(invalid="ignore"):  # equal infinities (a detector's overflowing boxes) differ by 0
            diff = np.where(a64 == b64, 0.0, np.abs(a64 - b64))
        diffs.append(float(np.max(diff)) if a.size else 0.0)
    return diffs
