"""A predictor configuration as data: which engine runs the network for a backend/precision on
this machine and build, and the ``paddle.inference.Config`` calls that select it (applied by
:func:`ppdlx_deploy.config_calls.apply_plan`). Every refusal is one line naming the fix."""
from __future__ import annotations

import importlib.util
import os
from typing import Optional

from .cpu import cpu_features, has_bf16, has_vnni
from .config_calls import plan_call
from .errors import DeployError, UnsupportedError
from .meta import is_quantized, onnx_precision
from .postprocess import decodes_boxes
from .trt import trt_plan

# "auto" (the command line's default): the fastest CPU runtime on this machine whose outputs agree with
# the export's, measured once and cached (ppdlx_deploy.tuning); built plans always name a concrete backend.
BACKENDS = ("auto", "paddle-cpu", "paddle-gpu", "trt", "onnxruntime", "openvino")
# What --backend auto chooses among, when installed and the export has their files.
CPU_RUNTIMES = ("paddle-cpu", "onnxruntime", "openvino")
# "auto" (paddle-cpu): fp32, or bf16 where the CPU has bf16 hardware AND it measured faster
# here (ppdlx_deploy.tuning); built plans always carry a concrete precision.
PRECISIONS = ("fp32", "fp16", "bf16", "int8", "auto")

# Paddle-CPU settings that could close the gap to onnxruntime, by name (joined with "+"):
# tools/benchmark.py infer times each in its own process and cpu_plan="auto" picks the fastest on
# this machine (ppdlx_deploy.tuning). "default" is what a predictor uses unless told otherwise.
CPU_VARIANTS = {
    "default": {},
    "memory-optim": {"memory_optim": True},      # reuse activation buffers (smaller working set)
    "new-executor": {"executor": "new"},        # .pdmodel on the interpreter core instead of the naive executor
    "mkl-fc": {"onednn_fc": False},             # fully connected layers on MKL's sgemm instead of oneDNN
    "openvino": {"cpu_engine": "openvino"},     # Paddle Inference's OpenVINO engine (.pdmodel, fp32)
    "untuned": {"tuned_cpu": False},            # Paddle's own defaults (shows what the tuning buys)
}


def cpu_variant_options(variant: Optional[str]) -> dict:
    """build_plan keyword arguments of a variant name such as ``"memory-optim+mkl-fc"``."""
    options = {}
    for name in (variant or "default").split("+"):
        if name not in CPU_VARIANTS:
            raise DeployError(f"cpu variant {name!r}: choose from {', '.join(CPU_VARIANTS)} (joined with '+')")
        options.update(CPU_VARIANTS[name])
    return options


def cpu_variants_for(fmt: str, precision: str) -> list:
    """The variants that apply to an export format (``program``/``pir``) and precision."""
    names = ["default", "mkl-fc"]
    if fmt == "program":
        # a PIR program always runs on the interpreter core, and Paddle's predictor finds no
        # memory_optimize_pass result for it (create_predictor fails)
        names += ["memory-optim", "new-executor"]
        if precision == "fp32":
            names.append("openvino")
    return names


def cpu_flags() -> set:
    """The flags of :data:`ppdlx_deploy.cpu.FLAGS_THAT_MATTER` this CPU has."""
    return set(cpu_features()["flags"])


def cpu_has_bf16(flags: Optional[set] = None) -> bool:
    return has_bf16({"flags": cpu_flags() if flags is None else flags})


