"""bf16 training on CPU: whether this CPU computes ppdlx's oneDNN convolutions faster in bfloat16.

Paddle 3.3.1 has no CPU bf16 training kernels, but ppdlx's oneDNN convolution computes in bf16 from
float32 or bf16 tensors (``ppdlx.ops.onednn.conv2d(bf16=True)``; a ResNet keeps its activations in
bf16 between the layers, ``ppdlx.models.resnet_bf16``): float32 master weights, loss and
optimizer as before, no loss scaling (bf16 has float32's range), what PyTorch's CPU autocast does.
bf16 hardware (avx512_bf16 / amx_bf16) is necessary but not enough: on some CPUs with it
oneDNN's bf16 kernels are no faster than float32 (docs/cpu_speed.md). So ``amp.cpu_bf16: auto``
times both once per kind of machine -- a training step of one of ResNet50's bottleneck blocks, each
side the way training runs it (float32: 3x3 through oneDNN, stride-1 1x1 as matmuls; bf16: every
convolution through oneDNN, bf16 activations between the layers) -- and uses bf16 only where it
is at least :data:`MIN_GAIN` faster. The decision is cached next to the compiled op
(keyed by the CPU model, its flags, the threads and the op build).
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import statistics
import time
from typing import Optional

import paddle

import ppdlx.models.resnet_bf16 as resnet_bf16
from ppdlx.cpu_features import BF16_FLAGS, cpu_features, has_bf16, onednn_isa_cap
from ppdlx.errors import UnsupportedError
from ppdlx.layers import layer_config
from ppdlx.models.resnet import Bottleneck
from ppdlx.ops import onednn

log = logging.getLogger("ppdlx")

MIN_GAIN = 1.1  # bf16 rounds every convolution's inputs: only worth it for a clear speed-up
_ROUNDS = 5


def _block(bf16: bool, width: int = 256):
    """A bottleneck block of ResNet50's third stage on the kernels training would use."""
    paddle.seed(0)
    with layer_config(cpu_kernels=True, bf16=bf16):
        block = Bottleneck(4 * width, width, 1, "NHWC", False)
    block.train()
    return block


def _train_block_ms(block, bf16: bool, batch: int = 16, size: int = 14) -> float:
    """One forward + backward of ``block`` on a fresh batch, in ms."""
    x = paddle.randn([batch, size, size, block.conv1.conv._in_channels])
    if bf16:  # the output of the block before it
        x = x.astype(paddle.bfloat16)
    x.stop_gradient = False
    start = time.perf_counter()
    y = resnet_bf16.bottleneck(block, x) if bf16 else block(x)
    y.astype(paddle.float32).sum().backward()
    return (time.perf_counter() - start) * 1000


def measure(rounds: int = _ROUNDS) -> dict:
    """Median ms of the block in float32 and bf16, alternated round by round after a warm-up."""
    times = {"float32": [], "bfloat16": []}
    blocks = {bf16: _block(bf16) for bf16 in (False, True)}
    for bf16 in (False, True):
        _train_block_ms(blocks[bf16], bf16)
    for r in range(rounds):
        for bf16 in ((False, True) if r % 2 == 0 else (True, False)):
            times["bfloat16" if bf16 else "float32"].append(_train_block_ms(blocks[bf16], bf16))
    return {k: round(statistics.median(v), 2) for k, v in times.items()}


def _cache_path() -> str:
    return str(onednn.build_dir() / "cpu_bf16_choice.json")


def _key(features: dict, threads: int) -> str:
    return f"{features.get('model_name')}|{','.join(features.get('flags', []))}|{threads} threads"


def timed_choice(threads: int) -> dict:
    """``{"float32": ms, "bfloat16": ms, "measured": time}`` for this CPU and thread count, measured once.
    Under a file lock: the ranks of a job on one machine wait for one measurement (undisturbed by
    the others) and all make the same choice."""
    path = _cache_path()
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _cached_or_measured(path, _key(cpu_features(), threads))


def _cached_or_measured(path: str, key: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            cached = json.load(f)
    except (OSError, ValueError):
        cached = {}
    if key in cached:
        return cached[key]
    result = dict(measure(), measured=time.strftime("%Y-%m-%d %H:%M:%S"))
    cached[key] = result
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(cached, f, indent=1)
        os.replace(tmp, path)
    except OSError:  # a read-only cache only costs the measurement next time
        pass
    return result


def plan_cpu_bf16(setting, threads: int, fast_cpu_kernels: bool) -> tuple[bool, str]:
    """``(train convolutions in bf16, one line saying why)`` for ``amp.dtype: bfloat16`` on CPU.
    ``setting`` is ``amp.cpu_bf16``: auto = where measured faster; true = wherever the CPU has bf16
    hardware (else an error); false = never."""
    why_not: Optional[str] = None
    if setting is False:
        why_not = "amp.cpu_bf16=false"
    elif not fast_cpu_kernels:
        why_not = "global.cpu_fast_kernels is off (bf16 runs in its oneDNN convolutions)"
    elif not has_bf16(cpu_features()):
        capped = onednn_isa_cap()
        why_not = (f"this CPU has neither {' nor '.join(BF16_FLAGS)}"
                   + (f" that oneDNN may use under ONEDNN_MAX_CPU_ISA={capped}" if capped else "")
                   + " (oneDNN would emulate bf16, slower than float32, or has no bf16 kernels at all)")
    if why_not:
        if setting is True:
            raise UnsupportedError(f"amp.cpu_bf16=true: {why_not}; set amp.cpu_bf16=auto or amp.enabled=false")
        return False, why_not
    if setting is True:
        return True, "amp.cpu_bf16=true"
    return choose(timed_choice(threads))


def choose(timing: dict) -> tuple[bool, str]:
    """bf16 or not from a :func:`timed_choice` record, and the line that says why."""
    gain = timing["float32"] / timing["bfloat16"]
    measured = (f"a bottleneck block trained in {timing['bfloat16']} ms in bf16 vs "
                f"{timing['float32']} ms in float32 here ({gain:.2f}x, measured {timing['measured']}; "
                f"{_cache_path()})")
    if gain >= MIN_GAIN:
        return True, measured
    return False, f"{measured}: less than {MIN_GAIN}x"
