"""Where a predictor's batch time goes, kernel by kernel: oneDNN's verbose log for Paddle
Inference on CPU (every executed primitive with its time) and onnxruntime's own profiler (every
node with its time). Each timed run is split into convolutions, the other kernels by kind, and
the time outside any kernel: executor, feed/fetch copies, framework. Both tools add their own cost
to what they time, so the split is for comparing the runtimes with each other, not with their
unprofiled latency (``tools/benchmark.py infer --profile``; docs/cpu_speed.md).
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import sys
import tempfile
from typing import Dict, Iterable, List, Sequence, Tuple

from .backends import create_predictor
from .errors import DeployError
from .predictors import OnnxPredictor
from .timing import synthetic_feeds, time_networks

ONEDNN_VERBOSE_ENV = {"ONEDNN_VERBOSE": "1"}
ONEDNN_EXEC_PREFIX = "onednn_verbose,v1,primitive,exec,"
CONVOLUTION = "convolution"


def onednn_kernels(text: str) -> List[Tuple[str, str, float]]:
    """``(kind, implementation, ms)`` of every primitive execution in oneDNN verbose ``text``
    (lines ``onednn_verbose,v1,primitive,exec,cpu,<kind>,<implementation>,...,<ms>``)."""
    kernels = []
    for line in text.splitlines():
        if not line.startswith(ONEDNN_EXEC_PREFIX):
            continue
        fields = line.rstrip().split(",")
        try:
            kernels.append((fields[5], fields[6], float(fields[-1])))
        except (IndexError, ValueError):
            continue
    return kernels


def onnxruntime_kernels(events: Iterable[dict], last_runs: int) -> List[Tuple[str, str, float]]:
    """``(kind, provider, ms)`` of the nodes executed in the last ``last_runs`` ``model_run`` spans
    of an onnxruntime profile (its JSON events); a Conv node of any fusion (Conv, FusedConv, the
    NCHWc Conv) is ``convolution``."""
    events = list(events)
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "Session"
                  and e.get("name") == "model_run")[-last_runs:]
    kernels = []
    for e in events:
        if e.get("cat") != "Node" or not str(e.get("name", "")).endswith("_kernel_time"):
            continue
        if not any(start <= e["ts"] <= end for start, end in runs):
            continue
        op = (e.get("args") or {}).get("op_name", "?")
        kind = CONVOLUTION if "Conv" in op else op
        kernels.append((kind, (e.get("args") or {}).get("provider", "?"), e["dur"] / 1000.0))
    return kernels


def split_time(kernels: Sequence[Tuple[str, str, float]], wall_ms: Sequence[float]) -> dict:
    """Per run (the mean over ``len(wall_ms)`` runs): wall time = convolutions + other kernels
    (per kind) + the time outside any kernel."""
    runs = len(wall_ms)
    if not runs:
        raise DeployError("split_time: no timed runs")
    per_kind: Dict[str, float] = {}
    counts: Dict[str, int] = {}
    for kind, _, ms in kernels:
        per_kind[kind] = per_kind.get(kind, 0.0) + ms / runs
        counts[kind] = counts.get(kind, 0) + 1
    wall = sum(wall_ms) / runs
    inside = sum(per_kind.values())
    return {"runs": runs, "wall_ms": wall, "kernels_ms": inside, "outside_kernels_ms": wall - inside,
            "convolution_ms": per_kind.get(CONVOLUTION, 0.0), "convolutions_per_run": counts.get(CONVOLUTION, 0) / runs,
            "other_kernels_ms": {k: v for k, v in sorted(per_kind.items(), key=lambda kv: -kv[1]) if k != CONVOLUTION},
            "kernels_per_run": sum(counts.values()) / runs}


@contextlib.contextmanager
def stdout_to_file(path: str):
    """File descriptor 1 (where oneDNN's C code prints its log) written to ``path`` meanwhile."""
    libc = ctypes.CDLL(None)
    sys.stdout.flush()
    libc.fflush(None)
    saved = os.dup(1)
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(target, 1)
    try:
        yield
    finally:
        libc.fflush(None)
        os.dup2(saved, 1)
        os.close(saved)
        os.close(target)


def profile_worker_spec(spec: dict) -> dict:
    """In a worker process: per batch size, ``warmup`` untimed runs, then ``steps`` profiled runs
    split by :func:`split_time`. paddle-cpu needs the worker started with
    :data:`ONEDNN_VERBOSE_ENV` (oneDNN reads it once, when it loads)."""
    backend, steps, warmup = spec["backend"], int(spec["steps"]), int(spec["warmup"])
    if backend not in ("paddle-cpu", "onnxruntime"):
        raise DeployError(f"kernel profile: backend {backend} is not profiled (paddle-cpu and onnxruntime are)")
    if backend == "paddle-cpu" and os.environ.get("ONEDNN_VERBOSE") != ONEDNN_VERBOSE_ENV["ONEDNN_VERBOSE"]:
        raise DeployError("kernel profile of paddle-cpu: start the worker with ONEDNN_VERBOSE=1")
    result = {}
    with tempfile.TemporaryDirectory(prefix="ppdlx_kernel_profile_") as tmp:
        for bs in spec["batch_sizes"]:
            if backend == "onnxruntime":  # one session per batch size: its profile starts with the session
                predictor = OnnxPredictor(spec["model_dir"], threads=spec.get("threads"),
                                          profile_prefix=os.path.join(tmp, f"ort_bs{bs}"))
            else:
                predictor = create_predictor(spec["model_dir"], backend, spec["precision"],
                                             threads=spec.get("threads"), **spec.get("options", {}))
            feeds = synthetic_feeds(predictor.meta, int(bs))
            for _ in range(max(warmup, 1)):  # outside the profiled window
                predictor.run(feeds)
            if backend == "onnxruntime":
                seconds = time_networks({"run": predictor}, feeds, 0, steps)["run"]
                with open(predictor.session.end_profiling(), encoding="utf-8") as f:
                    kernels = onnxruntime_kernels(json.load(f), steps)
                tool = "onnxruntime profiler"
            else:
                log = os.path.join(tmp, f"onednn_bs{bs}.log")
                with stdout_to_file(log):
                    seconds = time_networks({"run": predictor}, feeds, 0, steps)["run"]
                with open(log, encoding="utf-8", errors="replace") as f:
                    kernels = onednn_kernels(f.read())
                tool = "oneDNN verbose log"
            if not kernels:
                raise DeployError(f"kernel profile of {backend} at batch size {bs}: the {tool} recorded no kernel "
                                  f"(engine {predictor.plan.get('engine')})")
            result[str(bs)] = {**split_time(kernels, [s * 1000.0 for s in seconds]), "tool": tool}
    return {"pid": os.getpid(), "profile": result, "engine": predictor.plan.get("engine")}


def profile_line(name: str, split: dict) -> str:
    """One runtime's split as text: ``NAME 53.1 ms = convolutions 47.0 (53) + reorder 1.2 + ...
    + outside kernels 4.4``."""
    others = " + ".join(f"{kind} {ms:.2f}" for kind, ms in split["other_kernels_ms"].items() if ms >= 0.005)
    return (f"{name} {split['wall_ms']:.2f} ms = convolutions {split['convolution_ms']:.2f} "
            f"({split['convolutions_per_run']:g} per run)" + (f" + {others}" if others else "")
            + f" + outside kernels {split['outside_kernels_ms']:.2f} ({split['tool']})")
