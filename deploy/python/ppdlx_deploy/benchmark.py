"""Timing predictors: per-batch network latency (true percentiles, warm-up excluded) and host
pre/post-processing timed apart, for one predictor in this process; and runtimes COMPARED in
separate worker processes, one fresh process per runtime and round, alternated round by round
(:func:`run_rounds`), with the per-round ratios summarised by their median and spread.

Why separate, fresh processes: after a run, the worker threads of OpenMP (Paddle's libiomp5
keeps spinning for KMP_BLOCKTIME) and of onnxruntime (allow_spinning) busy-wait for a while; a
second runtime in the same process, or an idle persistent worker next to it, loses cores to
them. A process that has exited spins no more, and one runtime per process measures what a
service running that runtime alone gets. See docs/cpu_speed.md."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from . import cpu
from .errors import DeployError
from .postprocess import postprocess
from .preprocess import Preprocessor

WORKER_CODE = "from ppdlx_deploy.benchmark import worker_main; worker_main()"
# Enough of the first output to compare runtimes (ResNet50's logits: all of them).
COMPARED_OUTPUT_VALUES = 4096


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


def synthetic_feeds(meta: dict, batch_size: int) -> Dict[str, np.ndarray]:
    """Random network inputs of ``batch_size`` (a fixed seed per batch size: every runtime and
    every worker process gets the same batch)."""
    rng = np.random.default_rng(batch_size)
    feeds = {}
    for spec in meta["inputs"]:
        shape = [batch_size] + list(spec["shape"][1:])
        feeds[spec["name"]] = (np.ones(shape, np.float32) if spec.get("role") == "scale"
                               else rng.standard_normal(shape).astype(np.float32))
    return feeds


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
            feeds = synthetic_feeds(meta, bs)
        else:
            paths = [images[i % len(images)] for i in range(bs)]
            for _ in range(max(3, min(repeats, 20))):
                start = time.perf_counter()
                feeds = prep.feeds_from_files(paths)
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
            row = {"case": case, "engine": predictor.plan.get("engine"),
                   "cpu_variant": predictor.plan.get("cpu_variant"),
                   "batch_size": int(bs), "images_per_s": bs * 1000.0 / lat["mean"],
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


# ---------------------------------------------------------------------------------------------
# Runtimes compared in separate worker processes
# ---------------------------------------------------------------------------------------------

REPLY_PREFIX = "PPDLX_DEPLOY_WORKER_REPLY "


def run_worker_spec(spec: dict) -> dict:
    """In a worker process: build the predictor ``spec`` names, time ``steps`` batches per batch
    size after ``warmup`` untimed ones, and return the per-batch seconds with what ran."""
    from .predictors import create_predictor
    env_given = cpu.thread_environment()  # before paddle's import sets OMP_NUM_THREADS=1 (where unset)
    predictor = create_predictor(spec["model_dir"], spec["backend"], spec["precision"], threads=spec.get("threads"),
                                 **spec.get("options", {}))
    times, outputs = {}, {}
    for bs in spec["batch_sizes"]:
        feeds = synthetic_feeds(predictor.meta, int(bs))
        times[str(bs)] = time_networks({"run": predictor}, feeds, int(spec["warmup"]), int(spec["steps"]))["run"]
        first = np.asarray(predictor.run(feeds)[0], np.float64).ravel()
        outputs[str(bs)] = first[:COMPARED_OUTPUT_VALUES].tolist()
    versions = {name: getattr(sys.modules[name], "__version__", None) for name in ("paddle", "onnxruntime", "numpy")
                if name in sys.modules}
    plan = predictor.plan
    return {"pid": os.getpid(), "times_s": times, "outputs": outputs, "engine": plan.get("engine"),
            "precision": plan.get("precision"), "threads": plan.get("threads"), "cpu_variant": plan.get("cpu_variant"),
            "notes": plan.get("notes", []), "calls": [c["call"] for c in plan.get("calls") or []],
            "thread_env": env_given, "thread_env_after_load": cpu.thread_environment(), "versions": versions}


def worker_main() -> None:
    """Entry point of a worker process (:data:`WORKER_CODE`): spec as JSON on stdin (with
    ``kernel_profile`` set: :func:`ppdlx_deploy.kernel_profile.profile_worker_spec`), the reply
    as one prefixed JSON line on stdout; an error is one line on stderr and a non-zero exit."""
    spec = json.loads(sys.stdin.read())
    try:
        if spec.get("kernel_profile"):
            from .kernel_profile import profile_worker_spec
            reply = profile_worker_spec(spec)
        else:
            reply = run_worker_spec(spec)
    except DeployError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
    print(REPLY_PREFIX + json.dumps(reply), flush=True)


def run_in_worker(spec: dict, env: Optional[Dict[str, Optional[str]]] = None, timeout: float = 3600) -> dict:
    """Run ``spec`` in a fresh Python process (this package on its path, no ppdlx needed) with
    ``env`` changed (a None value removes the variable) and return its reply."""
    child_env = dict(os.environ)
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    child_env["PYTHONPATH"] = os.pathsep.join([package_parent] + [p for p in [child_env.get("PYTHONPATH")] if p])
    for key, value in (env or {}).items():
        if value is None:
            child_env.pop(key, None)
        else:
            child_env[key] = str(value)
    proc = subprocess.run([sys.executable, "-c", WORKER_CODE], input=json.dumps(spec), capture_output=True,
                          text=True, env=child_env, timeout=timeout)
    replies = [line for line in proc.stdout.splitlines() if line.startswith(REPLY_PREFIX)]
    if proc.returncode != 0 or not replies:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        raise DeployError(f"benchmark worker {spec.get('label', spec['backend'])} exited with code "
                          f"{proc.returncode}: {lines[-1] if lines else 'no output'}")
    return json.loads(replies[-1][len(REPLY_PREFIX):])


def alternating_order(names: Sequence[str], rounds: int) -> List[List[str]]:
    """The order of the runtimes in each round: as given in even rounds, reversed in odd ones, so
    that no runtime always runs first or always follows the same one."""
    return [list(names) if r % 2 == 0 else list(reversed(names)) for r in range(rounds)]


def run_rounds(specs: Dict[str, dict], rounds: int, env: Optional[Dict[str, dict]] = None,
               progress: Optional[Callable[[str], None]] = None) -> dict:
    """Each runtime of ``specs`` (name -> worker spec) once per round, each run in its own fresh
    process, one process at a time, in :func:`alternating_order`. Returns ``{"order": [{"round",
    "position", "runtime", "pid", "wall_s"}], "replies": {name: [reply of round 0, 1, ...]}}``."""
    order, replies = [], {name: [] for name in specs}
    for r, names in enumerate(alternating_order(list(specs), rounds)):
        for position, name in enumerate(names):
            start = time.perf_counter()
            reply = run_in_worker(dict(specs[name], label=name), (env or {}).get(name))
            wall = time.perf_counter() - start
            replies[name].append(reply)
            order.append({"round": r, "position": position, "runtime": name, "pid": reply["pid"], "wall_s": wall})
            if progress:
                progress(f"round {r + 1}/{rounds}: {name} (pid {reply['pid']}, {wall:.0f} s)")
    return {"order": order, "replies": replies}


def spread(values: Sequence[float]) -> dict:
    """median, quartiles (numpy.percentile, linear) and range of ``values``."""
    v = np.asarray(values, np.float64)
    q1, median, q3 = np.percentile(v, [25, 50, 75])
    return {"median": float(median), "q1": float(q1), "q3": float(q3), "min": float(v.min()), "max": float(v.max()),
            "n": int(v.size)}


def round_medians_ms(replies: Sequence[dict], batch_size: int) -> List[float]:
    """The median batch latency (ms) of each round's worker at ``batch_size``."""
    return [float(np.median(reply["times_s"][str(batch_size)])) * 1000.0 for reply in replies]


