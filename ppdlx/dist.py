"""This process in a (data-parallel) job: its rank and device as the launcher set them (we never spawn), its
CPU threads and random seeds, thin helpers over ``paddle.distributed``, and one line when a peer rank is lost."""
from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import random
import re
import signal
import sys
import time
import traceback

import numpy as np
import paddle
import paddle.distributed as dist
from paddle.distributed import fleet
from paddle.nn.layer.norm import _BatchNormBase
from paddle.quantization.quanters.abs_max import FakeQuanterWithAbsMaxObserverLayer

from ppdlx.errors import ConfigError, PpdlxError, UnsupportedError


def world_size() -> int:
    return int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))


def rank() -> int:
    return int(os.environ.get("PADDLE_TRAINER_ID", "0"))


BACKEND_ENV = "PADDLE_DISTRI_BACKEND"


def collective_backend(device: str, environ=os.environ) -> str:
    """The process-group backend Paddle should use for a run on ``device`` (``cpu`` or ``gpu:N``).
    Paddle reads it from ``PADDLE_DISTRI_BACKEND``, whose default ``auto`` means NCCL on every CUDA
    build whatever device the run trains on, and NCCL cannot carry the CPU tensors of a
    ``global.device=cpu`` run: such a run takes gloo."""
    asked = environ.get(BACKEND_ENV, "auto")
    if device != "cpu" or asked == "gloo":
        return asked
    if asked == "auto":
        return "gloo"
    raise ConfigError(f"global.device=cpu with {BACKEND_ENV}={asked}: a CPU run's tensors go through gloo only; "
                      f"unset {BACKEND_ENV} (or set it to gloo), or train with global.device=gpu")


def init(device: str, collective_programs: bool = False) -> tuple:
    """Initialise collective data parallel on ``device`` when launched with several processes;
    ``collective_programs``: static programs all-reduce too (``fleet.init(is_collective=True)`` first
    creates the context their all_reduce ops use)."""
    if world_size() > 1:
        os.environ[BACKEND_ENV] = collective_backend(device)  # fleet.init and init_parallel_env read it
    if world_size() > 1 and collective_programs:
        fleet.init(is_collective=True)
    if world_size() > 1 and not dist.is_initialized():
        dist.init_parallel_env()
    return rank(), world_size()


def all_reduce_sum(values):
    """Sum a list of Python numbers over ranks (float64 to keep counts exact)."""
    if world_size() <= 1:
        return list(values)
    t = paddle.to_tensor([float(v) for v in values], dtype="float64")
    dist.all_reduce(t)
    return t.numpy().tolist()


def all_reduce_min_(tensor) -> None:
    """In place, on the tensor's device (no host round trip)."""
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)


def running_statistics(layer) -> dict:
    """Structured name -> tensor of every running statistic of ``layer``: BatchNorm means and
    variances (Paddle keeps them as parameters with stop_gradient), the activation ranges of a
    quantization-aware-trained model (moving averages of each rank's batches, like BatchNorm's) and
    floating buffers."""
    found = {}
    for prefix, sub in layer.named_sublayers(include_self=True):
        dot = f"{prefix}." if prefix else ""
        if isinstance(sub, _BatchNormBase):
            found[f"{dot}_mean"], found[f"{dot}_variance"] = sub._mean, sub._variance
        if isinstance(sub, FakeQuanterWithAbsMaxObserverLayer):
            found[f"{dot}_scale"], found[f"{dot}_state"], found[f"{dot}_accum"] = sub._scale, sub._state, sub._accum
        for name, value in sub._buffers.items():
            if value is not None and paddle.is_floating_point(value):
                found[f"{dot}{name}"] = value
    return found


@paddle.no_grad()
def average_over_ranks(tensors) -> None:
    """In place, each tensor becomes its mean over the ranks (timm's ``distribute_bn`` reduce)."""
    for tensor in tensors:
        dist.all_reduce(tensor)
        paddle.assign(tensor / world_size(), output=tensor)


class RanksDivergedError(PpdlxError):
    exit_code = 5


