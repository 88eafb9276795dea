"""Benchmarks behind ``tools/benchmark.py <kind>``, with their one-off ``diagnostics/`` and measured ``results/``.

Each kind is a module here exposing ``add_arguments(parser)`` and
``run(args) -> {"rows": [...], ...}`` (optionally ``"threads"``: the thread
settings it ran with); the CLI adds ``machine`` facts (:func:`machine_facts`: CPU
model, vendor, flags and cores, library versions, thread environment), prints a
table and writes the JSON report. Ratios are measured within one run because
this kind of machine is noisy.

Harnesses of the tool, not of the library (ppdlx ships without them): like a tool they import paddle only once
the process has set what must be set before it loads (``ppdlx.cpu_env``), and the worker processes they start
(``python -m benchmarks.<kind>``, :func:`worker_env`) set their own.
"""
from __future__ import annotations

import ctypes
import glob
import importlib.metadata
import importlib.util
import os
import platform

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout this package is part of

KINDS = {
    "train": "benchmarks.train",
    "loader": "benchmarks.loader",
    "infer": "benchmarks.infer",
    "profile": "benchmarks.profile",
    "serve": "benchmarks.serve",
}

# Distributions whose versions a speed figure depends on (absent ones are left out).
LIBRARIES = ("paddlepaddle", "paddlepaddle-gpu", "onnxruntime", "onnxruntime-openvino", "torch", "numpy",
             "paddle2onnx", "nvidia-dali-cuda120", "onednn-devel")


class _OneDNNVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_int), ("minor", ctypes.c_int), ("patch", ctypes.c_int), ("hash", ctypes.c_char_p),
                ("cpu_runtime", ctypes.c_uint), ("gpu_runtime", ctypes.c_uint)]


def _paddle_libs_dir():
    spec = importlib.util.find_spec("paddle")
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(list(spec.submodule_search_locations)[0], "libs")


def onednn_version():
    """The oneDNN that Paddle's wheel carries (``dnnl_version()`` of paddle/libs/libdnnl.so.*), or None."""
    libs = _paddle_libs_dir()
    found = sorted(glob.glob(os.path.join(libs, "libdnnl.so*"))) if libs else []
    if not found:
        return None
    try:
        lib = ctypes.CDLL(found[0])
        lib.dnnl_version.restype = ctypes.POINTER(_OneDNNVersion)
        v = lib.dnnl_version().contents
    except (OSError, AttributeError):
        return None
    return f"{v.major}.{v.minor}.{v.patch} ({(v.hash or b'').decode()[:10]})"


def library_versions() -> dict:
    """Installed versions of :data:`LIBRARIES` (read from the package metadata: nothing is
    imported), oneDNN in Paddle's wheel, and the OpenVINO runtime Paddle Inference ships."""
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    versions["onednn (paddle)"] = onednn_version()
    libs = _paddle_libs_dir()
    openvino = sorted(glob.glob(os.path.join(libs, "libopenvino.so.*"))) if libs else []
    if openvino:
        versions["openvino (paddle)"] = os.path.basename(openvino[0])
    return versions


def machine_facts() -> dict:
    """What a speed figure depends on: the CPU (model, vendor, the flags that select kernels,
    cores and this process's affinity), library versions and the thread settings."""
    import paddle
    import ppdlx
    from ppdlx.cpu_features import cpu_features, thread_environment
    cpu = cpu_features()
    return {"platform": platform.platform(), "python": platform.python_version(), "cpu_count": os.cpu_count(),
            "cpu": cpu.get("model_name"), "cpu_features": cpu, "paddle": paddle.__version__,
            "cuda": paddle.is_compiled_with_cuda(),
            "libraries": library_versions(), "MKL_DEBUG_CPU_TYPE": os.environ.get("MKL_DEBUG_CPU_TYPE"),
            "threads": {"environment": thread_environment(), "environment_given": ppdlx.THREAD_ENV_GIVEN,
                        "mkl_debug_cpu_type_detected": ppdlx.MKL_DEBUG_CPU_TYPE_DETECTED},
            "load_average": list(os.getloadavg())}


def add_config_and_steps(parser, steps: int, steps_help: str, warmup: int, warmup_help: str) -> None:
    """``-c CONFIG [-o KEY=VALUE ...] --steps N --warmup N``: what the kinds that time training steps take."""
    parser.add_argument("-c", "--config", required=True)
    parser.add_argument("-o", "--override", action="append", nargs="+", default=[])
    parser.add_argument("--steps", type=int, default=steps, help=steps_help)
    parser.add_argument("--warmup", type=int, default=warmup, help=warmup_help)


def worker_env(env=None) -> dict:
    """``env`` (default: this process's environment) with the checkout on ``PYTHONPATH`` after what is there:
    a worker started as ``python -m benchmarks.<kind>`` imports this package from any directory (and an
    installed ppdlx first, as the tools do)."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([p for p in [env.get("PYTHONPATH")] if p] + [ROOT])
    return env


def format_table(rows) -> str:
    if not rows:
        return "(no rows)"
    keys = []
    for row in rows:
        for k in row:
            if k not in keys and not isinstance(row[k], (dict, list)):
                keys.append(k)
    cells = [[_fmt(row.get(k, "")) for k in keys] for row in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    lines = ["  ".join(k.ljust(w) for k, w in zip(keys, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(cell, widths)) for cell in cells]
    return "\n".join(lines)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}"
    return str(v)
