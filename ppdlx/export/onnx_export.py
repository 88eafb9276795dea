"""Paddle -> ONNX with paddle2onnx, then onnxruntime's outputs checked against Paddle's.

paddle2onnx logs and swallows conversion errors, so success is judged by the file it writes.
Weights end up as graph initializers (``extract_constant_to_initializer``).
Its default post-processing (``optimize_tool="polygraphy"``) pip-installs onnx_graphsurgeon at
run time; we use ``onnxoptimizer`` (a declared dependency) instead.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from typing import Dict, List

import numpy as np

from ppdlx.errors import ConfigError, UnsupportedError
from ppdlx.export.files import ModelFiles
from ppdlx.export.paddle_export import max_abs_diffs


class ExportCheckError(ConfigError):
    """An exported model disagrees with the dynamic model beyond the tolerance."""


# paddle2onnx 2.1 writes every weight as a Constant node; they become initializers, where
# TensorRT's parser, onnxruntime's quantization tools and `tools/prune_asp.py --check` expect weights.
_CONVERT = """
import sys, onnx, onnxoptimizer, paddle2onnx
paddle2onnx.export(sys.argv[1], sys.argv[2], save_file=sys.argv[3], opset_version=int(sys.argv[4]),
                   auto_upgrade_opset=True, enable_onnx_checker=True, enable_optimize=True,
                   optimize_tool="onnxoptimizer")
model = onnxoptimizer.optimize(onnx.load(sys.argv[3]), ["extract_constant_to_initializer"])
onnx.checker.check_model(model)
onnx.save(model, sys.argv[3])
"""


def export_onnx(files: ModelFiles, save_file: str, opset: int = 13) -> str:
    """Convert in a child process: paddle2onnx aborts the whole process (SIGABRT) on some
    unsupported graphs (e.g. NHWC convolutions) instead of raising."""
    if importlib.util.find_spec("paddle2onnx") is None or importlib.util.find_spec("onnxruntime") is None:
        raise UnsupportedError("--onnx needs paddle2onnx and onnxruntime: pip install paddle2onnx onnxruntime")
    if os.path.exists(save_file):
        os.remove(save_file)
    proc = subprocess.run([sys.executable, "-c", _CONVERT, files.model_file, files.params_file, save_file, str(opset)],
                          capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if proc.returncode != 0 or not os.path.isfile(save_file) or os.path.getsize(save_file) == 0:
        errors = [line.strip() for line in (proc.stdout + proc.stderr).splitlines()
                  if "[ERROR]" in line or "Error" in line]
        detail = "; ".join(dict.fromkeys(errors))[-400:] or f"exit code {proc.returncode}"
        raise UnsupportedError(f"paddle2onnx could not convert {files.model_file} (opset {opset}): {detail}")
    return save_file


class OnnxRunner:
    """onnxruntime CPU session with an explicit thread count; ``run(feeds) -> [outputs]``."""

    def __init__(self, path: str, threads: int = 1, optimize: bool = True):
        import onnxruntime as ort  # optional (ppdlx[onnx]): only an ONNX export is run
        options = ort.SessionOptions()
        if not optimize:  # the graph's ops as written (a QDQ graph's Q/DQ computed as such, not fused)
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]

    def run(self, feeds: Dict[str, np.ndarray]) -> List[np.ndarray]:
        return self.session.run(None, {n: feeds[n] for n in self.input_names})


def check_close(what: str, reference: List[np.ndarray], other: List[np.ndarray], atol: float, rtol: float) -> float:
    """Max abs diff over all outputs; raise if above ``atol + rtol * max|reference|``."""
    try:
        diff = max(max_abs_diffs(reference, other))
    except ValueError as err:  # an output of another shape (e.g. a mis-converted dynamic shape)
        raise ExportCheckError(f"{what}: {err}") from None
    scale = max(float(np.max(np.abs(r[np.isfinite(r)]))) if np.isfinite(r).any() else 0.0 for r in reference)
    limit = atol + rtol * scale
    if not np.isfinite(diff) or diff > limit:
        raise ExportCheckError(f"{what}: max abs diff {diff:.3g} exceeds the tolerance {limit:.3g} "
                               f"(atol {atol:g} + rtol {rtol:g} x max|output| {scale:.3g})")
    return diff
