#!/usr/bin/env python3
"""Run an exported ppdlx model WITHOUT ppdlx (needs paddle, numpy, Pillow, PyYAML;
onnxruntime for --backend onnxruntime).

    python deploy/python/infer.py --model-dir DIR --input IMG_OR_DIR \
        [--backend paddle-cpu|paddle-gpu|trt|onnxruntime] [--precision fp32|fp16|bf16|int8] \
        [--batch-size N] [--threads N] [--topk K]
    python deploy/python/infer.py --model-dir DIR --input DIR --benchmark \
        --warmup 10 --repeats 100 --batch-sizes 1,8 [--report FILE]

DIR is what tools/export_model.py wrote: inference.{json|pdmodel} + inference.pdiparams
(+ inference.onnx) and inference.yml (pre-processing, I/O names, labels, TRT shape ranges).

Backends: paddle-cpu (oneDNN, fp32 / bf16 on CPUs with avx512_bf16 or amx_bf16 / int8 for
quantised models), paddle-gpu (CUDA, fp32 / fp16), trt (fp32 / fp16 / int8, engine cache, dynamic
shape from inference.yml or collected on sample inputs; a legacy .pdmodel goes through the Paddle-TRT
subgraph engine, a PIR .json through paddle.tensorrt: see ppdlx_deploy/trt.py), onnxruntime (CPU,
fp32). Every plan, printed note and benchmark row names the engine that runs the network. A Paddle
build without CUDA asked for paddle-gpu or trt, or a trt request that would not engage TensorRT,
exits with one line (code 3).
"""
from __future__ import annotations

import os

# MKL's vendor check picks slow code paths on AMD CPUs: set before paddle (and MKL) load.
os.environ.setdefault("MKL_DEBUG_CPU_TYPE", "5")

import argparse  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from typing import Dict, List, Optional, Sequence  # noqa: E402

import numpy as np  # noqa: E402
import yaml  # noqa: E402
from PIL import Image, ImageDraw  # noqa: E402

# The sibling package ppdlx_deploy (errors, the Paddle-TRT routes) is found from any cwd, also
# when this file is loaded by path (ppdlx/benchmarks/infer.py, the tests).
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
from ppdlx_deploy import DeployError, UnsupportedError, plan_call as _call  # noqa: E402
from ppdlx_deploy import trt as T  # noqa: E402
from ppdlx_deploy.trt import trt_calibration_tables, trt_shape_ranges  # noqa: E402,F401  (public names)

# paddle's import warns about a missing ccache (a compiler cache for custom C++ ops): irrelevant here,
# and it would break the one-line error contract.
warnings.filterwarnings("ignore", message="No ccache found")

BACKENDS = ("paddle-cpu", "paddle-gpu", "trt", "onnxruntime")
PRECISIONS = ("fp32", "fp16", "bf16", "int8")
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".ppm")
META_FILE = "inference.yml"


# --------------------------------------------------------------------------------------------
# Model directory
# --------------------------------------------------------------------------------------------

def load_meta(model_dir: str) -> dict:
    path = os.path.join(model_dir, META_FILE)
    if not os.path.isfile(path):
        raise DeployError(f"{model_dir}: no {META_FILE} (export with tools/export_model.py)")
    with open(path, encoding="utf-8") as f:
        meta = yaml.safe_load(f)
    if not isinstance(meta, dict) or meta.get("ppdlx_inference") != 1:
        raise DeployError(f"{path}: not a ppdlx inference.yml (schema version 1)")
    return meta


def model_files(model_dir: str, meta: Optional[dict] = None) -> dict:
    """``{"format": "pir"|"program", "model_file", "params_file"}`` decided by the files present."""
    prefix = "inference"
    if meta:
        prefix = os.path.splitext(meta["model"]["params_file"])[0]
    found = [(fmt, os.path.join(model_dir, prefix + ext)) for fmt, ext in (("pir", ".json"), ("program", ".pdmodel"))
             if os.path.isfile(os.path.join(model_dir, prefix + ext))]
    if not found:
        raise DeployError(f"{model_dir}: neither {prefix}.json nor {prefix}.pdmodel exists")
    if len(found) > 1:
        raise DeployError(f"{model_dir}: both {prefix}.json and {prefix}.pdmodel exist; remove the stale one")
    params = os.path.join(model_dir, prefix + ".pdiparams")
    if not os.path.isfile(params):
        raise DeployError(f"{model_dir}: {prefix}.pdiparams is missing")
    return {"format": found[0][0], "model_file": found[0][1], "params_file": params}


