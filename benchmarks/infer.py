"""Inference speed: ppdlx's deploy predictor (Paddle Inference, CPU) vs onnxruntime and OpenVINO on the
same export, and the default deployment (``--backend auto``) against the fastest of them.

Exports the configured model (a classifier at ``--resolution``, 224 by default, or a detector at its
configured size; random weights are fine for speed) with ``--onnx`` and imports the deploy package
``ppdlx_deploy`` (deploy/ does not import ppdlx, and ppdlx does not depend on deploy/: it is found at
run time, see :func:`find_deploy_dir`); the runtimes are named in :mod:`benchmarks.infer_runtimes`.
Each compared runtime runs in its OWN fresh worker process, one process at a time, once per
round; the order alternates from round to round (``ppdlx_deploy.workers.run_rounds``). A
worker builds its predictor, runs ``--warmup`` untimed batches and times ``--steps`` batches per
batch size (input copy + run + output copy). Reported: per runtime the median batch latency
over all rounds; per pair (every runtime vs the reference, every Paddle variant vs plain
``paddle-cpu fp32``) the median and spread (range, quartiles) of the per-round latency ratios.
Each row also reads the runtime's speed as GFLOP/s (the model's convolutions and linear layers)
and as a share of this CPU's float32 matrix-product peak, timed before and after the rounds
(:mod:`benchmarks.matmul_peak`): how much any float32 runtime could still gain here.
Why not one process: the spinning worker threads of one runtime's thread pool take cores from the
next (docs/cpu_speed.md).
"""
from __future__ import annotations

import os
import sys
import time
from typing import Optional

import ppdlx
from benchmarks.deploy_package import (CHECKOUT_DEPLOY_DIR, DEPLOY_DIR_ENV, DEPLOY_PACKAGE,  # noqa: F401
                                       find_deploy_dir, load_deploy_module)
from benchmarks.infer_int8 import run_int8
from benchmarks.infer_runtimes import (AUTO, DEFAULT_REFERENCE, ENV_VARIANTS, PADDLE_BASELINE, pairs,
                                        parse_runtime, runtime_names, vs_fastest)
from benchmarks.matmul_peak import DEFAULT_SIZE, achieved_gflop_per_s, matmul_peak, model_gflop_per_image
from ppdlx.cpu_features import cpu_features
from ppdlx.errors import ConfigError, UnsupportedError


def add_arguments(parser):
    parser.add_argument("-c", "--config", required=True)
    parser.add_argument("-o", "--override", action="append", nargs="+", default=[])
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--rounds", type=int, default=5,
                        help="rounds; each runs every runtime once in its own fresh process (order alternates)")
    parser.add_argument("--steps", "--repeats", dest="steps", type=int, default=20,
                        help="timed batches per runtime, batch size and round")
    parser.add_argument("--warmup", type=int, default=5, help="untimed batches per worker and batch size")
    parser.add_argument("--threads", type=int, help="CPU threads for every runtime (default: cores available)")
    parser.add_argument("--runtimes", default="auto",
                        help="comma list of 'BACKEND PRECISION [VARIANT[+VARIANT]]' (paddle-cpu, onnxruntime, "
                             "openvino, or auto: the default deployment; Paddle plan variants from "
                             f"ppdlx_deploy.CPU_VARIANTS, worker environments {', '.join(ENV_VARIANTS)}); 'auto' = "
                             f"{PADDLE_BASELINE}, {DEFAULT_REFERENCE}, openvino fp32 (where installed), {AUTO} and "
                             "paddle-cpu bf16 where the CPU has bf16 hardware")
    parser.add_argument("--reference", default=DEFAULT_REFERENCE, help="the runtime every ratio divides by")
    parser.add_argument("--resolution", type=int,
                        help="input size (classifiers: crop, default 224; detectors: data.coco.image_size, default "
                             "the config's)")
    parser.add_argument("--model-dir", help="export here (default: <global.output_dir>/bench_infer); "
                                            "an export with the same model/resolution is reused")
    parser.add_argument("--format", choices=("pir", "program"), default="program",
                        help="Paddle program format to export (ONNX is converted from the same export); "
                             "program (.pdmodel) runs on the classic executor and allows the OpenVINO engine")
    parser.add_argument("--reexport", action="store_true", help="export even if a matching export exists")
    parser.add_argument("--int8-dir", help="an int8 export of the model in --model-dir (an fp32 export): time int8 "
                                           "vs fp32 of each predictor instead (benchmarks.infer_int8)")
    parser.add_argument("--openvino", action="store_true", help="add 'paddle-cpu fp32 openvino' (--format program)")
    parser.add_argument("--untuned", action="store_true", help="add 'paddle-cpu fp32 untuned' (Paddle's defaults)")
    parser.add_argument("--profile", action="store_true",
                        help="after the rounds, one more worker per paddle-cpu/onnxruntime runtime splits each batch "
                             "into convolutions, other kernels and time outside kernels (oneDNN's verbose log, "
                             "onnxruntime's profiler); the profilers' cost is in those times")
    parser.add_argument("--matmul-size", type=int, default=DEFAULT_SIZE,
                        help="side of the float32 matrix product timed before and after the rounds as this CPU's "
                             "arithmetic peak (rows then show GFLOP/s and their share of it); 0 = skip")
    parser.add_argument("--deploy-dir", help=f"folder holding the {DEPLOY_PACKAGE} package (default: "
                                             f"${DEPLOY_DIR_ENV}, else deploy/python of this checkout, else the "
                                             f"installed package)")