def ratio_stats(numerator_ms: Sequence[float], denominator_ms: Sequence[float]) -> dict:
    """Per-round latency ratios (round r of one runtime over round r of the other) and their
    :func:`spread`: ratios within a round share that round's machine state."""
    if len(numerator_ms) != len(denominator_ms) or not numerator_ms:
        raise DeployError("ratio_stats: the two runtimes need the same, non-zero number of rounds")
    per_round = [a / b for a, b in zip(numerator_ms, denominator_ms)]
    return {"per_round": per_round, **spread(per_round)}


def summarize_rounds(replies: Dict[str, List[dict]], batch_sizes: Sequence[int],
                     pairs: Sequence[tuple]) -> dict:
    """Per runtime and batch size: the median latency over all timed batches of all rounds and
    the per-round medians; per ``(runtime, reference)`` pair and batch size: :func:`ratio_stats`
    of the per-round medians; and the largest difference of each runtime's first output from
    the reference's (round 0)."""
    runtimes, ratios = {}, []
    for name, rounds in replies.items():
        for bs in batch_sizes:
            pooled = np.concatenate([np.asarray(r["times_s"][str(bs)], np.float64) for r in rounds]) * 1000.0
            runtimes[(name, bs)] = {"median_ms": float(np.median(pooled)), "batches": int(pooled.size),
                                    "round_median_ms": spread(round_medians_ms(rounds, bs))}
    for name, reference in pairs:
        for bs in batch_sizes:
            stats = ratio_stats(round_medians_ms(replies[name], bs), round_medians_ms(replies[reference], bs))
            a = np.asarray(replies[name][0]["outputs"][str(bs)])
            b = np.asarray(replies[reference][0]["outputs"][str(bs)])
            ratios.append({"runtime": name, "reference": reference, "batch_size": int(bs), **stats,
                           "output_max_abs_diff": float(np.abs(a - b).max()) if a.shape == b.shape else None})
    return {"runtimes": runtimes, "ratios": ratios}
