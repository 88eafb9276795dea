"""oneDNN convolution, batch norm, max pool, add + ReLU and fork for CPU dygraph training
(``ppdlx/ops/onednn_kernels.cc``, ``onednn_norm_pool.cc``), as functions on tensors; the layers that use
them pick them when they are built (``ppdlx.layers.conv``, ``ppdlx.layers.norm_act``, ``ppdlx.models.resnet``).

The ops are compiled once per machine with ``paddle.utils.cpp_extension`` against the oneDNN
library inside Paddle's own wheel (``paddle/libs/libdnnl.so.3``, oneDNN 3.6) and the headers of
``onednn-devel==2025.0.0`` (oneDNN 3.6.0; the wheel ships no oneDNN headers). The build lands in
``~/.cache/ppdlx/ops`` (``PPDLX_OPS_CACHE`` overrides) and later runs only load it.
"""
from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import sys
import sysconfig
import types
import warnings
from pathlib import Path

import paddle

with warnings.catch_warnings():  # cpp_extension warns about ccache on import
    warnings.simplefilter("ignore")
    from paddle.utils import cpp_extension

log = logging.getLogger("ppdlx")

SOURCE = Path(__file__).with_name("onednn_kernels.cc")
SOURCES = (SOURCE, SOURCE.with_name("onednn_norm_pool.cc"))
HEADER = SOURCE.with_name("onednn_common.h")
HEADERS_PACKAGE = "onednn-devel==2025.0.0"
_module = None


class OneDNNUnavailable(RuntimeError):
    pass


def _header_dir() -> Path | None:
    for root in (sysconfig.get_paths()["data"], sys.prefix, sys.base_prefix):
        include = Path(root) / "include"
        if (include / "oneapi" / "dnnl" / "dnnl.hpp").is_file():
            return include
    return None


def _paddle_libs() -> Path:
    return Path(paddle.__file__).parent / "libs"


def unavailable_reason() -> str | None:
    """Why the op cannot be built here, or None."""
    if not (_paddle_libs() / "libdnnl.so.3").is_file():
        return f"this Paddle build ships no oneDNN library ({_paddle_libs()}/libdnnl.so.3)"
    if _header_dir() is None:
        return f"the oneDNN headers are not installed (pip install --no-deps {HEADERS_PACKAGE})"
    return None


def build_dir() -> Path:
    code = b"".join(path.read_bytes() for path in (*SOURCES, HEADER))
    digest = hashlib.sha1(code + paddle.__version__.encode()).hexdigest()[:12]
    base = Path(os.environ.get("PPDLX_OPS_CACHE", Path.home() / ".cache" / "ppdlx" / "ops"))
    return base / f"onednn_kernels_{digest}"


