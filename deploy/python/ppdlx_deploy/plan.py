"""A predictor configuration as data: which engine runs the network for a backend/precision on
this machine and build, and the ``paddle.inference.Config`` calls that select it (applied by
:func:`ppdlx_deploy.config_calls.apply_plan`). Every refusal is one line naming the fix."""
from __future__ import annotations

import os
from typing import Optional

from .config_calls import plan_call
from .errors import DeployError, UnsupportedError
from .meta import is_quantized
from .trt import trt_plan

BACKENDS = ("paddle-cpu", "paddle-gpu", "trt", "onnxruntime")
PRECISIONS = ("fp32", "fp16", "bf16", "int8")


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
        calls += [plan_call("disable_gpu"), plan_call("enable_onednn"),
                  plan_call("set_cpu_math_library_num_threads", int(threads)),
                  plan_call("switch_ir_optim", True)]
        if precision == "bf16":
            calls.append(plan_call("enable_onednn_bfloat16"))
        if precision == "int8":
            calls.append(plan_call("enable_onednn_int8"))
        if files["format"] == "program" and tuned_cpu:
            # A legacy .pdmodel runs through the classic analysis passes and executor, which
            # fuse conv+bn+relu(+add) for oneDNN and measured faster than translating it to PIR.
            calls.append(plan_call("enable_new_ir", False))
        if cpu_engine == "openvino":
            if files["format"] != "program" or precision != "fp32":
                raise UnsupportedError("--cpu-engine openvino: Paddle Inference ignores the OpenVINO engine for "
                                       "PIR (.json) models; export with --format program (fp32 only)")
            calls.append(plan_call("enable_openvino_engine", inference_precision="Float32"))
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
        calls += [plan_call("enable_use_gpu", int(gpu_mem_mb), int(gpu_id), precision_mode=gpu_precision),
                  plan_call("switch_ir_optim", True)]
        if backend == "trt":
            plan.update(trt_plan(meta, files, precision, calls, batch_size=batch_size, gpu_id=gpu_id,
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