def program_op_types(model_file: str) -> set:
    """The op types of a program file: a PIR .json names each op ``"#":"<dialect>.<op>"``; a
    legacy .pdmodel is a ProgramDesc protobuf. (Its op_version_map lists every registered op,
    quantize ops included, so a byte search there would call every legacy program quantised.)"""
    if model_file.endswith(".json"):
        with open(model_file, encoding="utf-8") as f:
            return set(re.findall(r'"#":"\d+\.(\w+)"', f.read()))
    from paddle.base.proto import framework_pb2
    program = framework_pb2.ProgramDesc()
    with open(model_file, "rb") as f:
        program.ParseFromString(f.read())
    return {op.type for block in program.blocks for op in block.ops}


def is_quantized(model_file: str) -> bool:
    """A QAT/PTQ export carries (fake) (de)quantize ops."""
    return any("quantize" in op for op in program_op_types(model_file))


# --------------------------------------------------------------------------------------------
# Pre-processing: a line-by-line mirror of ppdlx.data.transforms (EvalTransform)
# --------------------------------------------------------------------------------------------

_INTERP = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "nearest": Image.NEAREST}


def resize_shorter(img: Image.Image, size: int, interpolation: str) -> Image.Image:
    w, h = img.size
    if w <= h:
        new_w, new_h = size, max(1, int(round(h * size / w)))
    else:
        new_w, new_h = max(1, int(round(w * size / h))), size
    return img.resize((new_w, new_h), _INTERP[interpolation])


def center_crop(img: Image.Image, size: int) -> Image.Image:
    w, h = img.size
    left, top = int(round((w - size) / 2.0)), int(round((h - size) / 2.0))
    return img.crop((left, top, left + size, top + size))