def default_threads() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def build_plan(meta: dict, files: dict, backend: str, precision: str, *, threads: Optional[int] = None,
               batch_size: int = 1, gpu_id: int = 0, gpu_mem_mb: int = 256, cache_dir: Optional[str] = None,
               shape_source: str = "yml", shape_file: Optional[str] = None, trt_max_batch: Optional[int] = None,
               workspace_bytes: Optional[int] = None, min_subgraph_size: Optional[int] = None,
               quantized: Optional[bool] = None, cpu_flag_set: Optional[set] = None, tuned_cpu: bool = True,
               cpu_engine: str = "onednn", pir_trt_available: Optional[bool] = None,
               cpu_variant: Optional[str] = None, executor: str = "auto", memory_optim: bool = False,
               onednn_fc: bool = True, trt_environment: Optional[dict] = None) -> dict:
    """The ``paddle.inference.Config`` calls for a backend/precision, as data (nothing is built;
    paddle is imported only to read a .pdmodel's op list when ``quantized`` is not given, to
    probe ``paddle.tensorrt`` for a PIR export on ``trt`` when ``pir_trt_available`` is not given,
    and to read the GPU / TensorRT / Paddle versions of a subgraph engine's cache key when
    ``trt_environment`` is not given).

    Returns ``{"engine", "calls", "collect_calls", "notes", "model_file", "params_file", ...}``:
    ``engine`` is what runs the network (onednn, openvino, cuda, paddle-trt-subgraph, pir-trt,
    onnxruntime), ``model_file``/``params_file`` what the predictor loads (for pir-trt the
    converted program, described by ``pir_trt``). A call is ``{"call": method, "args": [...],
    "kwargs": {...}}``; precision enums are written as the ``PrecisionType`` member name
    ("Float32", "Half", "Int8") and resolved by :func:`apply_plan`.

    paddle-cpu settings: ``cpu_variant`` (a :data:`CPU_VARIANTS` name, or several joined with
    "+") sets the ones below it; ``executor`` ``auto`` (a .pdmodel on the naive executor, a PIR
    program on the interpreter core run serially) or ``new`` (a .pdmodel on the interpreter core);
    ``memory_optim`` reuses activation buffers; ``onednn_fc=False`` leaves fully connected layers
    to MKL. ``cpu_flag_set`` (flags as in /proc/cpuinfo) replaces this CPU's for the checks.
    """
    if cpu_variant is not None:
        variant = cpu_variant_options(cpu_variant)
        tuned_cpu = variant.get("tuned_cpu", tuned_cpu)
        cpu_engine = variant.get("cpu_engine", cpu_engine)
        executor = variant.get("executor", executor)
        memory_optim = variant.get("memory_optim", memory_optim)
        onednn_fc = variant.get("onednn_fc", onednn_fc)
    if backend not in BACKENDS:
        raise DeployError(f"--backend {backend}: choose one of {', '.join(BACKENDS)}")
    if precision not in PRECISIONS:
        raise DeployError(f"--precision {precision}: choose one of {', '.join(PRECISIONS)}")
    if backend == "auto":
        raise UnsupportedError("--backend auto is resolved by create_predictor (it measures); build_plan needs a "
                               "backend")
    if precision == "auto":
        raise UnsupportedError(f"--backend {backend} --precision auto: auto is offered for paddle-cpu only, "
                               f"where the predictor measures fp32 against bf16; name a precision"
                               if backend != "paddle-cpu" else
                               "--precision auto is resolved by create_predictor (it measures); build_plan needs "
                               "fp32 or bf16")
    calls, notes = [], []
    threads = threads or default_threads()
    if quantized is None:
        quantized = is_quantized(files["model_file"])
    plan = {"backend": backend, "precision": precision, "threads": threads, "calls": calls, "collect_calls": None,
            "notes": notes, "shape_file": shape_file, "model_file": files["model_file"],
            "params_file": files["params_file"], "pir_trt": None, "calibration": False,
            "tuned_cpu": tuned_cpu, "cpu_variant": cpu_variant or "default", "graph": "program"}

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
        if precision == "int8" and files["format"] != "program":
            # Paddle Inference's PIR oneDNN passes drop quantize ops and keep no int8 op list: fp32 in disguise.
            raise UnsupportedError("--backend paddle-cpu --precision int8: a PIR (.json) program runs its quantize "
                                   "ops in fp32 on oneDNN; quantize a --format program export (tools/quantize.py)")
        if executor not in ("auto", "new"):
            raise DeployError(f"executor {executor!r}: choose auto or new")
        if executor == "new" and files["format"] != "program":
            raise UnsupportedError("executor new: a PIR (.json) program always runs on the interpreter core; "
                                   "the choice is for --format program exports")
        if memory_optim and files["format"] != "program":
            raise UnsupportedError("memory-optim: Paddle's predictor finds no memory_optimize_pass result for a "
                                   "PIR (.json) program and fails; export with --format program")
        calls += [plan_call("disable_gpu"), plan_call("enable_onednn"),
                  plan_call("set_cpu_math_library_num_threads", int(threads)),
                  plan_call("switch_ir_optim", True)]
        if precision == "bf16":
            calls.append(plan_call("enable_onednn_bfloat16"))
        if precision == "int8":
            # The calibration names the ops it quantised; oneDNN's default set also quantises pooling, which
            # fails on some graphs (an s8 input with a u8 output), so the export's list is passed on.
            int8_ops = (meta.get("quantization") or {}).get("onednn_int8_ops")
            calls.append(plan_call("enable_onednn_int8", sorted(int8_ops)) if int8_ops
                         else plan_call("enable_onednn_int8"))
            if not has_vnni({"flags": cpu_flags() if cpu_flag_set is None else cpu_flag_set}):
                notes.append("int8: this CPU has no VNNI (avx512_vnni/avx_vnni/amx_int8), so oneDNN's int8 "
                             "kernels gain little over fp32 here; compare with --precision fp32")
        if files["format"] == "program" and tuned_cpu:
            # A legacy .pdmodel runs through the classic analysis passes and executor, which
            # fuse conv+bn+relu(+add) for oneDNN and measured faster than translating it to PIR.
            calls.append(plan_call("enable_new_ir", False))
        if executor == "new":
            calls.append(plan_call("enable_new_executor", True))
        if memory_optim:
            calls.append(plan_call("enable_memory_optim", True))
        if not onednn_fc:
            calls.append(plan_call("disable_onednn_fc_passes"))
        if cpu_engine == "openvino":
            if files["format"] != "program" or precision != "fp32":
                raise UnsupportedError("--cpu-engine openvino: Paddle Inference ignores the OpenVINO engine for "
                                       "PIR (.json) models; export with --format program (fp32 only)")
            calls.append(plan_call("enable_openvino_engine", inference_precision="Float32"))
            # The engine caches its compiled model in the optimisation cache directory, which is
            # ./__cache__ of the working directory unless set.
            calls.append(plan_call("set_optim_cache_dir", cache_dir or os.path.join(
                os.path.dirname(os.path.abspath(files["model_file"])), "_openvino_cache")))
        plan["engine"] = "paddle-openvino" if cpu_engine == "openvino" else "onednn"
        engine = "OpenVINO (Paddle Inference engine)" if cpu_engine == "openvino" else "oneDNN"
        kind = "PIR program (.json)" if files["format"] == "pir" else "legacy program (.pdmodel)"
        notes.append(f"engine {plan['engine']}: {engine}, {threads} thread(s), IR optimisation on, {kind}"
                     + (", classic passes + executor (enable_new_ir(False))"
                        if files["format"] == "program" and tuned_cpu else "")
                     + (", interpreter core (enable_new_executor)" if executor == "new" else "")
                     + (", memory reuse (enable_memory_optim)" if memory_optim else "")
                     + (", fully connected on MKL (disable_onednn_fc_passes)" if not onednn_fc else ""))
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
        if precision == "fp16" and decodes_boxes(meta):
            # Paddle's auto_mixed_precision_pass (and a TensorRT fp16 engine) runs the anchors' gather and the
            # box decoding in fp16 too: coordinates to the input size round to 0.25-0.5 px
            notes.append("fp16 decodes the boxes in fp16 too (anchor coordinates round to up to 0.5 px at the "
                         "input size): check the AP with tools/export_model.py --verify, or serve fp32")
        if backend == "trt":
            plan.update(trt_plan(meta, files, precision, calls, batch_size=batch_size, gpu_id=gpu_id,
                                 cache_dir=cache_dir, shape_source=shape_source, shape_file=shape_file,
                                 trt_max_batch=trt_max_batch, workspace_bytes=workspace_bytes,
                                 min_subgraph_size=min_subgraph_size, quantized=quantized,
                                 pir_trt_available=pir_trt_available, environment=trt_environment))
            return plan
        plan["engine"] = "cuda"
        notes.append(f"engine cuda: Paddle GPU kernels, {'fp16 mixed precision' if precision == 'fp16' else 'fp32'}")
    elif backend == "onnxruntime":
        if precision != onnx_precision(meta):
            raise UnsupportedError(f"--backend onnxruntime --precision {precision}: this export's ONNX file is "
                                   f"{onnx_precision(meta)} (onnxruntime runs it as written)")
        plan.update(engine="onnxruntime", graph="onnx")
        notes.append(f"onnxruntime CPUExecutionProvider, {threads} intra-op thread(s)")
    elif backend == "openvino":
        if precision not in ("fp32", "bf16"):
            raise UnsupportedError(f"--backend openvino --precision {precision}: choose fp32, or bf16 on a CPU with "
                                   f"avx512_bf16/amx_bf16")
        plan["engine"] = "openvino"
        notes.append(f"OpenVINO CPU plugin, {threads} thread(s)")
    return plan


