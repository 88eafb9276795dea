"""The runtimes ``tools/benchmark.py infer`` compares, by name, and what it computes across them.

A runtime is ``BACKEND PRECISION [VARIANT[+VARIANT]]``: ``paddle-cpu`` (ppdlx's Paddle Inference
predictor, with the plan variants of ``ppdlx_deploy.CPU_VARIANTS``), ``onnxruntime`` and ``openvino``
(the same export's ONNX file), and ``auto`` (the default deployment, ``deploy/python/infer.py
--backend auto``: whichever of those it measured fastest here, decided before the rounds and cached,
so every round times the chosen runtime as a service would run it). Worker environments
(:data:`ENV_VARIANTS`) act before the libraries load, so they are benchmark candidates, not plans.
"""
from __future__ import annotations

import importlib.util
from typing import Dict, List, Optional

import numpy as np

from ppdlx.cpu_features import has_bf16
from ppdlx.errors import ConfigError, UnsupportedError

DEFAULT_REFERENCE = "onnxruntime fp32"
PADDLE_BASELINE = "paddle-cpu fp32"
AUTO = "auto fp32"
# The three runtimes a deployment may run; the default deployment is compared with the fastest of them.
SEPARATE_RUNTIMES = ("paddle-cpu fp32", "onnxruntime fp32", "openvino fp32")
BACKENDS = ("paddle-cpu", "onnxruntime", "openvino", "auto")
ENV_VARIANTS = {
    "kmp-compact": {"KMP_AFFINITY": "granularity=fine,compact,1,0"},  # pin OpenMP threads to cores
    "mkl-type-5": {"MKL_DEBUG_CPU_TYPE": "5"},                          # MKL's AVX2 paths forced
    # glibc keeps freed blocks in the heap (what ppdlx's CPU training sets with mallopt)
    "keep-memory": {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "2147483647"},
}


def runtime_names(args, features: dict) -> list:
    """The runtimes to compare, ``auto`` expanded, without repeats: the three runtimes (OpenVINO where
    installed), the default deployment, and paddle-cpu bf16 on a CPU with bf16 hardware."""
    names = []
    for item in [n.strip() for n in str(args.runtimes).split(",") if n.strip()]:
        if item == "auto":
            names += [PADDLE_BASELINE, DEFAULT_REFERENCE]
            names += ["openvino fp32"] if importlib.util.find_spec("openvino") else []
            names += [AUTO] + (["paddle-cpu bf16"] if has_bf16(features) else [])
        else:
            names.append(" ".join(item.split()))
    names += ["paddle-cpu fp32 openvino"] * args.openvino + ["paddle-cpu fp32 untuned"] * args.untuned
    return list(dict.fromkeys(names))


def parse_runtime(name: str, variants: dict, features: dict) -> tuple:
    """``(worker spec fields, worker environment)`` of a runtime name such as
    ``paddle-cpu fp32 memory-optim+kmp-compact``."""
    parts = name.split()
    if len(parts) not in (2, 3) or parts[0] not in BACKENDS:
        raise ConfigError(f"benchmark infer --runtimes: '{name}': write 'BACKEND PRECISION [VARIANT]' with backend "
                          f"{', '.join(BACKENDS)}, e.g. 'paddle-cpu fp32 memory-optim'")
    backend, precision = parts[:2]
    plan_parts, env = [], {}
    for token in (parts[2].split("+") if len(parts) == 3 else []):
        if token in ENV_VARIANTS:
            env.update(ENV_VARIANTS[token])
        elif token in variants and backend == "paddle-cpu":
            plan_parts.append(token)
        else:
            known = ", ".join(list(variants) + list(ENV_VARIANTS)) if backend == "paddle-cpu" else \
                ", ".join(ENV_VARIANTS)
            raise ConfigError(f"benchmark infer --runtimes: '{name}': unknown variant '{token}' for {backend} "
                              f"(known: {known})")
    if backend == "onnxruntime" and precision != "fp32":
        raise UnsupportedError(f"benchmark infer --runtimes: '{name}': onnxruntime runs fp32 here")
    if backend == "openvino" and importlib.util.find_spec("openvino") is None:
        raise UnsupportedError(f"benchmark infer --runtimes: '{name}': OpenVINO is not installed (pip install "
                               f"openvino)")
    if precision == "bf16" and not has_bf16(features):
        emulator = "OpenVINO" if backend == "openvino" else "oneDNN"
        raise UnsupportedError(f"benchmark infer --runtimes: '{name}': this CPU has neither avx512_bf16 nor "
                               f"amx_bf16, so {backend} bf16 is not offered ({emulator} would emulate it)")
    options = {"cpu_variant": "+".join(plan_parts)} if plan_parts else {}
    return {"backend": backend, "precision": precision, "options": options}, env


def pairs(names: list, reference: str) -> list:
    """Every runtime against the reference, and every Paddle variant against plain paddle-cpu fp32."""
    out = [(n, reference) for n in names if n != reference]
    if PADDLE_BASELINE in names:
        out += [(n, PADDLE_BASELINE) for n in names
                if n.startswith("paddle-cpu") and n not in (PADDLE_BASELINE, reference)]
    return out


def vs_fastest(D, replies: Dict[str, List[dict]], name: str, batch_sizes: list) -> Optional[List[dict]]:
    """Per batch size, ``name`` against the fastest of :data:`SEPARATE_RUNTIMES` (those measured, other
    than ``name``): the runtime with the lowest median of its per-round medians, and :func:`ratio_stats`
    of ``name``'s per-round median over that runtime's in the same round. (Not over each round's
    fastest: the least of several noisy times is biased low.) None without two of them."""
    separate = [n for n in SEPARATE_RUNTIMES if n in replies and n != name]
    if name not in replies or len(separate) < 2:
        return None
    out = []
    for bs in batch_sizes:
        rounds = {n: D.round_medians_ms(replies[n], bs) for n in separate}
        fastest = min(separate, key=lambda n: float(np.median(rounds[n])))
        stats = D.ratio_stats(D.round_medians_ms(replies[name], bs), rounds[fastest])
        out.append({"runtime": name, "reference": fastest, "batch_size": int(bs),
                    "fastest_of": separate, **stats})
    return out
