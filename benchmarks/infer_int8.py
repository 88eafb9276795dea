"""int8 vs fp32 latency through deploy's own predictors and timing harness
(``ppdlx_deploy.run_rounds``): ``tools/benchmark.py infer --model-dir FP32 --int8-dir INT8`` and
``tools/quantize.py --benchmark-rounds``. Runtimes: paddle-cpu fp32 (the fp32 export), paddle-cpu int8 (an int8
export's program, the same predictor code with ``--precision int8``), onnxruntime fp32 (the fp32 export's ONNX
file) and onnxruntime int8 (an int8 export's ONNX QDQ graph), those the exports hold; each in its own fresh
process per round, the order reversed every other round; ratios are taken round by round. Classifiers and
detectors alike (random inputs of the export's shapes)."""
from __future__ import annotations

import os
import sys
from typing import Callable, Optional, Sequence

import ppdlx
from benchmarks.deploy_package import load_deploy_module
from ppdlx.cpu_features import cpu_features, has_vnni
from ppdlx.errors import ConfigError
from ppdlx.export import read_meta

FP32, INT8, ORT, ORT_INT8 = "paddle-cpu fp32", "paddle-cpu int8", "onnxruntime fp32", "onnxruntime int8"


def _runtimes(D, fp32_dir: str, int8_dir: str, onnx: Optional[bool]) -> dict:
    """``{name: (model dir, backend, precision)}`` of what the two exports hold."""
    fp32_meta, int8_meta = read_meta(fp32_dir), read_meta(int8_dir)
    if fp32_meta.get("precision") == "int8" or fp32_meta.get("quantization"):
        raise ConfigError(f"{fp32_dir}: an int8 export; give the fp32 export of the same model")
    if not int8_meta.get("quantization"):
        raise ConfigError(f"{int8_dir}: not an int8 export (no quantization in its inference.yml)")
    has_onnx = bool(fp32_meta["model"].get("onnx_file"))
    onnx = has_onnx if onnx is None else onnx
    if onnx and not has_onnx:
        raise ConfigError(f"{fp32_dir}: no ONNX file in the fp32 export (export with --onnx) for onnxruntime")
    runtimes = {FP32: (fp32_dir, "paddle-cpu", "fp32")}
    if int8_meta.get("precision") == "int8":
        runtimes[INT8] = (int8_dir, "paddle-cpu", "int8")
    if onnx:
        runtimes[ORT] = (fp32_dir, "onnxruntime", "fp32")
        if int8_meta["model"].get("onnx_file") and D.onnx_precision(int8_meta) == "int8":
            runtimes[ORT_INT8] = (int8_dir, "onnxruntime", "int8")
    return runtimes


def compare_latency(fp32_dir: str, int8_dir: str, batch_sizes: Sequence[int] = (1, 8), rounds: int = 5,
                    steps: int = 20, warmup: int = 5, threads: Optional[int] = None, onnx: Optional[bool] = None,
                    deploy_dir: Optional[str] = None, progress: Optional[Callable[[str], None]] = None) -> dict:
    """Latency rows per runtime and batch size, and per-round ratios int8/fp32 of each predictor (and
    int8/onnxruntime fp32, fp32/onnxruntime fp32): median, quartiles, range. ``onnx``: include onnxruntime
    (default: when the fp32 export has an ONNX file)."""
    if rounds < 1 or steps < 1 or warmup < 0:
        raise ConfigError(f"benchmark: rounds {rounds}, steps {steps}, warmup {warmup}: need >= 1, >= 1, >= 0")
    D = load_deploy_module(deploy_dir)
    runtimes = _runtimes(D, fp32_dir, int8_dir, onnx)
    threads = threads or D.default_threads()
    specs = {name: {"model_dir": os.path.abspath(d), "backend": b, "precision": p, "threads": threads,
                    "batch_sizes": [int(bs) for bs in batch_sizes], "warmup": warmup, "steps": steps}
             for name, (d, b, p) in runtimes.items()}
    env = {name: dict(ppdlx.THREAD_ENV_GIVEN) for name in specs}
    measured = D.run_rounds(specs, rounds, env, progress=progress)
    pairs = [pair for pair in ((INT8, FP32), (ORT_INT8, ORT), (INT8, ORT), (FP32, ORT), (ORT_INT8, FP32))
             if pair[0] in runtimes and pair[1] in runtimes]
    summary = D.summarize_rounds(measured["replies"], list(batch_sizes), pairs)
    features = cpu_features()
    rows = [{"runtime": name, "batch_size": bs, **stats} for (name, bs), stats in summary["runtimes"].items()]
    engines = {name: replies[0].get("engine") for name, replies in measured["replies"].items()}
    return {"cpu": {"model_name": features.get("model_name"), "family": features.get("family"),
                    "flags": features.get("flags"), "vnni": has_vnni(features),
                    "usable_cpus": features.get("usable_cpus")},
            "threads": threads, "rounds": rounds, "steps": steps, "warmup": warmup, "engines": engines,
            "rows": rows, "ratios": summary["ratios"], "order": measured["order"]}


def format_latency(result: dict) -> str:
    """The rows and ratios as text lines, with the CPU."""
    cpu = result["cpu"]
    lines = [f"cpu: {cpu['model_name']} (family {cpu['family']}, {', '.join(cpu['flags'] or [])}; "
             f"{'VNNI' if cpu['vnni'] else 'no VNNI'}), {result['threads']} thread(s), {result['rounds']} rounds x "
             f"{result['steps']} timed batches, one fresh process per runtime and round, order alternating"]
    for row in result["rows"]:
        r = row["round_median_ms"]
        lines.append(f"  {row['runtime']:<18} bs {row['batch_size']:<3} median {row['median_ms']:8.2f} ms "
                     f"(round medians {r['min']:.2f}-{r['max']:.2f})")
    for ratio in result["ratios"]:
        lines.append(f"  {ratio['runtime']} / {ratio['reference']} bs {ratio['batch_size']}: {ratio['median']:.3f} "
                     f"(median of {ratio['n']} per-round ratios; range {ratio['min']:.3f}-{ratio['max']:.3f}, "
                     f"quartiles {ratio['q1']:.3f}-{ratio['q3']:.3f})")
    return "\n".join(lines)


def run_int8(args, batch_sizes) -> dict:
    """``tools/benchmark.py infer --model-dir FP32 --int8-dir INT8``: the rows, ratios and notes of
    :func:`compare_latency` (the config only names the run)."""
    if not args.model_dir:
        raise ConfigError("benchmark infer --int8-dir: give --model-dir, the fp32 export of the same model")
    for option, directory in (("--model-dir", args.model_dir), ("--int8-dir", args.int8_dir)):
        if not os.path.isfile(os.path.join(directory, "inference.yml")):
            raise ConfigError(f"benchmark infer {option} {directory}: no inference.yml (not an export)")
    result = compare_latency(args.model_dir, args.int8_dir, batch_sizes, rounds=args.rounds, steps=args.steps,
                             warmup=args.warmup, threads=args.threads, deploy_dir=args.deploy_dir,
                             progress=lambda line: print(line, file=sys.stderr, flush=True))
    rows = [{"case": row["runtime"], "batch_size": row["batch_size"], "median_ms": row["median_ms"],
             "images_per_s": row["batch_size"] * 1000.0 / row["median_ms"]} for row in result["rows"]]
    return {**result, "rows": rows, "notes": format_latency(result).splitlines()}
