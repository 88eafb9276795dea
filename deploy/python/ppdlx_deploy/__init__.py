"""Serve a ppdlx export WITHOUT ppdlx: paddle, numpy, Pillow, PyYAML (onnxruntime optional) and the
files tools/export_model.py wrote. ``deploy/python/infer.py`` is its command line (:mod:`.cli`).

Modules, in the order a prediction flows through them:

* :mod:`.meta`: ``inference.yml`` and the program/weights files of an export directory;
* :mod:`.preprocess`: image files to network inputs, as ``inference.yml`` says;
* :mod:`.plan` (with :mod:`.trt` for the Paddle-TRT routes, :mod:`.config_calls` and :mod:`.cpu`,
  the CPU's features): the ``paddle.inference.Config`` calls for a backend and precision, as data;
* :mod:`.predictors` (Paddle Inference, onnxruntime) and :mod:`.openvino_runtime` (OpenVINO):
  predictors, ``run(feeds) -> outputs``; :mod:`.backends` builds the one asked for, after
  :mod:`.tuning` has measured the choices left to it (``--backend auto``, ``--precision auto``,
  ``--cpu-variant auto``; kept by :mod:`.decision_cache` with the facts they were made on);
* :mod:`.postprocess`: outputs to classes or detections with label names;
* :mod:`.pipeline`: the four above from image files to results, as a service runs them;
* :mod:`.timing` (statistics), :mod:`.benchmark` (one predictor in this process), :mod:`.workers` /
  :mod:`.worker` (runtimes compared in separate processes: the parent's and the child's side),
  :mod:`.kernel_profile` (where a batch's time goes, kernel by kernel: oneDNN's verbose log,
  onnxruntime's profiler), :mod:`.calibration` (int8 calibration batches and Paddle-TRT calibration).

paddle is imported where Paddle is used, never at the top of a module: MKL's switch below must come first, and
an onnxruntime or OpenVINO deployment (each benchmark worker too) loads no Paddle libraries or threads.

The names below are the package's public API (``import ppdlx_deploy as D; D.Pipeline.open(...)``).
"""
from __future__ import annotations

import os
import sys
import warnings

from . import cpu  # stdlib only: nothing may load paddle before the MKL switch below

# MKL's vendor check keeps its AVX2 kernels from non-Intel CPUs: where that costs (a non-Intel CPU
# with avx2, detected at run time) MKL_DEBUG_CPU_TYPE=5 is set before paddle (and MKL) load, which
# every module here does lazily; elsewhere MKL is left alone. A variable the user set wins, and inside
# a ppdlx process ppdlx has decided already (its config's global.mkl_debug_cpu_type: null unsets it).
MKL_DEBUG_CPU_TYPE_DETECTED = cpu.mkl_debug_cpu_type_for(cpu.cpu_features())
if MKL_DEBUG_CPU_TYPE_DETECTED is not None and "ppdlx" not in sys.modules:
    os.environ.setdefault("MKL_DEBUG_CPU_TYPE", MKL_DEBUG_CPU_TYPE_DETECTED)
# paddle's import warns about a missing ccache (a compiler cache for custom C++ ops): irrelevant here,
# and it would break the one-line error contract.
warnings.filterwarnings("ignore", message="No ccache found")

from . import trt  # noqa: E402
from .backends import bf16_failed_verify, create_predictor  # noqa: E402
from .benchmark import benchmark, format_rows  # noqa: E402
from .calibration import calibrate_trt, calibration_feeds  # noqa: E402
from .config_calls import apply_plan, plan_call  # noqa: E402
from .decision_cache import cache_path, cached_decision, runtime_versions  # noqa: E402
from .errors import DeployError, UnsupportedError  # noqa: E402
from . import kernel_profile  # noqa: E402
from .meta import META_FILE, is_quantized, load_meta, model_files, onnx_precision, program_op_types  # noqa: E402
from .openvino_runtime import OpenVinoPredictor  # noqa: E402
from .pipeline import Pipeline  # noqa: E402
from .plan import (BACKENDS, CPU_RUNTIMES, CPU_VARIANTS, PRECISIONS, build_plan, check_backend_available,  # noqa: E402
                   cpu_flags, cpu_has_bf16, cpu_variant_options, cpu_variants_for, default_threads, runtime_installed)
from .postprocess import clip_to_images, draw_detections, postprocess, softmax, topk_classes  # noqa: E402
from .predictors import OnnxPredictor, PaddlePredictor  # noqa: E402
from .preprocess import (IMAGE_EXTENSIONS, Preprocessor, center_crop, list_images, load_image, normalize,  # noqa: E402
                         resize_shorter)
from .timing import (alternating_order, latency_stats, ratio_stats, round_medians_ms, spread,  # noqa: E402
                     summarize_rounds, synthetic_feeds, time_networks)
from .trt import trt_calibration_tables, trt_shape_ranges  # noqa: E402
from .tuning import choose_backend, choose_cpu_plan, cpu_candidates, runtime_candidates  # noqa: E402
from .workers import WORKER_LOG_ENV, run_in_worker, run_rounds  # noqa: E402
from . import cli  # noqa: E402  (last: the command line uses everything above)

__all__ = [
    "BACKENDS", "CPU_RUNTIMES", "CPU_VARIANTS", "IMAGE_EXTENSIONS", "META_FILE", "PRECISIONS", "WORKER_LOG_ENV",
    "DeployError", "OnnxPredictor", "OpenVinoPredictor", "PaddlePredictor", "Pipeline", "Preprocessor",
    "UnsupportedError", "alternating_order", "apply_plan", "benchmark", "bf16_failed_verify", "build_plan",
    "cache_path", "cached_decision", "calibrate_trt", "calibration_feeds", "center_crop", "check_backend_available",
    "choose_backend", "choose_cpu_plan", "cli", "clip_to_images", "cpu", "cpu_candidates", "cpu_flags",
    "cpu_has_bf16", "cpu_variant_options", "cpu_variants_for", "create_predictor", "default_threads",
    "draw_detections", "format_rows", "is_quantized", "kernel_profile", "latency_stats", "list_images", "load_image",
    "load_meta", "model_files", "normalize", "onnx_precision", "plan_call", "postprocess", "program_op_types",
    "ratio_stats", "resize_shorter", "round_medians_ms", "run_in_worker", "run_rounds", "runtime_candidates",
    "runtime_installed", "runtime_versions", "softmax", "spread", "summarize_rounds", "synthetic_feeds",
    "time_networks", "topk_classes", "trt", "trt_calibration_tables", "trt_shape_ranges",
]
