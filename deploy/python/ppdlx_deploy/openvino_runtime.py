"""OpenVINO (the ``openvino`` package, not the engine inside Paddle's wheel) as a deploy backend:
``OpenVinoPredictor(model_dir).run(feeds) -> [outputs]``, like the Paddle and onnxruntime predictors.

Which file it reads: OpenVINO 2026's ONNX front end reads ``inference.onnx``, and its PaddlePaddle
front end reads the legacy ``inference.pdmodel`` (``--format program``) but not the PIR
``inference.json`` that ppdlx exports by default (it looks for a ProgramDesc protobuf). The ONNX file
is preferred: it is the graph onnxruntime runs, so a detection export's candidates go through the same
NMS here (``inference.yml`` ``onnx:``); an export without one runs its ``.pdmodel``.

Settings: ``INFERENCE_NUM_THREADS`` = the deployment's threads, the latency hint (one stream), and
the inference precision said explicitly (``f32``; ``bf16`` only on a CPU with bf16 hardware): on
such CPUs OpenVINO's own default is bf16, which would silently change the numbers ``--verify``
checked. The model is compiled for the input shapes it is given (a dynamic batch, ``-1``, resolved
per batch size, compiled once per shape and kept): static shapes let the CPU plugin pick its kernels
ahead of time instead of at every call (docs/cpu_speed.md)."""
from __future__ import annotations

import os
from typing import Dict, List, Optional, Tuple

import numpy as np

from .cpu import cpu_features, has_bf16
from .errors import DeployError, UnsupportedError
from .integrity import check_onnx_file
from .meta import load_meta, model_files
from .plan import default_threads
from .signal_stack import signal_stack_kept

PRECISION_HINTS = {"fp32": "f32", "bf16": "bf16"}


def openvino_graph(model_dir: str, meta: dict) -> Tuple[str, str]:
    """``(graph, path)`` OpenVINO reads for this export: ``("onnx", inference.onnx)`` when the export
    has one, else ``("program", inference.pdmodel)``; a PIR-only export without ONNX is refused."""
    onnx_file = os.path.join(model_dir, meta["model"].get("onnx_file") or "inference.onnx")
    if os.path.isfile(onnx_file):
        return "onnx", onnx_file
    files = model_files(model_dir, meta)
    if files["format"] == "program":
        return "program", files["model_file"]
    raise UnsupportedError(f"--backend openvino: {model_dir} has neither inference.onnx nor a legacy "
                           f"inference.pdmodel (OpenVINO's Paddle front end does not read the PIR inference.json); "
                           f"re-export with --onnx")


class OpenVinoPredictor:
    """``run(feeds) -> [outputs]`` (host arrays in and out) on OpenVINO's CPU plugin; ``plan`` names it."""

    def __init__(self, model_dir: str, precision: str = "fp32", threads: Optional[int] = None,
                 meta: Optional[dict] = None, static_shapes: bool = True):
        if precision not in PRECISION_HINTS:
            raise UnsupportedError(f"--backend openvino --precision {precision}: choose fp32, or bf16 on a CPU with "
                                   f"avx512_bf16/amx_bf16")
        if precision == "bf16" and not has_bf16(cpu_features()):
            raise UnsupportedError("--backend openvino --precision bf16: this CPU has neither avx512_bf16 nor "
                                   "amx_bf16; use --precision fp32")
        try:
            import openvino as ov  # optional runtime: only an OpenVINO deployment (or its worker) loads it
        except ImportError:
            raise UnsupportedError("--backend openvino: pip install openvino") from None
        self.meta = meta or load_meta(model_dir)
        self.graph, path = openvino_graph(model_dir, self.meta)
        if self.graph == "onnx":
            check_onnx_file(path)
        else:
            model_files(model_dir, self.meta)  # program and weights checked before OpenVINO reads them
        threads = int(threads or default_threads())
        try:
            with signal_stack_kept():  # every call into the plugin: it swaps the thread's signal stack
                self.core = ov.Core()
                self.model = self.core.read_model(path)
        except RuntimeError as err:
            first = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
            raise DeployError(f"{path}: OpenVINO cannot read it ({first[:160]}); re-export the model") from None
        self.properties = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY",
                           "INFERENCE_PRECISION_HINT": PRECISION_HINTS[precision]}
        self.static_shapes = static_shapes
        self.input_names = [port.get_any_name() for port in self.model.inputs]
        self.output_names = [port.get_any_name() for port in self.model.outputs]
        self._requests: Dict[tuple, tuple] = {}
        if not static_shapes:
            self._requests[None] = self._compile(self.model)
        version = ov.__version__.split("-")[0]
        self.plan = {"backend": "openvino", "engine": "openvino", "precision": precision, "threads": threads,
                     "graph": self.graph, "cpu_variant": None,
                     "notes": [f"engine openvino: OpenVINO {version} CPU plugin on {os.path.basename(path)}, "
                               f"{PRECISION_HINTS[precision]}, latency hint, {threads} thread(s)"
                               + (", compiled per input shape" if static_shapes else ", dynamic batch")]}

    def _compile(self, model) -> tuple:
        with signal_stack_kept():
            compiled = self.core.compile_model(model, "CPU", self.properties)
            return compiled, compiled.create_infer_request()

    def _request(self, feeds: Dict[str, np.ndarray]) -> tuple:
        if not self.static_shapes:
            return self._requests[None]
        key = tuple(tuple(feeds[name].shape) for name in self.input_names)
        if key not in self._requests:
            model = self.model.clone()
            model.reshape({name: list(shape) for name, shape in zip(self.input_names, key)})
            self._requests[key] = self._compile(model)
        return self._requests[key]

    def run(self, feeds: Dict[str, np.ndarray]) -> List[np.ndarray]:
        compiled, request = self._request(feeds)
        with signal_stack_kept():
            result = request.infer({name: np.ascontiguousarray(feeds[name]) for name in self.input_names},
                                   share_inputs=True)
        return [np.asarray(result[port]) for port in compiled.outputs]