EXPORT_MARKER = "bench_export.json"


def _ensure_export(cfg, model_dir: str, fmt: str, reexport: bool, made_from: dict) -> dict:
    """Export (with ONNX) into ``model_dir`` unless the export there was made from the same config,
    overrides and format (``made_from``, kept next to it in :data:`EXPORT_MARKER`)."""
    import json
    from ppdlx.export import export_model
    marker = os.path.join(model_dir, EXPORT_MARKER)
    if not reexport and os.path.isfile(marker) and os.path.isfile(os.path.join(model_dir, "inference.onnx")):
        with open(marker, encoding="utf-8") as f:
            if json.load(f) == made_from:
                return {"reused": True, "seconds": 0.0}
    report = export_model(cfg, output_dir=model_dir, onnx=True, fmt=fmt, check_batch_sizes=(1,), rtol=1e-3)
    with open(marker, "w", encoding="utf-8") as f:
        json.dump(made_from, f)
    return {"reused": False, "seconds": report["seconds"], "checks": report["checks"]}


def _check_counts(args) -> list:
    """The batch sizes; every count that would time nothing is a one-line error, before any work."""
    for flag, value, least in (("--steps", args.steps, 1), ("--rounds", args.rounds, 1), ("--warmup", args.warmup, 0)):
        if value < least:
            raise ConfigError(f"benchmark infer {flag} {value}: need at least {least} "
                              + ("timed batch per runtime, batch size and round" if flag == "--steps" else
                                 "round" if flag == "--rounds" else "untimed batches"))
    try:
        sizes = [int(b) for b in str(args.batch_sizes).split(",") if b.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise ConfigError(f"benchmark infer --batch-sizes {args.batch_sizes}: give positive integers, e.g. 1,8")
    return sizes


def ratio_text(value: float) -> str:
    """A ratio to 3 decimals, or 4 where 3 would print 1.000 for a ratio on one side of 1."""
    text = f"{value:.3f}"
    return f"{value:.4f}" if text == "1.000" and value != 1.0 else text


def _range(stats: dict) -> str:
    rounds = f"{stats['n']} round" + ("s" if stats["n"] != 1 else "")
    return (f"{ratio_text(stats['median'])} (median of {rounds}; range {stats['min']:.3f}-{stats['max']:.3f}, "
            f"quartiles {stats['q1']:.3f}-{stats['q3']:.3f})")


def _one_line(D, fn, *args, **kwargs):
    """``fn(...)`` with the deploy package's errors raised as ppdlx's (one line, same exit code)."""
    try:
        return fn(*args, **kwargs)
    except D.UnsupportedError as err:
        raise UnsupportedError(f"benchmark infer: {err}") from None
    except D.DeployError as err:
        raise ConfigError(f"benchmark infer: {err}") from None


def convolution_ratio_bounds(split: dict, median_ms: float, ref_split: dict, ref_median_ms: float) -> tuple:
    """Bounds on one runtime's convolution time over the reference's without the profilers' cost.
    A profiler slows the runtime it watches by ``profiled wall - unprofiled median``, somewhere
    inside or outside the kernels it times (onnxruntime's profiled convolutions can sum to more
    than its whole unprofiled batch), so each runtime's unprofiled convolution time lies between
    its profiled time less that cost and its profiled time, and never above its unprofiled median."""
    def interval(s, median):
        cost = max(0.0, s["wall_ms"] - median)
        return max(s["convolution_ms"] - cost, 1e-9), min(s["convolution_ms"], median)
    lo, hi = interval(split, median_ms)
    ref_lo, ref_hi = interval(ref_split, ref_median_ms)
    return lo / ref_hi, hi / ref_lo


def _kernel_profile(D, specs: dict, env: dict, batch_sizes: list, notes: list, reference: str,
                    medians: dict) -> dict:
    """One profiled worker per profiled runtime (:mod:`ppdlx_deploy.kernel_profile`), its split in
    ``notes``, and each runtime's convolution time over the reference's."""
    profiled = {name: spec for name, spec in specs.items() if spec["backend"] in ("paddle-cpu", "onnxruntime")
                and "openvino" not in name}
    splits = {}
    for name, spec in profiled.items():
        worker_env = dict(env.get(name) or {}, **(D.kernel_profile.ONEDNN_VERBOSE_ENV
                                                  if spec["backend"] == "paddle-cpu" else {}))
        print(f"profile: {name}", file=sys.stderr, flush=True)
        splits[name] = _one_line(D, D.run_in_worker, dict(spec, label=name, kernel_profile=True), worker_env)["profile"]
    for bs in batch_sizes:
        for name, split in splits.items():
            line = D.kernel_profile.profile_line(name, split[str(bs)])
            if name != reference and reference in splits:
                own, ref = split[str(bs)], splits[reference][str(bs)]
                lo, hi = convolution_ratio_bounds(own, medians[(name, bs)], ref, medians[(reference, bs)])
                line += (f"; convolutions / {reference}'s: {own['convolution_ms'] / ref['convolution_ms']:.3f} "
                         f"profiled, {lo:.3f}-{hi:.3f} without either profiler's cost")
            notes.append(f"profile bs {bs}: {line}")
    return splits


def _matmul_peak(size: int, threads: int) -> Optional[dict]:
    if size <= 0:
        return None
    print(f"matmul peak: float32 {size} x {size} products, {threads} thread(s)", file=sys.stderr, flush=True)
    return matmul_peak(threads, size)


def peak_line(peaks: list, peak: dict, gflop: float, rows: list) -> str:
    """The note that reads each runtime's speed against the CPU's float32 matrix-product peak."""
    measured = ", ".join(f"{t['library']} {t['gflop_per_s']:.0f}" for p in peaks for t in p["timings"])
    shares = "; ".join(f"{row['case']} bs {row['batch_size']} {row['gflop_per_s']:.0f} ({row['of_matmul_peak']:.2f})"
                       for row in rows)
    return (f"matmul peak: {peak['gflop_per_s']:.0f} GFLOP/s ({peak['by']}, float32 "
            f"{peak['timings'][0]['size']}^2, {peak['timings'][0]['threads']} thread(s); before and after the "
            f"rounds: {measured}); the model's convolutions and linear layers are {gflop:.3g} GFLOP per image; "
            f"GFLOP/s reached (share of the peak): {shares}")


def run(args) -> dict:
    batch_sizes = _check_counts(args)
    if args.int8_dir:
        return run_int8(args, batch_sizes)
    features = cpu_features()
    from ppdlx.config import flatten_overrides, load_config
    D = load_deploy_module(args.deploy_dir)  # before the export: a missing deploy package is one line, at once
    names = runtime_names(args, features)
    parsed = {name: parse_runtime(name, D.CPU_VARIANTS, features) for name in names}
    if args.reference not in parsed:
        raise ConfigError(f"benchmark infer --reference '{args.reference}' is not among the runtimes "
                          f"({', '.join(names)})")
    if len(names) < 2:
        raise ConfigError(f"benchmark infer: compare at least two runtimes (--runtimes {args.runtimes})")
    overrides = list(flatten_overrides(args.override))
    if args.resolution:  # the classifier's crop (and its resize), or the detector's input size
        overrides += [f"data.transforms.crop_size={args.resolution}", f"data.coco.image_size={args.resolution}",
                      f"data.transforms.resize_short={int(args.resolution * 8 / 7)}"]
    cfg = load_config(args.config, overrides)
    from ppdlx.models.from_config import build_model
    model_dir = os.path.abspath(args.model_dir or os.path.join(cfg.global_cfg.output_dir, "bench_infer"))
    export = _ensure_export(cfg, model_dir, args.format, args.reexport,
                            {"config": os.path.abspath(args.config), "overrides": overrides, "format": args.format})

    threads = args.threads or D.default_threads()
    meta = D.load_meta(model_dir)
    files = D.model_files(model_dir, meta)
    for spec, _ in parsed.values():  # a plan this export or CPU refuses is one line now, not after some rounds
        if spec["backend"] == "paddle-cpu":
            _one_line(D, D.build_plan, meta, files, "paddle-cpu", spec["precision"], threads=threads,
                      **spec["options"])
    specs = {name: {"model_dir": model_dir, "threads": threads, "batch_sizes": batch_sizes, "warmup": args.warmup,
                    "steps": args.steps, **spec} for name, (spec, _) in parsed.items()}
    decisions = {bs: _one_line(D, D.choose_backend, model_dir, meta, files, "fp32", threads=threads, batch_size=bs,
                               progress=lambda line: print(line, file=sys.stderr, flush=True))
                 for bs in batch_sizes} if AUTO in parsed else {}
    # The workers get the thread environment this process was started with (paddle's import sets
    # OMP_NUM_THREADS here), plus their variant's.
    env = {name: {**ppdlx.THREAD_ENV_GIVEN, **variant_env} for name, (_, variant_env) in parsed.items()}
    load_before = os.getloadavg()
    started = time.time()
    peaks = [_matmul_peak(args.matmul_size, threads)]
    measured = _one_line(D, D.run_rounds, specs, args.rounds, env,
                         progress=lambda line: print(line, file=sys.stderr, flush=True))
    peaks.append(_matmul_peak(args.matmul_size, threads))
    load_after = os.getloadavg()
    summary = D.summarize_rounds(measured["replies"], batch_sizes, pairs(names, args.reference))
    fastest = {name: vs_fastest(D, measured["replies"], name, batch_sizes) for name in (AUTO, PADDLE_BASELINE)}
    fastest_of = {(r["runtime"], r["batch_size"]): r for stats in fastest.values() for r in stats or []}
    ratio_of = {(r["runtime"], r["reference"], r["batch_size"]): r for r in summary["ratios"]}
    peak = max((p for p in peaks if p), key=lambda p: p["gflop_per_s"], default=None)
    resolution = int(meta["inputs"][0]["shape"][-1])
    gflop = model_gflop_per_image(build_model(cfg), resolution, cfg.model.data_format) if peak else None
    rows = []
    for bs in batch_sizes:
        for name in names:
            stats, first = summary["runtimes"][(name, bs)], measured["replies"][name][0]
            row = {"case": name, "batch_size": bs, "engine": first["engine"], "threads": first["threads"],
                   "median_ms": stats["median_ms"], "images_per_s": bs * 1000.0 / stats["median_ms"],
                   "round_median_ms": stats["round_median_ms"]}
            if peak:
                row["gflop_per_s"] = achieved_gflop_per_s(gflop, bs, stats["median_ms"])
                row["of_matmul_peak"] = row["gflop_per_s"] / peak["gflop_per_s"]
            ratio = ratio_of.get((name, args.reference, bs))
            if ratio:
                row.update({"vs_reference": ratio["median"], "vs_reference_min": ratio["min"],
                            "vs_reference_max": ratio["max"]})
            if (name, bs) in fastest_of:
                row.update({key: fastest_of[(name, bs)][stat] for key, stat in
                            (("vs_fastest", "median"), ("vs_fastest_min", "min"), ("vs_fastest_max", "max"))})
            rows.append(row)
    workers = {name: {k: replies[0].get(k) for k in ("backend", "engine", "precision", "threads", "cpu_variant",
                                                      "notes", "calls", "thread_env", "thread_env_after_load",
                                                      "versions")}
               for name, replies in measured["replies"].items()}
    for name, (_, variant_env) in parsed.items():
        workers[name]["variant_env"] = variant_env
    notes = [f"model: {cfg.model.name} {resolution}px, {cfg.model.num_classes} classes, random weights, "
             f"format {meta['model']['format']} ({meta['model']['model_file']}), ONNX from the same export "
             f"({'reused' if export['reused'] else 'exported in %.0f s' % export['seconds']})",
             f"method: {len(names)} runtimes x {args.rounds} rounds, each run in its own fresh process, one at a "
             f"time, order reversed every other round; per worker {args.warmup} warm-up + {args.steps} timed batches "
             f"per batch size; {threads} thread(s) each; {time.time() - started:.0f} s; load average "
             f"{load_before[0]:.1f} -> {load_after[0]:.1f} on {os.cpu_count()} cores",
             f"cpu: {features.get('model_name')} ({features.get('vendor')}), flags {' '.join(features['flags'])}"]
    notes += [f"bs {bs}: {decision['line']}" for bs, decision in decisions.items()]
    for name in names:
        notes.append(f"{name}: " + "; ".join(workers[name]["notes"]))
    if peak:
        notes.append(peak_line(peaks, peak, gflop, rows))
    for ratio in summary["ratios"]:
        a = summary["runtimes"][(ratio["runtime"], ratio["batch_size"])]["median_ms"]
        b = summary["runtimes"][(ratio["reference"], ratio["batch_size"])]["median_ms"]
        verdict = "<=" if ratio["median"] <= 1.0 else ">"
        diff = ratio["output_max_abs_diff"]
        notes.append(f"bs {ratio['batch_size']}: {ratio['runtime']} / {ratio['reference']} = {_range(ratio)} "
                     f"{verdict} 1; medians {a:.2f} vs {b:.2f} ms; outputs differ by at most "
                     + ("?" if diff is None else f"{diff:.2g}"))
    for stats in fastest_of.values():
        notes.append(f"bs {stats['batch_size']}: {stats['runtime']} / the fastest of {', '.join(stats['fastest_of'])} "
                     f"({stats['reference']}) = {_range(stats)}")
    medians = {key: stats["median_ms"] for key, stats in summary["runtimes"].items()}
    profile = _kernel_profile(D, specs, env, batch_sizes, notes, args.reference, medians) if args.profile else None
    return {"rows": rows, "notes": notes, "model_dir": model_dir, "ratios": summary["ratios"], "profile": profile,
            "vs_fastest": list(fastest_of.values()), "load_average": {"before": load_before, "after": load_after},
            "auto_decisions": {str(bs): {k: d.get(k) for k in ("chosen", "medians", "rejected", "skipped", "line")}
                               for bs, d in decisions.items()},
            "matmul_peak": {"before": peaks[0], "after": peaks[1], "gflop_per_s": peak and peak["gflop_per_s"],
                            "model_gflop_per_image": gflop},
            "order": measured["order"], "workers": workers,
            "threads": {"per_runtime": threads, "environment_given": ppdlx.THREAD_ENV_GIVEN},
            "method": {"rounds": args.rounds, "steps": args.steps, "warmup": args.warmup, "batch_sizes": batch_sizes,
                       "processes": "fresh per runtime and round, one at a time",
                       "order": "as listed in even rounds, reversed in odd rounds", "reference": args.reference}}