def runtime_installed(backend: str) -> bool:
    """Whether the package that runs ``backend`` on CPU can be imported here (found, not imported:
    a runtime's libraries and threads load only in the process that runs it)."""
    package = {"paddle-cpu": "paddle", "onnxruntime": "onnxruntime", "openvino": "openvino"}[backend]
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a finder that refuses the name: absent all the same
        return False


def check_backend_available(backend: str) -> None:
    if backend in ("paddle-gpu", "trt"):
        import paddle  # loaded only for the backends that run it: onnxruntime/OpenVINO deployments do without
        if not paddle.is_compiled_with_cuda():
            raise UnsupportedError(f"--backend {backend}: this Paddle {paddle.__version__} build has no CUDA "
                                   f"(CPU-only); install paddlepaddle-gpu (with TensorRT for trt) on the GPU host, "
                                   f"or use --backend paddle-cpu/onnxruntime")
        if backend == "trt":
            from paddle.inference import get_trt_compile_version  # as above: Paddle's backends only
            if tuple(get_trt_compile_version()) == (0, 0, 0):
                raise UnsupportedError("--backend trt: this Paddle build was compiled without TensorRT")
    if backend in ("onnxruntime", "openvino") and not runtime_installed(backend):
        raise UnsupportedError(f"--backend {backend}: pip install {backend}")