def load():
    """The compiled op module (built on first use, under a file lock so that the ranks of one
    job build it once)."""
    global _module
    if _module is not None:
        return _module
    reason = unavailable_reason()
    if reason:
        raise OneDNNUnavailable(reason)
    build = build_dir()
    build.mkdir(parents=True, exist_ok=True)
    with open(build / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        library = build / "ppdlx_onednn_kernels" / "ppdlx_onednn_kernels.so"
        if library.is_file():  # built before: register it (skips ~2 s of compiler and ABI checks)
            cpp_extension.load_op_meta_info_and_register_op(str(library))
        else:
            log.info("building the oneDNN ops once in %s (about 30 s)", build)
            cpp_extension.load(  # compiles, links and registers the op
                name="ppdlx_onednn_kernels", sources=[str(path) for path in SOURCES],
                extra_cxx_cflags=["-O2", "-w"], extra_include_paths=[str(_header_dir())],
                extra_library_paths=[str(_paddle_libs())],
                extra_ldflags=["-l:libdnnl.so.3", f"-Wl,-rpath,{_paddle_libs()}"],
                build_directory=str(build), verbose=False)
    _module = types.SimpleNamespace(conv2d=_op("ppdlx_onednn_conv2d"), batch_norm=_op("ppdlx_onednn_batch_norm"),
                                    max_pool2d=_op("ppdlx_onednn_max_pool2d"), add_relu=_op("ppdlx_onednn_add_relu"),
                                    fork=_op("ppdlx_onednn_fork"))
    return _module


def _op(name):
    def run(x, *args):  # dygraph call of a registered op (what cpp_extension's generated wrapper does)
        if not x.is_contiguous():  # the kernels read the activations' buffer directly
            x = x.contiguous()
        with paddle.profiler.RecordEvent(name):  # the profiler does not record custom forwards itself
            return paddle._C_ops._run_custom_op(name, x, *args)
    return run


def _pair(value):
    return list(value) if isinstance(value, (list, tuple)) else [value, value]


def explicit_paddings(layer) -> list[int] | str:
    """``[top, bottom, left, right]`` of a ``paddle.nn.Conv2D``, or "SAME" (depends on the input
    size: resolved per call like Paddle does)."""
    padding = layer._padding
    if isinstance(padding, str):
        return "SAME" if padding.upper() == "SAME" else [0, 0, 0, 0]
    return four_paddings(padding)


def four_paddings(padding) -> list[int]:
    """An int, ``[h, w]`` or ``[top, bottom, left, right]`` as the last form."""
    if isinstance(padding, int):
        return [padding] * 4
    padding = [int(p) for p in padding]
    if len(padding) == 2:
        return [padding[0], padding[0], padding[1], padding[1]]
    return padding


def same_paddings(size_hw, kernel_hw, stride_hw, dilation_hw) -> list[int]:
    """Paddle's "SAME": output = ceil(input / stride), the extra pixel at the bottom/right."""
    pads = []
    for size, kernel, stride, dilation in zip(size_hw, kernel_hw, stride_hw, dilation_hw):
        total = max((-(-size // stride) - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
        pads += [total // 2, total - total // 2]
    return pads


def conv2d(x, weight, stride, paddings, dilation, groups, channels_last, bf16: bool = False,
           out_bf16: bool = False):
    """``paddle.nn.functional.conv2d`` (no bias) through oneDNN; ``paddings`` as
    ``[top, bottom, left, right]`` or "SAME". ``bf16``: computed in bfloat16 (for CPUs with bf16
    hardware), from a float32 or bfloat16 ``x`` (its gradient has its type) and float32 filters,
    the output float32, or bfloat16 with ``out_bf16``."""
    op = load().conv2d
    stride, dilation = _pair(stride), _pair(dilation)
    if isinstance(paddings, str):
        size = x.shape[1:3] if channels_last else x.shape[2:4]
        paddings = same_paddings(size, weight.shape[2:4], stride, dilation)
    return op(x, weight, stride, list(paddings), dilation, groups, channels_last, not x.stop_gradient, bf16,
              out_bf16)[0]


def batch_norm_train(x, bn, fuse_relu: bool, channels_last: bool):
    """Training-mode ``paddle.nn.BatchNorm2D`` (+ ReLU when ``fuse_relu``) through oneDNN in one
    pass, float32 or bfloat16 ``x`` (the output has its type); updates ``bn``'s running statistics
    like Paddle does (biased batch variance)."""
    y, mean, variance, _ = load().batch_norm(x, bn.weight, bn.bias, float(bn._epsilon), channels_last, fuse_relu)
    with paddle.no_grad():
        momentum = bn._momentum
        paddle.assign(bn._mean * momentum + mean * (1.0 - momentum), bn._mean)
        paddle.assign(bn._variance * momentum + variance * (1.0 - momentum), bn._variance)
    return y


def max_pool2d(x, kernel, stride, paddings, channels_last: bool):
    """``paddle.nn.functional.max_pool2d`` (floor mode, no mask) through oneDNN, float32 or
    bfloat16; ``paddings`` as ``[top, bottom, left, right]``."""
    return load().max_pool2d(x, _pair(kernel), _pair(stride), list(paddings), channels_last)[0]


def add_relu(a, b):
    """``relu(a + b)`` for two float32 or two bfloat16 tensors of one shape (Paddle has no CPU
    bfloat16 add or ReLU)."""
    if not b.is_contiguous():
        b = b.contiguous()
    return load().add_relu(a, b)[0]


def fork(x):
    """``(x, x)`` sharing ``x``'s buffer, for a tensor two ops read: the backward sums their
    gradients with oneDNN (Paddle's own sum of two bfloat16 gradients runs on one thread)."""
    a, b = load().fork(x)
    return a, b
