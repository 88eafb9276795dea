"""Run an exported ppdlx model WITHOUT ppdlx (needs numpy, Pillow, PyYAML and a runtime: paddle,
onnxruntime or openvino).

    python deploy/python/infer.py --model-dir DIR --input IMG_OR_DIR \
        [--backend auto|paddle-cpu|paddle-gpu|trt|onnxruntime|openvino] [--precision fp32|fp16|bf16|int8|auto] \
        [--batch-size N] [--threads N] [--topk K]
    python deploy/python/infer.py --model-dir DIR --input DIR --benchmark \
        --warmup 10 --repeats 100 --batch-sizes 1,8 [--report FILE]

DIR is what tools/export_model.py wrote: inference.{json|pdmodel} + inference.pdiparams
(+ inference.onnx) and inference.yml (pre-processing, I/O names, labels, TRT shape ranges).
An unreadable image of an --input folder is skipped with one line on stderr and the others are
predicted; the run then exits 2 with a last line counting the skipped images.

Backends: auto (the default: the fastest of the CPU runtimes below on this machine whose outputs agree
with the export's, measured once per machine, export, threads and batch size, each in its own process,
and cached; the first note says which and why), paddle-cpu (oneDNN, fp32 / bf16 on CPUs with
avx512_bf16 or amx_bf16 / int8 for quantised models), paddle-gpu (CUDA, fp32 / fp16), trt (fp32 / fp16
/ int8, engine cache, dynamic shape from inference.yml or collected on sample inputs; a legacy .pdmodel
goes through the Paddle-TRT subgraph engine, a PIR .json through paddle.tensorrt: see
ppdlx_deploy/trt.py), onnxruntime (CPU, fp32), openvino (CPU, fp32 / bf16; reads inference.onnx, or a
legacy inference.pdmodel). Every plan, printed note and benchmark row names the engine that runs the
network. A Paddle build without CUDA asked for paddle-gpu or trt, or a trt request that would not engage
TensorRT, exits with one line (code 3).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from .backends import create_predictor
from .benchmark import benchmark, format_rows
from .calibration import calibrate_trt
from .errors import DeployError
from .meta import load_meta, model_files
from .pipeline import Pipeline
from .plan import BACKENDS, CPU_VARIANTS, PRECISIONS, build_plan, check_backend_available, cpu_variant_options
from .postprocess import decodes_boxes, draw_detections, postprocess, result_text
from .preprocess import Preprocessor, list_images
from .trt import collection_batch_sizes, largest_trt_batch, trt_calibration_tables


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", required=True)
    p.add_argument("--input", help="an image or a directory of images")
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="auto (default): the fastest CPU runtime here whose outputs agree with the export's, "
                        "measured once per machine, export, threads and batch size, and cached; the first note "
                        "says which and why")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--threads", type=int, help="CPU threads (default: the cores this process may use)")
    p.add_argument("--topk", type=int, default=5)
    p.add_argument("--cpu-engine", choices=("onednn", "openvino"),
                   help="paddle-cpu: oneDNN kernels, or Paddle Inference's OpenVINO engine (--format program exports)")
    p.add_argument("--cpu-variant", metavar="VARIANT",
                   help=f"paddle-cpu: Paddle Inference settings by name ({', '.join(CPU_VARIANTS)}; several joined "
                        f"with '+'), or auto: time the ones this export allows once per kind of machine, each in "
                        f"its own process, and use the fastest (cached; the first note says which and why)")
    p.add_argument("--score-threshold", type=float, help="detection: draw boxes above this score")
    p.add_argument("--output-dir", help="detection: write images with boxes here")
    p.add_argument("--gpu-id", type=int, default=0)
    p.add_argument("--gpu-mem-mb", type=int, default=256, help="initial GPU memory pool (MB)")
    p.add_argument("--trt-cache-dir", help="TRT engine/optimisation cache (default: MODEL_DIR/_trt_cache)")
    p.add_argument("--trt-shapes", choices=("yml", "collect"), default="yml",
                   help="dynamic shape ranges from inference.yml, or collected by running the --input images")
    p.add_argument("--trt-max-batch", type=int, help="override the max batch of the TRT shape range")
    p.add_argument("--trt-workspace-bytes", type=int, help="TRT workspace in BYTES (default 1<<30)")
    p.add_argument("--calib-dir", help="trt int8 (non-quantised model): calibration images")
    p.add_argument("--calib-batches", type=int, default=32)
    p.add_argument("--benchmark", action="store_true")
    p.add_argument("--synthetic", action="store_true", help="benchmark on random inputs (no host pre-processing)")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--repeats", type=int, default=100)
    p.add_argument("--batch-sizes", default=None, help="benchmark batch sizes, e.g. 1,8 (default --batch-size)")
    p.add_argument("--report", help="benchmark: write JSON rows here")
    args = p.parse_args(argv)
    check_numbers(args)
    return args


# Options that must be at least this (None: not given, the default applies).
MINIMUM = {"batch_size": 1, "threads": 1, "topk": 1, "warmup": 0, "repeats": 1, "calib_batches": 1, "gpu_mem_mb": 1,
           "trt_max_batch": 1, "trt_workspace_bytes": 1}


def check_numbers(args) -> None:
    """Counts and sizes out of range are one line naming the option, before any model is loaded."""
    for name, least in MINIMUM.items():
        value = getattr(args, name)
        if value is not None and value < least:
            raise DeployError(f"--{name.replace('_', '-')} {value}: must be {least} or more")
    if args.batch_sizes is not None:
        try:
            sizes = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
        except ValueError:
            sizes = []
        if not sizes or min(sizes) < 1:
            raise DeployError(f"--batch-sizes {args.batch_sizes}: give positive integers, e.g. 1,8")
    if args.cpu_engine is not None and args.backend != "paddle-cpu":
        raise DeployError(f"--cpu-engine {args.cpu_engine}: applies to --backend paddle-cpu only (not "
                          f"{args.backend}); add --backend paddle-cpu or drop it")
    if args.cpu_variant is not None:
        if args.backend != "paddle-cpu":
            raise DeployError(f"--cpu-variant {args.cpu_variant}: applies to --backend paddle-cpu only "
                              f"(not {args.backend}); add --backend paddle-cpu or drop it")
        if args.cpu_variant != "auto":
            try:
                cpu_variant_options(args.cpu_variant)
            except DeployError:
                raise DeployError(f"--cpu-variant {args.cpu_variant}: choose auto, or from {', '.join(CPU_VARIANTS)} "
                                  f"(several joined with '+')") from None
    for option, path, directory in (("--report", args.report, False), ("--output-dir", args.output_dir, True)):
        if path:
            check_writable(option, path, directory)


def check_writable(option: str, path: str, directory: bool) -> None:
    """Create ``path`` (a directory) or the folder of ``path`` (a file) now, so an unwritable output is one line
    before the model runs, not a traceback after it."""
    folder = path if directory else (os.path.dirname(os.path.abspath(path)))
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise DeployError(f"{option} {path}: {folder} is a file, not a directory; choose a writable path")
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as err:
        raise DeployError(f"{option} {path}: cannot create {err.filename or folder} ({err.strerror}); choose a "
                          f"writable path") from None
    if not directory and os.path.isdir(path):
        raise DeployError(f"{option} {path}: is a directory; give a file name")


def check_trt_batch_sizes(args, meta: dict) -> None:
    """A benchmark batch above the TensorRT shape range would fail inside the engine at run time."""
    if not (args.benchmark and args.batch_sizes):
        return
    largest = max(int(b) for b in args.batch_sizes.split(",") if b.strip())
    limit = largest_trt_batch(meta, args.batch_size, args.trt_max_batch)
    if largest > limit:
        raise DeployError(f"--batch-sizes {args.batch_sizes}: batch {largest} is above the TensorRT shape range's "
                          f"max batch {limit}; add --trt-max-batch {largest}")


def plan_options(args) -> dict:
    """The predictor options given on the command line (everything but backend and precision)."""
    return dict(threads=args.threads, batch_size=args.batch_size, cpu_engine=args.cpu_engine or "onednn",
                cpu_variant=args.cpu_variant, gpu_id=args.gpu_id,
                gpu_mem_mb=args.gpu_mem_mb, cache_dir=args.trt_cache_dir, shape_source=args.trt_shapes,
                trt_max_batch=args.trt_max_batch, workspace_bytes=args.trt_workspace_bytes)


def calibration_plan(args, meta: dict) -> dict:
    """The int8 TRT plan for the command line's model and options: the calibrating predictor uses
    it, and the serving predictor's plan is the same, so the table matches the engines it serves."""
    return build_plan(meta, model_files(args.model_dir, meta), "trt", "int8", **plan_options(args))


