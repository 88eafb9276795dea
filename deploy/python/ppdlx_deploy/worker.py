"""The child's side of :mod:`ppdlx_deploy.workers`: a fresh process builds one predictor from the
spec on stdin, times it and prints its reply as one prefixed JSON line (``python -c
"from ppdlx_deploy.worker import main; main()"``). An error is one line on stderr and a non-zero exit.

What is timed per batch: the predictor's run (input copy, run, output copy) and, for a graph that
ends before NMS (a detection ONNX graph), the NMS that completes its outputs here, so every runtime
is timed up to the same four outputs the Paddle program gives."""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

from .backends import create_predictor
from .cpu import thread_environment
from .errors import DeployError
from .kernel_profile import profile_worker_spec
from .pipeline import Pipeline
from .timing import synthetic_feeds, time_networks
from .workers import REPLY_PREFIX, WORKER_LOG_ENV, run_in_worker

# Enough of each output to compare runtimes (ResNet50's logits and a detector's outputs at batch 16: all).
COMPARED_OUTPUT_VALUES = 16384
RUNTIME_MODULES = ("paddle", "onnxruntime", "openvino", "numpy")


class CompletedOutputs:
    """A predictor seen through its pipeline: ``run(feeds)`` gives the outputs ``inference.yml`` lists."""

    def __init__(self, predictor):
        self.pipeline = Pipeline(predictor.meta, predictor)
        self.plan = predictor.plan

    def run(self, feeds):
        return self.pipeline.run_feeds(feeds)


def output_values(outputs) -> list:
    """Each output as ``{"shape", "values"}`` (the first :data:`COMPARED_OUTPUT_VALUES`, float64)."""
    return [{"shape": list(np.shape(o)), "values": np.asarray(o, np.float64).ravel()[:COMPARED_OUTPUT_VALUES].tolist()}
            for o in outputs]


def run_auto_per_batch_size(spec: dict) -> dict:
    """``backend="auto"`` at several batch sizes: each batch size in its own fresh process, merged into one
    reply. auto decides per batch size and may choose another runtime for each; two runtimes loaded in one
    process would compete for the cores (their idle threads spin), which no deployment at one batch size sees."""
    replies = [run_in_worker(dict(spec, batch_sizes=[bs])) for bs in spec["batch_sizes"]]
    merged = dict(replies[-1], pid=os.getpid(), sub_pids=[r["pid"] for r in replies],
                  notes=[note for r in replies for note in r["notes"]])
    for key in ("times_s", "outputs", "output_values", "build_s"):
        merged[key] = {k: v for r in replies for k, v in r[key].items()}
    merged["versions"] = {k: v for r in replies for k, v in r["versions"].items()}
    return merged


def run_worker_spec(spec: dict) -> dict:
    """Build the predictor ``spec`` names, time ``steps`` batches per batch size after ``warmup``
    untimed ones, and return the per-batch seconds with what ran and its outputs."""
    if spec["backend"] == "auto" and len(spec["batch_sizes"]) > 1:
        return run_auto_per_batch_size(spec)
    env_given = thread_environment()  # before paddle's import sets OMP_NUM_THREADS=1 (where unset)
    times, first_outputs, values, build_s, predictor = {}, {}, {}, {}, None
    for bs in spec["batch_sizes"]:
        if predictor is None:
            started = time.perf_counter()
            predictor = create_predictor(spec["model_dir"], spec["backend"], spec["precision"],
                                         threads=spec.get("threads"), batch_size=int(bs), **spec.get("options", {}))
            build_s[str(bs)] = time.perf_counter() - started
            runner = CompletedOutputs(predictor)
        feeds = synthetic_feeds(predictor.meta, int(bs))
        times[str(bs)] = time_networks({"run": runner}, feeds, int(spec["warmup"]), int(spec["steps"]))["run"]
        outputs = runner.run(feeds)
        values[str(bs)] = output_values(outputs)
        first_outputs[str(bs)] = values[str(bs)][0]["values"]
    versions = {name: getattr(sys.modules[name], "__version__", None) for name in RUNTIME_MODULES
                if name in sys.modules}
    plan = predictor.plan
    return {"pid": os.getpid(), "times_s": times, "outputs": first_outputs, "output_values": values,
            "backend": plan.get("backend"), "engine": plan.get("engine"), "precision": plan.get("precision"),
            "threads": plan.get("threads"), "cpu_variant": plan.get("cpu_variant"), "build_s": build_s,
            "notes": plan.get("notes", []), "calls": [c["call"] for c in plan.get("calls") or []],
            "thread_env": env_given, "thread_env_after_load": thread_environment(), "versions": versions}


def _log_worker(spec: dict) -> None:
    path = os.environ.get(WORKER_LOG_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"pid": os.getpid(), "label": spec.get("label"), "backend": spec.get("backend")}) + "\n")


def main() -> None:
    """Entry point of a worker process: spec as JSON on stdin (with ``kernel_profile`` set:
    :func:`ppdlx_deploy.kernel_profile.profile_worker_spec`), the reply as one prefixed JSON line."""
    spec = json.loads(sys.stdin.read())
    _log_worker(spec)
    try:
        reply = profile_worker_spec(spec) if spec.get("kernel_profile") else run_worker_spec(spec)
    except DeployError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
    print(REPLY_PREFIX + json.dumps(reply), flush=True)
