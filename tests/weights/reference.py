"""Test-only access to the PyTorch reference implementations (torch, torchvision, timm, effdet).

PyPI's torchvision wheel next to the CPU torch wheel is a CUDA build: its C extension does not
load, and ``import torchvision`` then fails registering fake kernels for ``torchvision::nms`` /
``qnms`` ("operator ... does not exist"). The classification and detection networks are plain
``torch.nn``; only those two operator schemas must exist. ``import_torchvision`` declares them
(when the extension did not) and imports again.
"""
import importlib.util
import os
import sys

import numpy as np
import pytest

# never reach for a model hub (no network here): references are built with random weights
os.environ.setdefault("HF_HUB_OFFLINE", "1")
_NMS_SCHEMA = "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"
_LIBRARY = []


def import_torchvision():
    torch = pytest.importorskip("torch")
    if importlib.util.find_spec("torchvision") is None:
        pytest.skip("torchvision is not installed (pip install torchvision)")
    try:
        import torchvision
        return torchvision
    except RuntimeError as err:
        if "torchvision::" not in str(err):
            raise
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    if not _LIBRARY:
        library = torch.library.Library("torchvision", "DEF")
        for op in ("nms", "qnms"):
            library.define(f"{op}{_NMS_SCHEMA}")
        _LIBRARY.append(library)
    import torchvision
    return torchvision


def perturb_batchnorm(module, seed=0):
    """Non-trivial BN statistics and affine parameters (a fresh model has mean 0 / var 1)."""
    import torch
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in module.modules():
            if isinstance(layer, torch.nn.BatchNorm2d):
                n = layer.num_features
                layer.running_mean.copy_(torch.rand(n, generator=generator) * 0.2 - 0.1)
                layer.running_var.copy_(torch.rand(n, generator=generator) + 0.5)
                layer.weight.copy_(torch.rand(n, generator=generator) + 0.5)
                layer.bias.copy_(torch.rand(n, generator=generator) * 0.2 - 0.1)
    return module.eval()


def relative_error(ours, reference) -> float:
    """max |ours - reference| / max |reference|."""
    ours, reference = np.asarray(ours, np.float64), np.asarray(reference, np.float64)
    return float(np.abs(ours - reference).max() / np.abs(reference).max())