def _write_report(path: str, model_dir: str, meta: dict, predictor, rows) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"model_dir": os.path.abspath(model_dir), "model": meta["model"],
                   "engine": predictor.plan["engine"],
                   "tensorrt_engines": predictor.plan.get("tensorrt_engines"),
                   "notes": predictor.plan["notes"], "rows": rows}, f, indent=2)


def _print_results(meta: dict, batch, images, results, output_dir) -> None:
    for path, img, res in zip(batch, images, results):
        print(result_text(meta, path, res))
        if output_dir and decodes_boxes(meta):
            os.makedirs(output_dir, exist_ok=True)
            draw_detections(img, res, os.path.join(output_dir, os.path.basename(path)))


def main(argv=None) -> int:
    args = parse_args(argv)
    check_backend_available(args.backend)  # what this build cannot run is said whatever the export holds
    meta = load_meta(args.model_dir)
    paths = list_images(args.input) if args.input else []
    if not paths and not (args.benchmark and args.synthetic):
        raise DeployError("--input is required (or --benchmark --synthetic)")
    prep = Preprocessor(meta)
    sample_feeds = None
    if args.backend == "trt" and args.trt_shapes == "collect":
        if not paths:
            raise DeployError("--trt-shapes collect runs real inputs: give --input images")
        sizes = collection_batch_sizes(args.batch_size, [int(b) for b in (args.batch_sizes or "").split(",") if b])
        sample_feeds = [prep.feeds_from_files([paths[i % len(paths)] for i in range(bs)]) for bs in sizes]
    if args.backend == "trt":
        check_trt_batch_sizes(args, meta)
    if args.backend == "trt" and args.precision == "int8":
        plan = calibration_plan(args, meta)
        if plan["calibration"] and not trt_calibration_tables(plan["cache_dir"]):
            if not args.calib_dir:
                raise DeployError("--precision int8 on a non-quantised model needs --calib-dir IMAGES once "
                                  f"(no calibration table in {plan['cache_dir']})")
            calibrate_trt(args.model_dir, meta, plan, args.calib_dir, args.batch_size, args.calib_batches,
                          sample_feeds)
    options = plan_options(args)
    if args.backend in ("auto", "paddle-cpu"):
        options["progress"] = lambda line: print(f"# {line}", file=sys.stderr, flush=True)
    predictor = create_predictor(args.model_dir, args.backend, args.precision, meta=meta, sample_feeds=sample_feeds,
                                 **options)
    for note in predictor.plan["notes"]:
        print(f"# {note}", file=sys.stderr)
    if meta["model"].get("random_weights"):
        print("# inference.yml: exported without model.weights (randomly initialised weights): the predictions "
              "mean nothing; re-export with -o model.weights=<checkpoint prefix>", file=sys.stderr)
    if not meta.get("labels"):
        print("# inference.yml has no labels: classes are shown by index (re-export with --labels FILE)",
              file=sys.stderr)
    if args.benchmark:
        sizes = [int(b) for b in (args.batch_sizes or str(args.batch_size)).split(",") if b]
        case = f"{predictor.plan['backend']}-{predictor.plan['precision']}"
        rows = benchmark({case: predictor}, meta, paths, sizes, args.warmup, args.repeats, args.synthetic)
        print(format_rows(rows))
        if args.report:
            _write_report(args.report, args.model_dir, meta, predictor, rows)
        return 0
    pipeline = Pipeline(meta, predictor, prep)
    skipped: list = []

    def skip(path: str, err: DeployError) -> None:
        skipped.append(path)
        print(f"skipped {err}", file=sys.stderr)

    # a folder's unreadable file is skipped and the rest predicted; a single file given is the whole run
    on_unreadable = skip if os.path.isdir(args.input) else None
    for index, (batch, images, outputs) in enumerate(pipeline.batches(paths, args.batch_size, on_unreadable)):
        results = postprocess(meta, outputs, args.topk, args.score_threshold)
        if index == 0 and predictor.plan.get("tensorrt_engines"):
            print(f"# engine {predictor.plan['engine']}: {predictor.plan['tensorrt_engines']} TensorRT engine(s)",
                  file=sys.stderr)
        _print_results(meta, batch, images, results, args.output_dir)
    if skipped:
        raise DeployError(f"{len(skipped)} of {len(paths)} images skipped (cannot read image); "
                          f"the other {len(paths) - len(skipped)} were predicted")
    return 0


def run(argv=None) -> int:
    """:func:`main` with a :class:`DeployError` printed as one line (``error: ...``) and returned
    as its exit code (2 for input errors, 3 for what this build/machine cannot do)."""
    try:
        return main(argv)
    except DeployError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
