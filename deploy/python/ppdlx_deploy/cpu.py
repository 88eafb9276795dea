"""What this CPU offers, read from /proc/cpuinfo without importing paddle. Plans pick paths by these
flags, never by the vendor name, except where a library itself branches on the vendor (MKL's
dispatcher, :func:`mkl_debug_cpu_type_for`).

ppdlx reads its CPU features from this file too (``ppdlx.cpu_features`` loads it by path), so it
may import nothing but the standard library: neither ppdlx, which deploy runs without, nor paddle,
which must load after the MKL switch.
"""
from __future__ import annotations

import os
from typing import Iterable, Optional

CPUINFO = "/proc/cpuinfo"

# The flags (Linux names) that select kernels, precisions or MKL/oneDNN code paths.
FLAGS_THAT_MATTER = ("sse4_2", "avx", "fma", "avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni",
                     "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
# Environment variables that change how the CPU libraries (OpenMP, MKL, oneDNN) use threads and
# instruction sets: benchmark reports record them.
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "MKL_DEBUG_CPU_TYPE", "MKL_ENABLE_INSTRUCTIONS", "KMP_BLOCKTIME",
              "KMP_AFFINITY", "KMP_HW_SUBSET", "OMP_WAIT_POLICY", "OMP_PROC_BIND", "OMP_PLACES", "ONEDNN_MAX_CPU_ISA",
              "DNNL_MAX_CPU_ISA", "ONEDNN_DEFAULT_FPMATH_MODE")


def _processor_blocks(text: str) -> list:
    """One ``{key: value}`` per ``processor`` paragraph of /proc/cpuinfo text."""
    blocks, current = [], {}
    for line in text.splitlines():
        if not line.strip():
            if current:
                blocks.append(current)
                current = {}
            continue
        key, sep, value = line.partition(":")
        if sep:
            current[key.strip()] = value.strip()
    if current:
        blocks.append(current)
    return [b for b in blocks if "processor" in b]


def _as_int(value: Optional[str]) -> Optional[int]:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def parse_cpuinfo(text: str, usable: Optional[Iterable[int]] = None) -> dict:
    """The features of the CPU that /proc/cpuinfo ``text`` describes. ``usable``: the processor
    numbers this process may run on (its affinity); their logical CPUs and physical cores are
    counted as ``usable_cpus`` / ``usable_physical_cores`` (None when the text has no core ids)."""
    blocks = _processor_blocks(text)
    first = blocks[0] if blocks else {}
    flags = set((first.get("flags") or first.get("Features") or "").split())
    cores = {(b.get("physical id"), b.get("core id")) for b in blocks if "core id" in b}
    features = {
        "vendor": first.get("vendor_id"),
        "model_name": first.get("model name"),
        "family": _as_int(first.get("cpu family")),
        "model": _as_int(first.get("model")),
        "logical_cpus": len(blocks),
        "physical_cores": len(cores) or None,
        "sockets": len({b.get("physical id") for b in blocks if "physical id" in b}) or None,
        "flags": [f for f in FLAGS_THAT_MATTER if f in flags],
    }
    if usable is not None:
        usable = {int(u) for u in usable}
        mine = [b for b in blocks if _as_int(b.get("processor")) in usable]
        features["usable_cpus"] = len(usable)
        features["usable_physical_cores"] = (len({(b.get("physical id"), b.get("core id")) for b in mine})
                                             if mine and all("core id" in b for b in mine) else None)
    return features


def cpu_features(path: str = CPUINFO) -> dict:
    """:func:`parse_cpuinfo` of this machine, with the cores of this process's affinity. A
    missing /proc/cpuinfo (not Linux) gives empty features, which select the generic paths."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        text = ""
    usable = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    return parse_cpuinfo(text, usable)


def thread_environment() -> dict:
    """The :data:`THREAD_ENV` variables as they are now (None = unset)."""
    return {key: os.environ.get(key) for key in THREAD_ENV}


def has_any(features: dict, flags: Iterable[str]) -> bool:
    return any(f in features.get("flags", ()) for f in flags)


def has_bf16(features: dict) -> bool:
    """bf16 arithmetic in hardware (oneDNN emulates it, slowly, elsewhere)."""
    return has_any(features, BF16_FLAGS)


def has_vnni(features: dict) -> bool:
    """int8 dot products in hardware (without them int8 kernels gain little over fp32)."""
    return has_any(features, VNNI_FLAGS)


def mkl_debug_cpu_type_for(features: dict) -> Optional[str]:
    """``MKL_DEBUG_CPU_TYPE`` worth setting on this CPU, or None to leave MKL alone.

    MKL versions that honour the variable pick their AVX2 kernels only for GenuineIntel CPUs and
    fall back to SSE paths elsewhere; type 5 forces the AVX2 paths. So it helps exactly on a
    non-Intel CPU with avx2. On an Intel CPU MKL already dispatches by features, and on one with
    AVX-512 type 5 would cap it at AVX2."""
    vendor = features.get("vendor")
    if vendor and vendor != "GenuineIntel" and "avx2" in features.get("flags", ()):
        return "5"
    return None