def normalize(img: Image.Image, mean, std, layout: str) -> np.ndarray:
    arr = np.asarray(img, dtype=np.float32)
    arr = (arr - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(arr.transpose(2, 0, 1) if layout == "NCHW" else arr)


def load_image(path: str) -> Image.Image:
    try:
        with Image.open(path) as img:
            return img.convert("RGB")
    except (OSError, ValueError, SyntaxError) as err:
        raise DeployError(f"{path}: cannot read image ({err})") from None


class Preprocessor:
    """``inference.yml`` pre-processing. ``__call__(PIL image) -> (array, scale)``; ``scale`` is
    original pixels per input pixel (detection) or 1.0 (classification)."""

    def __init__(self, meta: dict):
        self.cfg = meta["preprocess"]
        self.family = meta["model"]["family"]
        image_input = [i for i in meta["inputs"] if i.get("role", "image") == "image"][0]
        self.input_name = image_input["name"]
        self.layout = image_input.get("layout", meta["model"].get("data_format", "NCHW"))
        self.scale_name = next((i["name"] for i in meta["inputs"] if i.get("role") == "scale"), None)
        if self.cfg["type"] not in ("resize_short_center_crop", "resize_long_pad"):
            raise DeployError(f"{META_FILE}: unknown preprocess.type {self.cfg['type']!r}")

    def __call__(self, img: Image.Image):
        c = self.cfg
        if c["type"] == "resize_short_center_crop":
            img = center_crop(resize_shorter(img, c["resize_short"], c["interpolation"]), c["crop_size"])
            return normalize(img, c["mean"], c["std"], self.layout), 1.0
        # resize_long_pad: scale the longer side to `size`, pad bottom/right (EfficientDet eval).
        size = int(c["size"])
        w, h = img.size
        ratio = min(size / h, size / w)
        new_w, new_h = max(1, int(round(w * ratio))), max(1, int(round(h * ratio)))
        resized = img.resize((new_w, new_h), _INTERP[c["interpolation"]])
        arr = normalize(resized, c["mean"], c["std"], "NHWC")
        pad_norm = (float(c.get("pad_value", 0.0)) - np.asarray(c["mean"], np.float32)) / np.asarray(c["std"], np.float32)
        canvas = np.empty((size, size, 3), np.float32)
        canvas[...] = pad_norm
        canvas[:new_h, :new_w] = arr
        if self.layout == "NCHW":
            canvas = canvas.transpose(2, 0, 1)
        return np.ascontiguousarray(canvas), 1.0 / ratio

    def feeds(self, images: Sequence[Image.Image]) -> Dict[str, np.ndarray]:
        arrays, scales = zip(*(self(img) for img in images))
        feeds = {self.input_name: np.stack(arrays)}
        if self.scale_name:
            feeds[self.scale_name] = np.asarray(scales, np.float32)
        return feeds


def list_images(path: str) -> List[str]:
    if os.path.isdir(path):
        files = sorted(p for p in glob.glob(os.path.join(path, "**", "*"), recursive=True)
                       if p.lower().endswith(IMAGE_EXTENSIONS))
        if not files:
            raise DeployError(f"{path}: no images ({', '.join(IMAGE_EXTENSIONS)})")
        return files
    if not os.path.isfile(path):
        raise DeployError(f"--input {path}: no such file or directory")
    return [path]


# --------------------------------------------------------------------------------------------
# Predictor configuration: a pure plan (list of Config calls) + its application
# --------------------------------------------------------------------------------------------

def cpu_flags() -> set:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_has_bf16(flags: Optional[set] = None) -> bool:
    flags = cpu_flags() if flags is None else flags
    return bool({"avx512_bf16", "amx_bf16"} & flags)


def default_threads() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def build_plan(meta: dict, files: dict, backend: str, precision: str, *, threads: Optional[int] = None,
               batch_size: int = 1, gpu_id: int = 0, gpu_mem_mb: int = 256, cache_dir: Optional[str] = None,
               shape_source: str = "yml", shape_file: Optional[str] = None, trt_max_batch: Optional[int] = None,
               workspace_bytes: Optional[int] = None, min_subgraph_size: Optional[int] = None,
               quantized: Optional[bool] = None, cpu_flag_set: Optional[set] = None, tuned_cpu: bool = True,
               cpu_engine: str = "onednn", pir_trt_available: Optional[bool] = None) -> dict:
    """The ``paddle.inference.Config`` calls for a backend/precision, as data (nothing is built;
    paddle is imported only to read a .pdmodel's op list when ``quantized`` is not given, and to
    probe ``paddle.tensorrt`` for a PIR export on ``trt`` when ``pir_trt_available`` is not given).

    Returns ``{"engine", "calls", "collect_calls", "notes", "model_file", "params_file", ...}``:
    ``engine`` is what runs the network (onednn, openvino, cuda, paddle-trt-subgraph, pir-trt,
    onnxruntime), ``model_file``/``params_file`` what the predictor loads (for pir-trt the
    converted program, described by ``pir_trt``). A call is ``{"call": method, "args": [...],
    "kwargs": {...}}``; precision enums are written as the ``PrecisionType`` member name
    ("Float32", "Half", "Int8") and resolved by :func:`apply_plan`.
    """
    if backend not in BACKENDS:
        raise DeployError(f"--backend {backend}: choose one of {', '.join(BACKENDS)}")
    if precision not in PRECISIONS:
        raise DeployError(f"--precision {precision}: choose one of {', '.join(PRECISIONS)}")
    calls, notes = [], []
    threads = threads or default_threads()
    if quantized is None:
        quantized = is_quantized(files["model_file"])
    plan = {"backend": backend, "precision": precision, "threads": threads, "calls": calls, "collect_calls": None,
            "notes": notes, "shape_file": shape_file, "model_file": files["model_file"],
            "params_file": files["params_file"], "pir_trt": None, "calibration": False}

    if backend == "paddle-cpu":
        if precision == "fp16":
            raise UnsupportedError("--backend paddle-cpu --precision fp16: Paddle has no fp16 CPU kernels; "
                                   "use fp32 or bf16 (CPUs with avx512_bf16/amx_bf16)")
        if precision == "bf16" and not cpu_has_bf16(cpu_flag_set):
            raise UnsupportedError("--precision bf16: this CPU has neither avx512_bf16 nor amx_bf16 in "
                                   "/proc/cpuinfo, so oneDNN would silently compute fp32; use --precision fp32")
        if precision == "int8" and not quantized:
            raise UnsupportedError("--backend paddle-cpu --precision int8 needs a quantised (QAT/PTQ) export: "
                                   "this model has no quantize ops")
        calls += [_call("disable_gpu"), _call("enable_onednn"),
                  _call("set_cpu_math_library_num_threads", int(threads)),
                  _call("switch_ir_optim", True)]
        if precision == "bf16":
            calls.append(_call("enable_onednn_bfloat16"))
        if precision == "int8":
            calls.append(_call("enable_onednn_int8"))
        if files["format"] == "program" and tuned_cpu:
            # A legacy .pdmodel runs through the classic analysis passes and executor, which
            # fuse conv+bn+relu(+add) for oneDNN and measured faster than translating it to PIR.
            calls.append(_call("enable_new_ir", False))
        if cpu_engine == "openvino":
            if files["format"] != "program" or precision != "fp32":
                raise UnsupportedError("--cpu-engine openvino: Paddle Inference ignores the OpenVINO engine for "
                                       "PIR (.json) models; export with --format program (fp32 only)")
            calls.append(_call("enable_openvino_engine", inference_precision="Float32"))
        plan["engine"] = "openvino" if cpu_engine == "openvino" else "onednn"
        engine = "OpenVINO (Paddle Inference engine)" if cpu_engine == "openvino" else "oneDNN"
        kind = "PIR program (.json)" if files["format"] == "pir" else "legacy program (.pdmodel)"
        notes.append(f"engine {plan['engine']}: {engine}, {threads} thread(s), IR optimisation on, {kind}"
                     + (", classic passes + executor (enable_new_ir(False))"
                        if files["format"] == "program" and tuned_cpu else ""))
        if tuned_cpu and files["format"] == "pir":
            notes.append("executor: serial run (no op-scheduling thread pool)")
    elif backend in ("paddle-gpu", "trt"):
        if precision == "bf16":
            raise UnsupportedError(f"--backend {backend} --precision bf16 is not offered; use fp16 on A100/A30/A10")
        if backend == "paddle-gpu" and precision == "int8":
            raise UnsupportedError("--backend paddle-gpu --precision int8: int8 on GPU runs through TensorRT; "
                                   "use --backend trt --precision int8")
        gpu_precision = "Half" if (backend == "paddle-gpu" and precision == "fp16") else "Float32"
        calls += [_call("enable_use_gpu", int(gpu_mem_mb), int(gpu_id), precision_mode=gpu_precision),
                  _call("switch_ir_optim", True)]
        if backend == "trt":
            plan.update(T.trt_plan(meta, files, precision, calls, batch_size=batch_size, gpu_id=gpu_id,
                                   cache_dir=cache_dir, shape_source=shape_source, shape_file=shape_file,
                                   trt_max_batch=trt_max_batch, workspace_bytes=workspace_bytes,
                                   min_subgraph_size=min_subgraph_size, quantized=quantized,
                                   pir_trt_available=pir_trt_available))
            return plan
        plan["engine"] = "cuda"
        notes.append(f"engine cuda: Paddle GPU kernels, {'fp16 mixed precision' if precision == 'fp16' else 'fp32'}")
    elif backend == "onnxruntime":
        if precision != "fp32":
            raise UnsupportedError(f"--backend onnxruntime --precision {precision}: only fp32 is offered here")
        plan["engine"] = "onnxruntime"
        notes.append(f"onnxruntime CPUExecutionProvider, {threads} intra-op thread(s)")
    return plan


_ALIASES = {"enable_onednn": "enable_mkldnn", "enable_onednn_bfloat16": "enable_mkldnn_bfloat16",
            "enable_onednn_int8": "enable_mkldnn_int8"}


def apply_plan(config, calls: Sequence[dict]):
    """Apply plan calls to a ``paddle.inference.Config`` (resolving precision names and the
    onednn/mkldnn method names of older Paddle releases)."""
    from paddle.inference import PrecisionType
    for step in calls:
        name = step["call"]
        if not hasattr(config, name) and name in _ALIASES:
            name = _ALIASES[name]
        kwargs = dict(step["kwargs"])
        for key in ("precision_mode", "inference_precision"):
            if key in kwargs:
                kwargs[key] = getattr(PrecisionType, kwargs[key])
        getattr(config, name)(*step["args"], **kwargs)
    return config


def check_backend_available(backend: str) -> None:
    if backend in ("paddle-gpu", "trt"):
        import paddle
        if not paddle.is_compiled_with_cuda():
            raise UnsupportedError(f"--backend {backend}: this Paddle {paddle.__version__} build has no CUDA "
                                   f"(CPU-only); install paddlepaddle-gpu (with TensorRT for trt) on the GPU host, "
                                   f"or use --backend paddle-cpu/onnxruntime")
        if backend == "trt":
            from paddle.inference import get_trt_compile_version
            if tuple(get_trt_compile_version()) == (0, 0, 0):
                raise UnsupportedError("--backend trt: this Paddle build was compiled without TensorRT")
    if backend == "onnxruntime":
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            raise UnsupportedError("--backend onnxruntime: pip install onnxruntime") from None


# --------------------------------------------------------------------------------------------
# Predictors
# --------------------------------------------------------------------------------------------

class _executor_flags:
    """Temporarily set ``FLAGS_new_executor_serial_run`` (restored on exit)."""

    def __init__(self, serial: bool):
        self.serial = serial

    def __enter__(self):
        if self.serial:
            import paddle
            self.previous = paddle.get_flags(["FLAGS_new_executor_serial_run"])["FLAGS_new_executor_serial_run"]
            paddle.set_flags({"FLAGS_new_executor_serial_run": True})
        return self

    def __exit__(self, *exc):
        if self.serial:
            import paddle
            paddle.set_flags({"FLAGS_new_executor_serial_run": self.previous})
        return False


class PaddlePredictor:
    """Paddle Inference predictor built from :func:`build_plan`. ``run(feeds) -> [outputs]``
    (host arrays in, host arrays out: the copies are part of the timed network call)."""

    def __init__(self, model_dir: str, backend: str = "paddle-cpu", precision: str = "fp32",
                 threads: Optional[int] = None, batch_size: int = 1, meta: Optional[dict] = None,
                 sample_feeds: Optional[List[Dict[str, np.ndarray]]] = None, tuned_cpu: bool = True,
                 plan: Optional[dict] = None, **plan_kwargs):
        """``plan``: a :func:`build_plan` result to use as is (backend/precision/kwargs then unused)."""
        check_backend_available(plan["backend"] if plan else backend)
        import paddle.inference as pi
        self.meta = meta or load_meta(model_dir)
        self.files = model_files(model_dir, self.meta)
        self.plan = plan or build_plan(self.meta, self.files, backend, precision, threads=threads,
                                       batch_size=batch_size, tuned_cpu=tuned_cpu, **plan_kwargs)
        # The PIR executor otherwise schedules ops through a worker thread pool: on few (shared)
        # cores that costs context switches for no parallelism (measured in
        # ppdlx/benchmarks/infer.py). The flag is read when the executor is built (creation and
        # first run), so it is set around those only and other predictors keep their own mode.
        self._serial_run = self.plan["backend"] == "paddle-cpu" and tuned_cpu and self.files["format"] == "pir"
        self._built = False
        if self.plan["pir_trt"]:
            self.plan["tensorrt_engines"] = T.convert_pir_trt(self.plan["pir_trt"], sample_feeds)
        if self.plan["collect_calls"]:
            self._collect_shapes(pi, sample_feeds)
        config = pi.Config(self.plan["model_file"], self.plan["params_file"])
        apply_plan(config, self.plan["calls"])
        config.disable_glog_info()
        self.config = config
        with _executor_flags(self._serial_run):
            self.predictor = pi.create_predictor(config)
        self.input_names = list(self.predictor.get_input_names())
        self.output_names = list(self.predictor.get_output_names())
        self._inputs = {n: self.predictor.get_input_handle(n) for n in self.input_names}
        self._outputs = [self.predictor.get_output_handle(n) for n in self.output_names]

    def _collect_shapes(self, pi, sample_feeds):
        if not sample_feeds:
            raise DeployError("--trt-shapes collect needs sample inputs (--input images)")
        shape_file = self.plan["shape_file"]
        os.makedirs(os.path.dirname(os.path.abspath(shape_file)), exist_ok=True)
        config = pi.Config(self.plan["model_file"], self.plan["params_file"])
        apply_plan(config, self.plan["collect_calls"])
        predictor = pi.create_predictor(config)
        for feeds in sample_feeds:
            for name in predictor.get_input_names():
                h = predictor.get_input_handle(name)
                h.reshape(list(feeds[name].shape))
                h.copy_from_cpu(np.ascontiguousarray(feeds[name]))
            predictor.run()
        del predictor  # the shape file is written when the collecting predictor is destroyed

    def run(self, feeds: Dict[str, np.ndarray]) -> List[np.ndarray]:
        for name, handle in self._inputs.items():
            array = feeds[name]
            handle.reshape(list(array.shape))
            handle.copy_from_cpu(array)
        if self._built:
            self.predictor.run()
        else:
            with _executor_flags(self._serial_run):
                self.predictor.run()
            self._built = True
            if self.plan["engine"] == T.SUBGRAPH:  # the subgraph pass has built (or loaded) its engines by now
                self.plan["tensorrt_engines"] = T.subgraph_engine_count(self.plan)
        return [h.copy_to_cpu() for h in self._outputs]


class OnnxPredictor:
    def __init__(self, model_dir: str, threads: Optional[int] = None, meta: Optional[dict] = None,
                 onnx_file: Optional[str] = None):
        check_backend_available("onnxruntime")
        import onnxruntime as ort
        self.meta = meta or load_meta(model_dir)
        onnx_file = onnx_file or os.path.join(model_dir, self.meta["model"].get("onnx_file") or "inference.onnx")
        if not os.path.isfile(onnx_file):
            raise DeployError(f"{onnx_file}: not found (export with tools/export_model.py --onnx)")
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(threads or default_threads())
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        self.session = ort.InferenceSession(onnx_file, options, providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.plan = {"backend": "onnxruntime", "engine": "onnxruntime", "precision": "fp32",
                     "threads": options.intra_op_num_threads,
                     "notes": [f"onnxruntime {ort.__version__} CPUExecutionProvider, ORT_ENABLE_ALL, "
                               f"{options.intra_op_num_threads} intra-op thread(s)"]}

    def run(self, feeds: Dict[str, np.ndarray]) -> List[np.ndarray]:
        return self.session.run(None, {n: feeds[n] for n in self.input_names})


def create_predictor(model_dir: str, backend: str, precision: str = "fp32", **kwargs):
    if backend == "onnxruntime":
        if precision != "fp32":
            raise UnsupportedError(f"--backend onnxruntime --precision {precision}: only fp32 is offered here")
        return OnnxPredictor(model_dir, threads=kwargs.get("threads"), meta=kwargs.get("meta"))
    return PaddlePredictor(model_dir, backend, precision, **kwargs)


# --------------------------------------------------------------------------------------------
# Post-processing
# --------------------------------------------------------------------------------------------

def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def topk_classes(output: np.ndarray, k: int, is_logits: bool):
    probs = softmax(output) if is_logits else output
    k = min(k, probs.shape[-1])
    idx = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
    return idx, np.take_along_axis(probs, idx, axis=-1)


def postprocess(meta: dict, outputs: List[np.ndarray], topk: int = 5, score_threshold: Optional[float] = None):
    """Per image: classification -> [(class_id, label, prob)], detection -> [(box, score, class_id, label)]."""
    labels = meta.get("labels")
    name = (lambda c: labels[c] if labels and 0 <= c < len(labels) else str(c))
    if meta["model"]["family"] == "classification":
        is_logits = meta["postprocess"].get("output", "logits") == "logits"
        idx, probs = topk_classes(outputs[0], topk, is_logits)
        return [[(int(c), name(int(c)), float(p)) for c, p in zip(ci, pi)] for ci, pi in zip(idx, probs)]
    roles = [o["role"] for o in meta["outputs"]]
    out = dict(zip(roles, outputs))
    thr = meta["postprocess"].get("score_threshold", 0.4) if score_threshold is None else score_threshold
    results = []
    for boxes, scores, classes, count in zip(out["boxes"], out["scores"], out["classes"], out["count"]):
        keep = [i for i in range(int(count)) if scores[i] >= thr]
        results.append([(boxes[i].tolist(), float(scores[i]), int(classes[i]), name(int(classes[i]))) for i in keep])
    return results


def draw_detections(img: Image.Image, detections, path: str) -> None:
    img = img.copy()
    draw = ImageDraw.Draw(img)
    for box, score, _, label in detections:
        draw.rectangle(box, outline=(255, 0, 0), width=2)
        draw.text((box[0] + 2, box[1] + 2), f"{label} {score:.2f}", fill=(255, 0, 0))
    img.save(path)


# --------------------------------------------------------------------------------------------
# Benchmark
# --------------------------------------------------------------------------------------------

def latency_stats(seconds: Sequence[float]) -> dict:
    """mean and TRUE percentiles (numpy.percentile, linear) of per-batch times, in ms."""
    ms = np.asarray(seconds, np.float64) * 1000.0
    p50, p90, p95, p99 = np.percentile(ms, [50, 90, 95, 99])
    return {"mean": float(ms.mean()), "p50": float(p50), "p90": float(p90), "p95": float(p95), "p99": float(p99)}


def time_networks(predictors: Dict[str, object], feeds: Dict[str, np.ndarray], warmup: int, repeats: int) -> dict:
    """Per-batch network times (host->device copy, run, device->host copy) for each predictor.
    With several predictors the repeats are interleaved (A, B, A, B, ...) so that load from other
    processes hits every case alike; warm-up runs are not timed."""
    for predictor in predictors.values():
        for _ in range(warmup):
            predictor.run(feeds)
    times = {case: [] for case in predictors}
    for _ in range(repeats):
        for case, predictor in predictors.items():
            start = time.perf_counter()
            predictor.run(feeds)
            times[case].append(time.perf_counter() - start)
    return times


def benchmark(predictors: Dict[str, object], meta: dict, images: Sequence[str], batch_sizes: Sequence[int],
              warmup: int, repeats: int, synthetic: bool = False) -> List[dict]:
    """Rows per (case, batch size): network throughput and latency (true percentiles, warm-up
    excluded), with host pre-processing (decode + resize + normalise) and post-processing
    (softmax + top-k, or reading detections) timed separately."""
    prep = Preprocessor(meta)
    rows = []
    for bs in batch_sizes:
        pre_times, feeds = [], None
        if synthetic or not images:
            rng = np.random.default_rng(bs)
            feeds = {}
            for spec in meta["inputs"]:
                shape = [bs] + list(spec["shape"][1:])
                feeds[spec["name"]] = (np.ones(shape, np.float32) if spec.get("role") == "scale"
                                       else rng.standard_normal(shape).astype(np.float32))
        else:
            paths = [images[i % len(images)] for i in range(bs)]
            for _ in range(max(3, min(repeats, 20))):
                start = time.perf_counter()
                feeds = prep.feeds([load_image(p) for p in paths])
                pre_times.append(time.perf_counter() - start)
        times = time_networks(predictors, feeds, warmup, repeats)
        for case, predictor in predictors.items():
            outputs = predictor.run(feeds)
            post_times = []
            for _ in range(max(3, min(repeats, 20))):
                start = time.perf_counter()
                postprocess(meta, outputs)
                post_times.append(time.perf_counter() - start)
            lat = latency_stats(times[case])
            row = {"case": case, "engine": predictor.plan.get("engine"), "batch_size": int(bs),
                   "images_per_s": bs * 1000.0 / lat["mean"],
                   "latency_ms": lat, "repeats": int(repeats), "warmup": int(warmup),
                   "host_postprocess_ms": latency_stats(post_times)}
            if pre_times:
                row["host_preprocess_ms"] = latency_stats(pre_times)
                total = lat["mean"] + row["host_preprocess_ms"]["mean"] + row["host_postprocess_ms"]["mean"]
                row["end_to_end_images_per_s"] = bs * 1000.0 / total
            rows.append(row)
    return rows


def format_rows(rows: Sequence[dict]) -> str:
    """A table like the anchor's README: BS | img/s | avg | p50 | p90 | p95 | p99 (ms) + host,
    with the case and the engine that ran it."""
    header = ["case", "engine", "BS", "img/s", "avg ms", "p50", "p90", "p95", "p99", "pre ms", "post ms"]
    lines = []
    for r in rows:
        lat = r["latency_ms"]
        pre = r.get("host_preprocess_ms", {}).get("mean")
        lines.append([r["case"], str(r.get("engine") or "-"), str(r["batch_size"]), f"{r['images_per_s']:.2f}",
                      f"{lat['mean']:.2f}", f"{lat['p50']:.2f}", f"{lat['p90']:.2f}", f"{lat['p95']:.2f}",
                      f"{lat['p99']:.2f}", "-" if pre is None else f"{pre:.2f}",
                      f"{r['host_postprocess_ms']['mean']:.3f}"])
    widths = [max(len(h), *(len(l[i]) for l in lines)) if lines else len(h) for i, h in enumerate(header)]
    out = [" | ".join(h.ljust(w) for h, w in zip(header, widths)), "-+-".join("-" * w for w in widths)]
    out += [" | ".join(c.ljust(w) for c, w in zip(l, widths)) for l in lines]
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", required=True)
    p.add_argument("--input", help="an image or a directory of images")
    p.add_argument("--backend", choices=BACKENDS, default="paddle-cpu")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--threads", type=int, help="CPU threads (default: the cores this process may use)")
    p.add_argument("--topk", type=int, default=5)
    p.add_argument("--cpu-engine", choices=("onednn", "openvino"), default="onednn",
                   help="paddle-cpu: oneDNN kernels, or Paddle Inference's OpenVINO engine (--format program exports)")
    p.add_argument("--score-threshold", type=float, help="detection: draw boxes above this score")
    p.add_argument("--output-dir", help="detection: write images with boxes here")
    p.add_argument("--gpu-id", type=int, default=0)
    p.add_argument("--gpu-mem-mb", type=int, default=256, help="initial GPU memory pool (MB)")
    p.add_argument("--trt-cache-dir", help="TRT engine/optimisation cache (default: MODEL_DIR/_trt_cache)")
    p.add_argument("--trt-shapes", choices=("yml", "collect"), default="yml",
                   help="dynamic shape ranges from inference.yml, or collected by running the --input images")
    p.add_argument("--trt-max-batch", type=int, help="override the max batch of the TRT shape range")
    p.add_argument("--trt-workspace-bytes", type=int, help="TRT workspace in BYTES (default 1<<30)")
    p.add_argument("--calib-dir", help="trt int8 (non-quantised model): calibration images")
    p.add_argument("--calib-batches", type=int, default=32)
    p.add_argument("--benchmark", action="store_true")
    p.add_argument("--synthetic", action="store_true", help="benchmark on random inputs (no host pre-processing)")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--repeats", type=int, default=100)
    p.add_argument("--batch-sizes", default=None, help="benchmark batch sizes, e.g. 1,8 (default --batch-size)")
    p.add_argument("--report", help="benchmark: write JSON rows here")
    return p.parse_args(argv)


def plan_options(args) -> dict:
    """The predictor options given on the command line (everything but backend and precision)."""
    return dict(threads=args.threads, batch_size=args.batch_size, cpu_engine=args.cpu_engine, gpu_id=args.gpu_id,
                gpu_mem_mb=args.gpu_mem_mb, cache_dir=args.trt_cache_dir, shape_source=args.trt_shapes,
                trt_max_batch=args.trt_max_batch, workspace_bytes=args.trt_workspace_bytes)


def calibration_plan(args, meta: dict) -> dict:
    """The int8 TRT plan for the command line's model and options: the calibrating predictor uses
    it, and the serving predictor's plan is the same, so the table matches the engines it serves."""
    return build_plan(meta, model_files(args.model_dir, meta), "trt", "int8", **plan_options(args))


def _calibrate(args, meta, plan, sample_feeds=None):
    """Paddle-TRT int8 post-training calibration: run calibration batches through a predictor in
    calibration mode; the table is written into the cache dir when that predictor is destroyed,
    and the next predictor with the same plan builds int8 engines from it."""
    prep = Preprocessor(meta)
    predictor = PaddlePredictor(args.model_dir, meta=meta, plan=plan, sample_feeds=sample_feeds)
    files = list_images(args.calib_dir)
    for i in range(min(args.calib_batches, max(1, len(files) // args.batch_size))):
        batch = files[i * args.batch_size:(i + 1) * args.batch_size] or files[:args.batch_size]
        predictor.run(prep.feeds([load_image(p) for p in batch]))
    del predictor
    if not trt_calibration_tables(plan["cache_dir"]):
        raise UnsupportedError(f"--calib-dir: the calibration run wrote no table (trt_calib_*) into "
                               f"{plan['cache_dir']}, so TensorRT did not run; int8 would not be served")


def main(argv=None) -> int:
    args = parse_args(argv)
    meta = load_meta(args.model_dir)
    check_backend_available(args.backend)
    paths = list_images(args.input) if args.input else []
    if not paths and not (args.benchmark and args.synthetic):
        raise DeployError("--input is required (or --benchmark --synthetic)")
    prep = Preprocessor(meta)
    sample_feeds = None
    if args.backend == "trt" and args.trt_shapes == "collect":
        if not paths:
            raise DeployError("--trt-shapes collect runs real inputs: give --input images")
        sizes = sorted({1, args.batch_size, *(int(b) for b in (args.batch_sizes or "").split(",") if b)})
        sample_feeds = [prep.feeds([load_image(paths[i % len(paths)]) for i in range(bs)]) for bs in sizes]
    if args.backend == "trt" and args.precision == "int8":
        plan = calibration_plan(args, meta)
        if plan["calibration"] and not trt_calibration_tables(plan["cache_dir"]):
            if not args.calib_dir:
                raise DeployError("--precision int8 on a non-quantised model needs --calib-dir IMAGES once "
                                  f"(no calibration table in {plan['cache_dir']})")
            _calibrate(args, meta, plan, sample_feeds)
    if args.backend == "onnxruntime":
        predictor = create_predictor(args.model_dir, args.backend, args.precision, threads=args.threads, meta=meta)
    else:
        predictor = create_predictor(args.model_dir, args.backend, args.precision, meta=meta,
                                     sample_feeds=sample_feeds, **plan_options(args))
    for note in predictor.plan["notes"]:
        print(f"# {note}", file=sys.stderr)
    if args.benchmark:
        sizes = [int(b) for b in (args.batch_sizes or str(args.batch_size)).split(",") if b]
        case = f"{args.backend}-{args.precision}"
        rows = benchmark({case: predictor}, meta, paths, sizes, args.warmup, args.repeats, args.synthetic)
        print(format_rows(rows))
        if args.report:
            os.makedirs(os.path.dirname(os.path.abspath(args.report)) or ".", exist_ok=True)
            with open(args.report, "w", encoding="utf-8") as f:
                json.dump({"model_dir": os.path.abspath(args.model_dir), "model": meta["model"],
                           "engine": predictor.plan["engine"],
                           "tensorrt_engines": predictor.plan.get("tensorrt_engines"),
                           "notes": predictor.plan["notes"], "rows": rows}, f, indent=2)
        return 0
    family = meta["model"]["family"]
    for start in range(0, len(paths), args.batch_size):
        batch = paths[start:start + args.batch_size]
        images = [load_image(p) for p in batch]
        results = postprocess(meta, predictor.run(prep.feeds(images)), args.topk, args.score_threshold)
        if start == 0 and predictor.plan.get("tensorrt_engines"):
            print(f"# engine {predictor.plan['engine']}: {predictor.plan['tensorrt_engines']} TensorRT engine(s)",
                  file=sys.stderr)
        for path, img, res in zip(batch, images, results):
            if family == "classification":
                print(f"{path}: " + ", ".join(f"{label} (id {c}) {p:.4f}" for c, label, p in res))
            else:
                print(f"{path}: {len(res)} detections" + "".join(
                    f"\n  {label} (id {c}) {s:.3f} [{', '.join(f'{v:.1f}' for v in box)}]" for box, s, c, label in res))
                if args.output_dir:
                    os.makedirs(args.output_dir, exist_ok=True)
                    draw_detections(img, res, os.path.join(args.output_dir, os.path.basename(path)))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except DeployError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
