"""Environment switches that only take effect before paddle (and with it MKL) is loaded."""
from __future__ import annotations

import os
import sys

import ppdlx


def apply_cpu_environment(cfg) -> bool:
    """Apply ``global.mkl_debug_cpu_type`` (null = leave MKL's vendor check alone unless the user
    set the variable). Returns False when paddle was already imported, i.e. too late."""
    if "paddle" in sys.modules:
        return False
    value = cfg.global_.mkl_debug_cpu_type
    if value is None:
        if not ppdlx.MKL_DEBUG_CPU_TYPE_FROM_USER:
            os.environ.pop("MKL_DEBUG_CPU_TYPE", None)
    else:
        os.environ["MKL_DEBUG_CPU_TYPE"] = str(value)
    return True
