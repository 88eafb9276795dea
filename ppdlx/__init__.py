"""ppdlx: PaddlePaddle-native training, sparsity, export and deployment of NVIDIA's
reference vision models (ResNet50 v1.5, GPUNet, EfficientDet-D0)."""
import os as _os

# MKL's vendor check picks slow code paths on AMD CPUs; this must be set before
# paddle (and with it MKL) is loaded. Outputs are unchanged (checked to 1e-7).
# The tools apply ``global.mkl_debug_cpu_type`` from the config before paddle loads.
MKL_DEBUG_CPU_TYPE_FROM_USER = "MKL_DEBUG_CPU_TYPE" in _os.environ
_os.environ.setdefault("MKL_DEBUG_CPU_TYPE", "5")

__version__ = "0.1.0"
