"""int8 vs fp32 latency through deploy's own predictors and timing harness
(``ppdlx_deploy.run_rounds``): paddle-cpu fp32 (the fp32 export), paddle-cpu int8 (the
calibrated export, same predictor code with ``--precision int8``) and onnxruntime fp32 (the fp32
export's ONNX file), each in its own fresh process per round, the order reversed every other
round; ratios are taken round by round."""
from __future__ import annotations

import os
from typing import Callable, Optional, Sequence

from ppdlx_deploy import default_threads, run_rounds, summarize_rounds

import ppdlx
from ppdlx.cpu_features import cpu_features, has_vnni
from ppdlx.errors import ConfigError
from ppdlx.export.meta import read_meta

FP32, INT8, ORT = "paddle-cpu fp32", "paddle-cpu int8", "onnxruntime fp32"


def compare_latency(fp32_dir: str, int8_dir: str, batch_sizes: Sequence[int] = (1, 8), rounds: int = 5,
                    steps: int = 20, warmup: int = 5, threads: Optional[int] = None, onnx: Optional[bool] = None,
                    progress: Optional[Callable[[str], None]] = None) -> dict:
    """Latency rows per runtime and batch size, and per-round ratios int8/fp32, int8/onnxruntime
    and fp32/onnxruntime (median, quartiles, range). ``onnx``: include onnxruntime (default: when
    the fp32 export has an ONNX file)."""
    if rounds < 1 or steps < 1 or warmup < 0:
        raise ConfigError(f"benchmark: rounds {rounds}, steps {steps}, warmup {warmup}: need >= 1, >= 1, >= 0")
    has_onnx = bool(read_meta(fp32_dir)["model"].get("onnx_file"))
    onnx = has_onnx if onnx is None else onnx
    if onnx and not has_onnx:
        raise ConfigError(f"{fp32_dir}: no ONNX file in the fp32 export (export with --onnx) for onnxruntime")
    threads = threads or default_threads()
    runtimes = {FP32: (fp32_dir, "paddle-cpu", "fp32"), INT8: (int8_dir, "paddle-cpu", "int8")}
    if onnx:
        runtimes[ORT] = (fp32_dir, "onnxruntime", "fp32")
    specs = {name: {"model_dir": os.path.abspath(d), "backend": b, "precision": p, "threads": threads,
                    "batch_sizes": [int(bs) for bs in batch_sizes], "warmup": warmup, "steps": steps}
             for name, (d, b, p) in runtimes.items()}
    env = {name: dict(ppdlx.THREAD_ENV_GIVEN) for name in specs}
    measured = run_rounds(specs, rounds, env, progress=progress)
    pairs = [(INT8, FP32)] + ([(INT8, ORT), (FP32, ORT)] if onnx else [])
    summary = summarize_rounds(measured["replies"], list(batch_sizes), pairs)
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
