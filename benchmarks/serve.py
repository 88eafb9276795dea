"""Serving throughput: the export served by Triton (deploy/triton, the nvidia-pytriton wheel's server,
Python backend running ppdlx_deploy on CPU) against concurrency, next to one deploy/python/infer.py process.

Exports the configured classifier (ResNet50 at 224 by default, random weights: speed only), makes a
repository (``--batch-size`` = the dynamic batcher's max batch, ``--instances`` Python-backend processes
of ``--threads`` threads), starts the server on loopback and, round by round, alternates two cases:

* served: for each ``--concurrency`` level, that many closed-loop clients send one image file per
  request (``ppdlx_triton.load.closed_loop``): images/s over wall time and per-request latency;
* infer.py: ``deploy/python/infer.py --benchmark --batch-sizes B`` in a fresh process on the same files:
  its end-to-end images/s (decode + pre-processing + network + post-processing, one after the other).

Reported: per level the median over rounds of images/s and of each latency percentile; the ratio of
the best level's images/s to infer.py's, per round (median, min, max). The clients run in this process
on the same cores as the server, as a user's would on a one-machine deployment.
"""
from __future__ import annotations

import contextlib
import glob
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
from PIL import Image

from benchmarks.infer import _ensure_export, load_deploy_module
from ppdlx.cpu_features import cpu_features
from ppdlx.errors import ConfigError, UnsupportedError

SERVED_NAME = "served"


def add_arguments(parser):
    parser.add_argument("-c", "--config", required=True)
    parser.add_argument("-o", "--override", action="append", nargs="+", default=[])
    parser.add_argument("--resolution", type=int, default=224)
    parser.add_argument("--model-dir", help="export here (default: <global.output_dir>/bench_serve); reused when it "
                                            "matches")
    parser.add_argument("--reexport", action="store_true")
    parser.add_argument("--batch-size", type=int, default=8, help="max batch of the server = infer.py's batch size")
    parser.add_argument("--concurrency", default="1,2,4,8,16", help="client counts, comma separated")
    parser.add_argument("--requests", type=int, default=48, help="timed requests per concurrency level and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--instances", type=int, default=2, help="Python-backend model instances (processes)")
    parser.add_argument("--threads", type=int, help="threads per instance (default: the cores / instances)")
    parser.add_argument("--infer-threads", type=int, help="infer.py's threads (default: the cores)")
    parser.add_argument("--queue-delay-us", type=int, default=2000)
    parser.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    parser.add_argument("--images", help="image folder (default: paddlelabel's sample photos, else generated ones)")
    parser.add_argument("--url", help="HOST:PORT of a server already running the export (e.g. NVIDIA's image on a "
                                      "GPU host, same protocol as --protocol): measured instead of starting the "
                                      "bundled server")
    parser.add_argument("--model", default=SERVED_NAME, help="with --url: the served model's name")
    parser.add_argument("--infer-backend", default="paddle-cpu", help="infer.py's --backend (trt on a GPU host)")
    parser.add_argument("--infer-precision", default="fp32", help="infer.py's --precision")
    parser.add_argument("--deploy-dir", help="folder holding ppdlx_deploy (default: deploy/python of this checkout)")


def load_triton_package(deploy_module):
    """``ppdlx_triton`` from deploy/triton next to the deploy package in use."""
    triton_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
        deploy_module.__file__)))), "triton")
    if not os.path.isfile(os.path.join(triton_dir, "ppdlx_triton", "__init__.py")):
        raise ConfigError(f"benchmark serve: no deploy/triton/ppdlx_triton next to {deploy_module.__file__}")
    if triton_dir not in sys.path:
        sys.path.insert(0, triton_dir)
    modules = ("client", "repository", "server", "load")
    return {name: importlib.import_module(f"ppdlx_triton.{name}") for name in modules}


