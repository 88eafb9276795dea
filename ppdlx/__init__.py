"""ppdlx: PaddlePaddle-native training, sparsity, export and deployment of NVIDIA's
reference vision models (ResNet50 v1.5, GPUNet, EfficientDet-D0)."""
import importlib.util as _importlib_util
import os as _os

from ppdlx.cpu_features import (cpu_features as _cpu_features, mkl_debug_cpu_type_for as _mkl_type_for,
                                thread_environment as _thread_environment)

# The thread/ISA environment as given to this process, before ppdlx or paddle (whose import sets
# OMP_NUM_THREADS=1 where unset) change it: benchmark workers are started with it.
THREAD_ENV_GIVEN = _thread_environment()

# MKL's vendor check keeps its AVX2 kernels from non-Intel CPUs: where that costs (a non-Intel
# CPU with avx2, detected here) MKL_DEBUG_CPU_TYPE=5 is set before paddle (and with it MKL) loads;
# elsewhere, Intel CPUs included, MKL is left to dispatch by itself. Outputs are unchanged
# (checked to 1e-7). A variable the user set wins; the tools then apply an explicit
# ``global.mkl_debug_cpu_type`` from the config before paddle loads (ppdlx/cpu_env.py).
MKL_DEBUG_CPU_TYPE_FROM_USER = "MKL_DEBUG_CPU_TYPE" in _os.environ
MKL_DEBUG_CPU_TYPE_DETECTED = _mkl_type_for(_cpu_features())
if not MKL_DEBUG_CPU_TYPE_FROM_USER and MKL_DEBUG_CPU_TYPE_DETECTED is not None:
    _os.environ["MKL_DEBUG_CPU_TYPE"] = MKL_DEBUG_CPU_TYPE_DETECTED

__version__ = "0.1.0"

# setup.py names no Paddle distribution (the CPU and CUDA builds would replace each other), so a missing
# Paddle is found here; find_spec locates paddle without loading it (the MKL switch above must come first).
if _importlib_util.find_spec("paddle") is None:
    raise ModuleNotFoundError(
        "ppdlx needs PaddlePaddle, which is not installed: pip install paddlepaddle==3.3.1 (CPU) or "
        "paddlepaddle-gpu for your CUDA, e.g. pip install paddlepaddle-gpu==3.3.1 -i "
        "https://www.paddlepaddle.org.cn/packages/stable/cu126/", name="paddle")

# ppdlx's evaluation pre-processing is its deploy package's (deploy/python/ppdlx_deploy, installed with
# ppdlx). An editable install made by `setup.py develop` (setuptools < 64) puts only the checkout on
# sys.path, without it.
if _importlib_util.find_spec("ppdlx_deploy") is None:
    raise ModuleNotFoundError(
        "ppdlx needs its deploy package ppdlx_deploy, which this install does not provide: reinstall ppdlx "
        "(pip install -e . in the checkout; pyproject.toml asks pip for setuptools>=64)", name="ppdlx_deploy")
