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
# oneDNN's instruction-set levels, lowest first, each with the flags it adds to the one below. Its
# ONEDNN_MAX_CPU_ISA (or DNNL_MAX_CPU_ISA) caps the level it dispatches to, and the features here
# follow the cap: a path chosen by these flags is one oneDNN will run.
ONEDNN_ISA_LEVELS = (("SSE41", ("sse4_2",)), ("AVX", ("avx",)), ("AVX2", ("fma", "avx2")),
                     ("AVX2_VNNI", ("avx_vnni",)), ("AVX2_VNNI_2", ()),
                     ("AVX512_CORE", ("avx512f", "avx512bw", "avx512vl")), ("AVX512_CORE_VNNI", ("avx512_vnni",)),
                     ("AVX512_CORE_BF16", ("avx512_bf16",)), ("AVX512_CORE_FP16", ("avx512_fp16",)),
                     ("AVX512_CORE_AMX", ("amx_tile", "amx_bf16", "amx_int8")), ("AVX512_CORE_AMX_FP16", ()))
ONEDNN_ISA_ALIASES = {"AVX10_1_512": "AVX512_CORE_FP16", "AVX10_1_512_AMX": "AVX512_CORE_AMX",
                      "AVX10_1_512_AMX_FP16": "AVX512_CORE_AMX_FP16"}
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


def onednn_isa_cap(environ=None) -> Optional[str]:
    """The oneDNN instruction-set level the environment caps dispatch at (``ONEDNN_MAX_CPU_ISA``, else
    ``DNNL_MAX_CPU_ISA``, as oneDNN reads them), or None: no cap (unset, ``ALL``, ``DEFAULT``, or a
    value oneDNN does not know and ignores)."""
    environ = os.environ if environ is None else environ
    value = (environ.get("ONEDNN_MAX_CPU_ISA") or environ.get("DNNL_MAX_CPU_ISA") or "").strip().upper()
    value = ONEDNN_ISA_ALIASES.get(value, value)
    return value if value in dict(ONEDNN_ISA_LEVELS) else None


def flags_within(flags: Iterable[str], cap: Optional[str]) -> set:
    """The ``flags`` oneDNN may use under the level ``cap`` (all of them when None): those of the
    instruction-set levels up to the cap, and the flags no level names."""
    flags = set(flags)
    if cap is None:
        return flags
    names = [name for name, _ in ONEDNN_ISA_LEVELS]
    above = {f for name, added in ONEDNN_ISA_LEVELS[names.index(cap) + 1:] for f in added}
    return flags - above


def parse_cpuinfo(text: str, usable: Optional[Iterable[int]] = None, isa_cap: Optional[str] = None) -> dict:
    """The features of the CPU that /proc/cpuinfo ``text`` describes. ``usable``: the processor
    numbers this process may run on (its affinity); their logical CPUs and physical cores are
    counted as ``usable_cpus`` / ``usable_physical_cores`` (None when the text has no core ids).
    ``flags`` are those oneDNN may use under ``isa_cap`` (:func:`onednn_isa_cap`); ``hardware_flags``
    all the CPU has."""
    blocks = _processor_blocks(text)
    first = blocks[0] if blocks else {}
    hardware = set((first.get("flags") or first.get("Features") or "").split())
    flags = flags_within(hardware, isa_cap)
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
        "hardware_flags": [f for f in FLAGS_THAT_MATTER if f in hardware],
        "onednn_max_cpu_isa": isa_cap,
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
    return parse_cpuinfo(text, usable, onednn_isa_cap())


def thread_environment() -> dict:
    """The :data:`THREAD_ENV` variables as they are now (None = unset)."""
    return {key: os.environ.get(key) for key in THREAD_ENV}


def has_any(features: dict, flags: Iterable[str]) -> bool:
    return any(f in features.get("flags", ()) for f in flags)


def has_bf16(features: dict) -> bool:
    """bf16 arithmetic in hardware (oneDNN emulates it, slowly, elsewhere)."""
    return has_any(features, BF16_FLAGS)


def onednn_runs_bf16(features: dict) -> bool:
    """oneDNN has bf16 primitives for ppdlx's ops here: AVX-512 (avx512_core) at least, where it
    emulates what the CPU lacks. Below it, a bf16 primitive cannot even be created."""
    return {"avx512f", "avx512bw", "avx512vl"} <= set(features.get("flags", ()))


def has_vnni(features: dict) -> bool:
    """int8 dot products in hardware (without them int8 kernels gain little over fp32)."""
    return has_any(features, VNNI_FLAGS)


def mkl_debug_cpu_type_for(features: dict) -> Optional[str]:
    """``MKL_DEBUG_CPU_TYPE`` worth setting on this CPU, or None to leave MKL alone.

    MKL versions that honour the variable pick their AVX2 kernels only for GenuineIntel CPUs and
    fall back to SSE paths elsewhere; type 5 forces the AVX2 paths. So it helps exactly on a
    non-Intel CPU with avx2. On an Intel CPU MKL already dispatches by features, and on one with
    AVX-512 type 5 would cap it at AVX2. MKL does not follow oneDNN's cap: the hardware decides."""
    vendor = features.get("vendor")
    if vendor and vendor != "GenuineIntel" and "avx2" in features.get("hardware_flags", features.get("flags", ())):
        return "5"
    return None