def benchmark_images(folder: str, given: str = None) -> str:
    """A folder of image files: ``given``, else paddlelabel's sample photos, else generated JPEGs."""
    if given:
        return given
    spec = importlib.util.find_spec("paddlelabel")
    photos = []
    if spec is not None and spec.submodule_search_locations:
        base = list(spec.submodule_search_locations)[0]
        photos = sorted(glob.glob(os.path.join(base, "sample", "*", "img", "*.jp*g")))
    os.makedirs(folder, exist_ok=True)
    if photos:
        for i, path in enumerate(photos):
            with open(path, "rb") as src, open(os.path.join(folder, f"{i:02d}.jpg"), "wb") as dst:
                dst.write(src.read())
        return folder
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:375, 0:500].astype(np.float32)
    for i in range(16):
        base = np.stack([x / 500 * 200, y / 375 * 180, (x + y) / 875 * 150], -1) + rng.normal(0, 12, (375, 500, 3))
        Image.fromarray(np.clip(base + i * 3, 0, 255).astype(np.uint8)).save(os.path.join(folder, f"{i:02d}.jpg"))
    return folder


def infer_process(infer_py: str, model_dir: str, images: str, args, repeats: int, threads: int, report: str) -> dict:
    command = [sys.executable, infer_py, "--model-dir", model_dir, "--input", images, "--benchmark",
               "--backend", args.infer_backend, "--precision", args.infer_precision,
               "--batch-sizes", str(args.batch_size), "--warmup", "3", "--repeats", str(repeats),
               "--threads", str(threads), "--report", report]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UnsupportedError(f"benchmark serve: infer.py exited with {proc.returncode}: {last}")
    with open(report, encoding="utf-8") as f:
        row = json.load(f)["rows"][0]
    return {"images_per_s": row["end_to_end_images_per_s"], "network_images_per_s": row["images_per_s"],
            "batch_latency_ms": row["latency_ms"], "host_preprocess_ms": row["host_preprocess_ms"]}


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average %.2f, %.2f, %.2f" % os.getloadavg()


def _levels(text: str) -> list:
    try:
        levels = sorted({int(c) for c in text.split(",") if c.strip()})
    except ValueError:
        levels = []
    if not levels or levels[0] < 1:
        raise ConfigError(f"benchmark serve --concurrency {text}: give positive integers, e.g. 1,2,4,8")
    return levels


