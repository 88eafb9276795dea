"""Process-wide CPU switches: the MKL environment, which only takes effect before paddle (and with it
MKL) is loaded, and glibc's handling of freed memory."""
from __future__ import annotations

import ctypes
import os
import platform
import sys
from typing import Optional

import ppdlx

MKL_KEY = "mkl_debug_cpu_type"


def mkl_debug_cpu_type_setting(cfg) -> Optional[object]:
    """The config's ``global.mkl_debug_cpu_type`` when it was written in the config or an
    override (an int, or null), else ``"auto"``: a value the config only carries as the schema's
    default is not the user's choice, and the CPU detection of ``ppdlx/__init__.py`` stands."""
    section = cfg.global_
    value = getattr(section, MKL_KEY)
    if MKL_KEY not in section.model_fields_set or value == "auto":
        return "auto"
    return value


def apply_cpu_environment(cfg) -> bool:
    """Apply ``global.mkl_debug_cpu_type``: an explicit number sets ``MKL_DEBUG_CPU_TYPE``; an
    explicit null removes what ppdlx set (a variable the user exported stays); not given (or
    ``auto``) keeps the run-time decision of ``ppdlx/__init__.py`` (5 only on a non-Intel CPU with
    avx2). Returns False when paddle was already imported, i.e. too late."""
    if "paddle" in sys.modules:
        return False
    value = mkl_debug_cpu_type_setting(cfg)
    if value == "auto":
        return True
    if value is None:
        if not ppdlx.MKL_DEBUG_CPU_TYPE_FROM_USER:
            os.environ.pop("MKL_DEBUG_CPU_TYPE", None)
    else:
        os.environ["MKL_DEBUG_CPU_TYPE"] = str(value)
    return True


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4


def keep_freed_memory() -> bool:
    """Have glibc's malloc serve every allocation from its heap and keep freed memory in the
    process, so that a training step reuses the pages of the step before. Paddle's CPU allocator
    calls malloc per tensor; glibc maps blocks above a (dynamic, at most 32 MB) threshold one by
    one and unmaps them when freed, and the kernel then zeroes every page again on first touch:
    ResNet50's activations at 224 px are larger than that cap. The process keeps its peak heap.
    Returns False where the C library is not glibc (nothing is changed there)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)
    return bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
