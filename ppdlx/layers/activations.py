"""Activations by name."""
from __future__ import annotations

import paddle.nn as nn

_ACTIVATIONS = {"relu": nn.ReLU, "relu6": nn.ReLU6, "swish": nn.Silu, "silu": nn.Silu, "sigmoid": nn.Sigmoid}


def create_act(name):
    """The activation layer called ``name``; ``None`` or ``"none"`` is the identity."""
    if name is None or name == "none":
        return nn.Identity()
    if name not in _ACTIVATIONS:
        raise ValueError(f"unknown activation '{name}' (known: {', '.join(sorted(_ACTIVATIONS))}, none)")
    return _ACTIVATIONS[name]()