def run(args) -> dict:
    levels = _levels(args.concurrency)
    for flag, value in (("--batch-size", args.batch_size), ("--rounds", args.rounds), ("--instances", args.instances)):
        if value < 1:
            raise ConfigError(f"benchmark serve {flag} {value}: must be 1 or more")
    if args.requests < levels[-1]:
        raise ConfigError(f"benchmark serve --requests {args.requests}: at least the largest concurrency "
                          f"({levels[-1]})")
    from ppdlx.config import flatten_overrides, load_config
    D = load_deploy_module(args.deploy_dir)
    T = load_triton_package(D)
    cores = D.default_threads()
    threads = args.threads or max(1, cores // args.instances)
    infer_threads = args.infer_threads or cores
    overrides = list(flatten_overrides(args.override)) + [
        f"data.transforms.crop_size={args.resolution}", f"data.transforms.resize_short={int(args.resolution * 8 / 7)}"]
    cfg = load_config(args.config, overrides)
    model_dir = os.path.abspath(args.model_dir or os.path.join(cfg.global_cfg.output_dir, "bench_serve"))
    export = _ensure_export(cfg, model_dir, "pir", args.reexport)
    infer_py = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(D.__file__))), "infer.py")
    uptime_before, started = _uptime(), time.time()
    served = {c: [] for c in levels}
    baseline, order = [], []
    with tempfile.TemporaryDirectory(prefix="ppdlx_bench_serve_") as work, contextlib.ExitStack() as stack:
        images = benchmark_images(os.path.join(work, "images"), args.images)
        files = T["client"].read_files(D.list_images(images))
        url, model = args.url, args.model
        if not url:
            repo = os.path.join(work, "repository")
            T["repository"].make_repository(model_dir, repo, name=SERVED_NAME, max_batch_size=args.batch_size,
                                            instances=args.instances, threads=threads,
                                            queue_delay_us=args.queue_delay_us)
            server = stack.enter_context(T["server"].TritonServer(repo, start_timeout=600))
            url, model = (server.grpc_url if args.protocol == "grpc" else server.http_url), SERVED_NAME
        for r in range(args.rounds):
            cases = ["served", "infer.py"] if r % 2 == 0 else ["infer.py", "served"]
            order.append(cases)
            for case in cases:
                print(f"round {r + 1}/{args.rounds}: {case}", file=sys.stderr, flush=True)
                if case == "served":
                    for c in levels:
                        served[c].append(T["load"].closed_loop(url, args.protocol, model, files, c, args.requests))
                else:
                    baseline.append(infer_process(infer_py, model_dir, images, args,
                                                  max(3, args.requests // args.batch_size), infer_threads,
                                                  os.path.join(work, f"infer_{r}.json")))
    return summarize(args, levels, served, baseline, order, {
        "model_dir": model_dir, "export": export, "threads": threads, "infer_threads": infer_threads,
        "cores": cores, "uptime_before": uptime_before, "uptime_after": _uptime(),
        "seconds": time.time() - started, "images": len(files)})


def summarize(args, levels, served, baseline, order, facts) -> dict:
    infer_rates = [b["images_per_s"] for b in baseline]
    rows = []
    for c in levels:
        runs = served[c]
        rows.append({"case": "served", "concurrency": c, "batch_size": args.batch_size,
                     "images_per_s": float(np.median([x["images_per_s"] for x in runs])),
                     "round_images_per_s": [x["images_per_s"] for x in runs],
                     **{f"{k}_ms": float(np.median([x["latency_ms"][k] for x in runs]))
                        for k in ("p50", "p95", "p99", "mean")}})
    rows.append({"case": "infer.py (one process)", "concurrency": 1, "batch_size": args.batch_size,
                 "images_per_s": float(np.median(infer_rates)), "round_images_per_s": infer_rates,
                 "batch_p50_ms": float(np.median([b["batch_latency_ms"]["p50"] for b in baseline])),
                 "batch_p99_ms": float(np.median([b["batch_latency_ms"]["p99"] for b in baseline]))})
    best = max(rows[:-1], key=lambda row: row["images_per_s"])
    ratios = [s / b for s, b in zip(best["round_images_per_s"], infer_rates)]
    cpu = cpu_features()
    notes = [
        f"cpu: {cpu.get('model_name')} ({cpu.get('vendor')}), flags {' '.join(cpu['flags'])}, {facts['cores']} cores "
        f"usable",
        f"model: {args.config} at {args.resolution} px, random weights ({facts['model_dir']}); {facts['images']} "
        f"image files, one per request",
        (f"server: {args.url}, model {args.model}, {args.protocol}" if args.url else
         f"server: the bundled tritonserver, max batch {args.batch_size}, {args.instances} instance(s) x "
         f"{facts['threads']} thread(s), queue delay {args.queue_delay_us} us, {args.protocol}")
        + f"; infer.py: {args.infer_backend} {args.infer_precision}, batch {args.batch_size}, "
          f"{facts['infer_threads']} thread(s), end-to-end images/s",
        f"best served concurrency {best['concurrency']}: {best['images_per_s']:.2f} images/s = "
        f"{np.median(ratios):.2f}x infer.py (rounds {min(ratios):.2f}-{max(ratios):.2f})",
        f"uptime before: {facts['uptime_before']}", f"uptime after: {facts['uptime_after']}",
        f"{args.rounds} rounds, order alternating; {facts['seconds']:.0f} s"]
    return {"rows": rows, "notes": notes, "served_vs_infer": {"concurrency": best["concurrency"],
                                                                "median": float(np.median(ratios)),
                                                                "min": min(ratios), "max": max(ratios),
                                                                "rounds": ratios},
            "served": {str(c): served[c] for c in levels}, "infer": baseline, "order": order,
            "uptime": {"before": facts["uptime_before"], "after": facts["uptime_after"]},
            "threads": {"server_per_instance": facts["threads"], "instances": args.instances,
                        "infer": facts["infer_threads"]},
            "method": {"rounds": args.rounds, "requests": args.requests, "concurrency": levels,
                       "batch_size": args.batch_size, "protocol": args.protocol}}