@paddle.no_grad()
def check_parameters_in_sync(named, when: str) -> None:
    """Raise if a parameter differs between ranks: one float64 fingerprint per ``(name, tensor)`` of
    ``named`` (a Layer's ``named_parameters()``, or the static scope's), min and max all-reduced (two
    small collectives), so a kernel or hook that bypasses the gradient all-reduce is named instead of
    silently training different models on each rank."""
    named = list(named)
    if not named:
        return
    prints = paddle.stack([paddle.concat([p.astype("float64").sum().reshape([1]),
                                          (p.astype("float64") ** 2).sum().reshape([1])]) for _, p in named])
    low, high = prints.clone(), prints.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    differ = (high - low).abs().sum(axis=1).numpy()
    if differ.max() > 0:
        first = int(differ.argmax())
        raise RanksDivergedError(f"data-parallel ranks hold different weights {when} (e.g. parameter "
                                 f"'{named[first][0]}', {int((differ > 0).sum())} of {len(named)} differ): a layer "
                                 f"or hook bypasses the gradient all-reduce")


def barrier():
    if world_size() > 1:
        dist.barrier()


def local_world_size() -> int:
    """Processes of this job on this machine (the launcher's ``PADDLE_LOCAL_SIZE``)."""
    return int(os.environ.get("PADDLE_LOCAL_SIZE", world_size() if world_size() > 1 else 1))


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def configure_cpu_threads(setting=None) -> int:
    """Resolve ``global.cpu_threads`` (``setting``; None = this machine's usable cores shared by the
    local processes), apply it and return it (the run plan records it). Paddle's own default is 1
    math thread, which left half of a 2-core machine idle and made ResNet50 training 1.6x slower
    (issue 9)."""
    threads = setting or max(1, usable_cores() // max(1, local_world_size()))
    paddle.base.core.set_num_threads(threads)
    return threads


def resolve_device(device: str) -> str:
    has_gpu = paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0
    if device == "gpu" and not has_gpu:
        raise UnsupportedError("global.device=gpu: this Paddle build has no CUDA device "
                               "(paddle.is_compiled_with_cuda() is %s); use global.device=cpu"
                               % paddle.is_compiled_with_cuda())
    if device == "auto":
        device = "gpu" if has_gpu else "cpu"
    if device == "gpu":
        return f"gpu:{int(os.environ.get('FLAGS_selected_gpus', '0').split(',')[0])}"
    return "cpu"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    paddle.seed(seed)


PEER_LOST_EXIT_CODE = 6
GLOO_TRANSPORT = "gloo/transport/"  # in every gloo I/O error: "[.../gloo/transport/tcp/pair.cc:576] Read error ..."
# gloo::IoException and gloo::TimeoutException (mangled): Paddle's gloo reports a peer's closed connection as
# either, the second as "[.../pair.cc:584] TIMEOUT self_rank = 0 pair_rank = 1 ..." at once, not after a wait
GLOO_PEER_ERRORS = (b"N4gloo11IoExceptionE", b"N4gloo16TimeoutExceptionE")
PAIR_RANK = re.compile(r"pair_rank = (\d+)")
BACKWARD_COLLECTIVE = "the gradient all-reduce in backward()"
# Paddle's launcher polls its ranks every second and, seeing one failed, stops the others with SIGTERM and
# names the first failed rank: a survivor that ended at once was named instead of the rank that was lost.
LAUNCHER_NOTICE_SECONDS = 3.0


def lost_peer_collective(err: BaseException):
    """The ``paddle.distributed`` call during which ``err`` (a gloo I/O error: a peer's connection closed or
    was reset) was raised, e.g. ``all_reduce``; None when ``err`` is something else."""
    if not isinstance(err, RuntimeError) or GLOO_TRANSPORT not in str(err):
        return None
    frames = traceback.extract_tb(err.__traceback__)
    calls = [f.name for f in frames if f"{os.sep}paddle{os.sep}distributed{os.sep}" in f.filename
             and not f.name.startswith("_")]
    return calls[-1] if calls else "a collective"


def lost_peer(message: str = "") -> str:
    """Who a lost connection was to, as far as this rank can tell: the ``pair_rank`` of Paddle's gloo message,
    else with two ranks the other one."""
    named = PAIR_RANK.search(message)
    if named:
        return f"rank {named.group(1)} of {world_size()}"
    if world_size() == 2:
        return f"rank {1 - rank()} of 2"
    return f"a peer rank of the {world_size()} (the launcher's log names it)"


def end_after_lost_peer(line: str, cleanup) -> None:
    """Print ``error: line``, run ``cleanup()`` and end this process with :data:`PEER_LOST_EXIT_CODE`, after
    giving the launcher time to notice the lost rank; its SIGTERM ends the wait quietly (Paddle's own SIGTERM
    handler prints a C++ traceback). Exits without unwinding: it is also called from ``std::terminate``."""
    print(f"error: {line}", file=sys.stderr, flush=True)
    with contextlib.suppress(OSError):  # nothing may stop the exit (an exception would end in the abort)
        cleanup()
    logging.shutdown()
    sys.stdout.flush()
    with contextlib.suppress(ValueError):  # only the main thread can set a handler
        signal.signal(signal.SIGTERM, lambda *_: os._exit(PEER_LOST_EXIT_CODE))
    time.sleep(LAUNCHER_NOTICE_SECONDS)
    os._exit(PEER_LOST_EXIT_CODE)


class _GlooTerminateHook:
    """``std::set_terminate`` for the gloo errors Paddle cannot hand to Python. A peer lost during
    ``loss.backward()`` makes DataParallel's gradient all-reduce throw ``gloo::IoException`` inside the
    backward call, and ``ThrowExceptionToPython`` (paddle/fluid/pybind/exception.cc) converts only Paddle's own
    exception types: the gloo one escapes into CPython and ends in ``std::terminate`` (abort, a C++ traceback).
    This handler, called there on the same thread, hands gloo's peer errors to ``on_peer_error``; any other
    exception goes on to the previous handler."""

    def __init__(self, on_peer_error):
        self.on_peer_error = on_peer_error
        libstdcxx = ctypes.CDLL("libstdc++.so.6")  # the one Paddle's libraries are linked to (already loaded)
        self._set = libstdcxx._ZSt13set_terminatePFvvE  # std::set_terminate(void (*)())
        self._set.restype, self._set.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
        # the std::type_info of the exception in flight (getattr: a class body would mangle the name)
        self._type = getattr(libstdcxx, "__cxa_current_exception_type")
        self._type.restype = ctypes.c_void_p
        self._callback = ctypes.CFUNCTYPE(None)(self._on_terminate)  # kept: the C side holds only its address
        self._previous = self._set(ctypes.cast(self._callback, ctypes.c_void_p))

    def _exception_type(self) -> bytes:
        info = self._type()  # a std::type_info: its vtable pointer, then its mangled name
        return ctypes.c_char_p.from_address(info + ctypes.sizeof(ctypes.c_void_p)).value if info else b""

    def _on_terminate(self):
        if self._exception_type() in GLOO_PEER_ERRORS:
            self.on_peer_error()
        if self._previous:
            ctypes.CFUNCTYPE(None)(self._previous)()

    def remove(self) -> None:
        self._set(self._previous)


@contextlib.contextmanager
def stop_on_lost_peer(explain, cleanup=lambda: None):
    """Inside, a collective that finds a peer rank gone (killed, crashed) ends this rank with the one line
    ``explain(collective, gloo's message)`` and exit code 6 (:func:`end_after_lost_peer`) instead of a gloo
    traceback or a C++ abort."""
    if world_size() <= 1:
        yield
        return
    try:
        hook = _GlooTerminateHook(lambda: end_after_lost_peer(explain(BACKWARD_COLLECTIVE, ""), cleanup))
    except (OSError, AttributeError):  # no libstdc++.so.6 with those symbols (not Linux): Paddle's abort stays
        hook = None
    try:
        yield
    except RuntimeError as err:
        collective = lost_peer_collective(err)
        if collective is None:
            raise
        end_after_lost_peer(explain(collective, str(err)), cleanup)
    finally:
        if hook is not None:
            hook.remove()
