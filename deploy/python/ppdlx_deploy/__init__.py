"""Serve a ppdlx export WITHOUT ppdlx: paddle, numpy, Pillow, PyYAML (onnxruntime optional) and the
files tools/export_model.py wrote. ``deploy/python/infer.py`` is its command line (:mod:`.cli`).

Modules, in the order a prediction flows through them:

* :mod:`.meta`: ``inference.yml`` and the program/weights files of an export directory;
* :mod:`.preprocess`: image files to network inputs, as ``inference.yml`` says;
* :mod:`.plan` (with :mod:`.trt` for the Paddle-TRT routes and :mod:`.config_calls`): the
  ``paddle.inference.Config`` calls for a backend and precision, as data;
* :mod:`.predictors`: Paddle Inference and onnxruntime predictors, ``run(feeds) -> outputs``;
* :mod:`.postprocess`: outputs to classes or detections with label names;
* :mod:`.pipeline`: the four above from image files to results, as a service runs them;
* :mod:`.benchmark`, :mod:`.calibration`: timing, int8 calibration batches and Paddle-TRT calibration.

The names below are the package's public API (``import ppdlx_deploy as D; D.Pipeline.open(...)``).
"""
from __future__ import annotations

import os
import warnings

# MKL's vendor check picks slow code paths on AMD CPUs: set before paddle (and MKL) load, which
# every module here does lazily.
os.environ.setdefault("MKL_DEBUG_CPU_TYPE", "5")
# paddle's import warns about a missing ccache (a compiler cache for custom C++ ops): irrelevant here,
# and it would break the one-line error contract.
warnings.filterwarnings("ignore", message="No ccache found")

from . import trt  # noqa: E402
from .benchmark import benchmark, format_rows, latency_stats, time_networks  # noqa: E402
from .calibration import calibrate_trt, calibration_feeds  # noqa: E402
from .config_calls import apply_plan, plan_call  # noqa: E402
from .errors import DeployError, UnsupportedError  # noqa: E402
from .meta import META_FILE, is_quantized, load_meta, model_files, program_op_types  # noqa: E402
from .pipeline import Pipeline  # noqa: E402
from .plan import (BACKENDS, PRECISIONS, build_plan, check_backend_available, cpu_flags, cpu_has_bf16,  # noqa: E402
                   default_threads)
from .postprocess import draw_detections, postprocess, softmax, topk_classes  # noqa: E402
from .predictors import OnnxPredictor, PaddlePredictor, create_predictor  # noqa: E402
from .preprocess import (IMAGE_EXTENSIONS, Preprocessor, center_crop, list_images, load_image, normalize,  # noqa: E402
                         resize_shorter)
from .trt import trt_calibration_tables, trt_shape_ranges  # noqa: E402
from . import cli  # noqa: E402  (last: the command line uses everything above)

__all__ = [
    "BACKENDS", "IMAGE_EXTENSIONS", "META_FILE", "PRECISIONS", "DeployError", "OnnxPredictor", "PaddlePredictor",
    "Pipeline", "Preprocessor", "UnsupportedError", "apply_plan", "benchmark", "build_plan", "calibrate_trt",
    "calibration_feeds", "center_crop", "check_backend_available", "cli", "cpu_flags", "cpu_has_bf16",
    "create_predictor", "default_threads", "draw_detections", "format_rows", "is_quantized", "latency_stats",
    "list_images", "load_image", "load_meta", "model_files", "normalize", "plan_call", "postprocess",
    "program_op_types", "resize_shorter", "softmax", "time_networks", "topk_classes", "trt",
    "trt_calibration_tables", "trt_shape_ranges",
]
