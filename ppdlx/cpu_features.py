"""What this CPU offers, read from /proc/cpuinfo without importing paddle: the instruction-set
flags that decide kernel paths and precisions, the vendor, and the cores this process may use.

Code that picks a path by CPU asks these features (``"avx512_bf16" in features["flags"]``),
never the vendor name, except where a library itself branches on the vendor: MKL's dispatcher
(:func:`mkl_debug_cpu_type_for`).

The code is the deploy package's ``ppdlx_deploy/cpu.py``, which ships with ppdlx (setup.py) and must
run without it. It is loaded here from its file rather than imported as ``ppdlx_deploy.cpu``: that
import would run the package's ``__init__``, which loads paddle, and ``import ppdlx`` reads these
features to set MKL's environment before paddle loads.
"""
from __future__ import annotations

import importlib.util
import os
import sys

_CHECKOUT_DEPLOY_PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                        "deploy", "python", "ppdlx_deploy")
_MODULE_NAME = "ppdlx._deploy_cpu"


def _deploy_cpu_file() -> str:
    """``cpu.py`` of the deploy package next to this ppdlx (a checkout), else of the installed one
    (located without being imported)."""
    folders = [_CHECKOUT_DEPLOY_PACKAGE]
    spec = importlib.util.find_spec("ppdlx_deploy")
    folders += list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = os.path.join(folder, "cpu.py")
        if os.path.isfile(path):
            return path
    raise ModuleNotFoundError(f"ppdlx needs its deploy package's cpu.py: not in {_CHECKOUT_DEPLOY_PACKAGE} and "
                              f"ppdlx_deploy is not installed; reinstall ppdlx (pip install -e . in the checkout)")


def _load():
    if _MODULE_NAME not in sys.modules:
        spec = importlib.util.spec_from_file_location(_MODULE_NAME, _deploy_cpu_file())
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[_MODULE_NAME] = module
    return sys.modules[_MODULE_NAME]


_cpu = _load()
CPUINFO = _cpu.CPUINFO
FLAGS_THAT_MATTER = _cpu.FLAGS_THAT_MATTER
BF16_FLAGS = _cpu.BF16_FLAGS
VNNI_FLAGS = _cpu.VNNI_FLAGS
THREAD_ENV = _cpu.THREAD_ENV
parse_cpuinfo = _cpu.parse_cpuinfo
cpu_features = _cpu.cpu_features
thread_environment = _cpu.thread_environment
has_any = _cpu.has_any
has_bf16 = _cpu.has_bf16
onednn_runs_bf16 = _cpu.onednn_runs_bf16
onednn_isa_cap = _cpu.onednn_isa_cap
flags_within = _cpu.flags_within
has_vnni = _cpu.has_vnni
mkl_debug_cpu_type_for = _cpu.mkl_debug_cpu_type_for
