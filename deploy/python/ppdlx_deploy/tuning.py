"""``--precision auto`` and ``cpu_variant="auto"`` for paddle-cpu: pick the plan by measuring it
on this machine, never by the CPU's vendor.

The candidates are what this CPU and export allow: bf16 only on a CPU with bf16 hardware
(avx512_bf16 or amx_bf16; elsewhere oneDNN would emulate it), the settings of
:data:`ppdlx_deploy.plan.CPU_VARIANTS` that apply to the export format. Each candidate runs in
its own fresh worker process, alternated over rounds (:func:`ppdlx_deploy.benchmark.run_rounds`,
the method of ``tools/benchmark.py infer``), and the lowest median latency wins. The decision is
cached per CPU kind (model name and the flags that matter), Paddle version, model file, batch
size and threads, so a service measures once per kind of machine; the predictor's first note
says in one line what was chosen and why.
"""
from __future__ import annotations

import json
import os
import time
from typing import Dict, List, Optional, Sequence, Tuple

from . import cpu
from .benchmark import round_medians_ms, run_rounds, spread
from .plan import cpu_variants_for

CACHE_ENV = "PPDLX_DEPLOY_CACHE"
CACHE_NAME = "cpu_plans.json"


def cache_path() -> str:
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "ppdlx_deploy")
    return os.path.join(root, CACHE_NAME)


def cpu_candidates(fmt: str, precision: str, cpu_variant: Optional[str], features: dict) -> List[Tuple[str, str]]:
    """``(precision, variant)`` pairs worth timing for an export format on a CPU with ``features``."""
    if precision == "auto":
        precisions = ["fp32", "bf16"] if cpu.has_bf16(features) else ["fp32"]
    else:
        precisions = [precision]
    pairs = []
    for p in precisions:
        variants = cpu_variants_for(fmt, p) if cpu_variant == "auto" else [cpu_variant or "default"]
        pairs += [(p, v) for v in variants]
    return pairs


def _paddle_version() -> str:
    import paddle
    return paddle.__version__


def decision_key(features: dict, model_file: str, batch_size: int, threads: int,
                 candidates: Sequence[Tuple[str, str]], paddle_version: str) -> str:
    stat = os.stat(model_file)
    return json.dumps({"cpu": features.get("model_name"), "flags": features.get("flags"), "paddle": paddle_version,
                       "model": [os.path.abspath(model_file), stat.st_size, stat.st_mtime_ns],
                       "batch_size": int(batch_size), "threads": int(threads),
                       "candidates": [" ".join(c) for c in candidates]}, sort_keys=True)


def _load_cache(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _store(path: str, key: str, entry: dict) -> None:
    cache = _load_cache(path)
    cache[key] = entry
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(cache, f, indent=1)
    os.replace(tmp, path)


def pick_fastest(medians_ms: Dict[str, float]) -> str:
    """The candidate with the lowest median (the first listed on a tie)."""
    return min(medians_ms, key=lambda name: medians_ms[name])


def choose_cpu_plan(model_dir: str, files: dict, precision: str, cpu_variant: Optional[str], *, threads: int,
                    batch_size: int = 1, rounds: int = 2, warmup: int = 3, steps: int = 10,
                    features: Optional[dict] = None, cache_file: Optional[str] = None) -> dict:
    """``{"precision", "cpu_variant", "line", "cached", "medians_ms"}`` for paddle-cpu with
    ``precision`` and/or ``cpu_variant`` set to ``auto`` (see the module's docstring)."""
    features = cpu.cpu_features() if features is None else features
    candidates = cpu_candidates(files["format"], precision, cpu_variant, features)
    if len(candidates) == 1:
        p, v = candidates[0]
        why = ("this CPU has neither avx512_bf16 nor amx_bf16, so oneDNN would emulate bf16"
               if precision == "auto" else "the only candidate")
        return {"precision": p, "cpu_variant": v, "line": f"cpu plan: {p} {v} ({why}; nothing to measure)",
                "cached": False, "medians_ms": {}}
    path = cache_file or cache_path()
    key = decision_key(features, files["model_file"], batch_size, threads, candidates, _paddle_version())
    entry = _load_cache(path).get(key)
    cached = entry is not None
    if not cached:
        specs = {f"{p} {v}": {"model_dir": model_dir, "backend": "paddle-cpu", "precision": p, "threads": threads,
                              "options": {"cpu_variant": v}, "batch_sizes": [batch_size], "warmup": warmup,
                              "steps": steps} for p, v in candidates}
        replies = run_rounds(specs, rounds)["replies"]
        medians = {name: spread(round_medians_ms(replies[name], batch_size))["median"] for name in specs}
        entry = {"medians_ms": medians, "chosen": pick_fastest(medians), "rounds": rounds, "steps": steps,
                 "measured": time.strftime("%Y-%m-%d %H:%M:%S"), "cpu": features.get("model_name")}
        _store(path, key, entry)
    chosen = entry["chosen"]
    others = ", ".join(f"{name} {ms:.2f} ms" for name, ms in entry["medians_ms"].items() if name != chosen)
    line = (f"cpu plan: {chosen}, median {entry['medians_ms'][chosen]:.2f} ms at batch {batch_size} with {threads} "
            f"thread(s) (others: {others}); {'cached from ' if cached else ''}{entry['rounds']} round(s) in separate "
            f"processes on {entry['cpu']} at {entry['measured']} ({path})")
    p, v = chosen.split(" ", 1)
    return {"precision": p, "cpu_variant": v, "line": line, "cached": cached, "medians_ms": entry["medians_ms"]}
