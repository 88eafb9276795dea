"""ppdlx: PaddlePaddle-native training, sparsity, export and deployment of NVIDIA's
reference vision models (ResNet50 v1.5, GPUNet, EfficientDet-D0)."""
import importlib.util as _importlib_util
import os as _os

# MKL's vendor check picks slow code paths on AMD CPUs; this must be set before
# paddle (and with it MKL) is loaded. Outputs are unchanged (checked to 1e-7).
# The tools apply ``global.mkl_debug_cpu_type`` from the config before paddle loads.
MKL_DEBUG_CPU_TYPE_FROM_USER = "MKL_DEBUG_CPU_TYPE" in _os.environ
_os.environ.setdefault("MKL_DEBUG_CPU_TYPE", "5")

__version__ = "0.1.0"

# setup.py names no Paddle distribution (the CPU and CUDA builds would replace each other), so a missing
# Paddle is found here; find_spec locates paddle without loading it (the MKL switch above must come first).
if _importlib_util.find_spec("paddle") is None:
    raise ModuleNotFoundError(
        "ppdlx needs PaddlePaddle, which is not installed: pip install paddlepaddle==3.3.1 (CPU) or "
        "paddlepaddle-gpu for your CUDA, e.g. pip install paddlepaddle-gpu==3.3.1 -i "
        "https://www.paddlepaddle.org.cn/packages/stable/cu126/", name="paddle")
