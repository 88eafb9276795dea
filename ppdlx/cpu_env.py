"""Environment switches that only take effect before paddle (and with it MKL) is loaded."""
from __future__ import annotations

import os
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
