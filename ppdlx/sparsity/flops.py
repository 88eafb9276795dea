"""Per-layer multiply-accumulates of Conv2D / Linear layers, measured with forward hooks."""
from __future__ import annotations

from typing import Dict

import numpy as np
import paddle
import paddle.nn as nn


def layer_macs(model, crop_size: int, in_channels: int = None, data_format: str = None) -> Dict[str, int]:
    """MACs per image of every Conv2D / Linear, from one forward pass at ``crop_size``.

    conv: ``prod(output[1:]) * Cin/groups * kh * kw``; linear: ``prod(output[1:-1]) * in * out``.
    FLOPs are ``2 * MACs``.
    """
    names = {}
    for name, layer in model.named_sublayers():
        if isinstance(layer, (nn.Conv2D, nn.Linear)):
            names[id(layer)] = (name, layer)
    if in_channels is None:
        first = next((layer for _, layer in names.values() if isinstance(layer, nn.Conv2D)), None)
        in_channels = first._in_channels if first is not None else 3
    data_format = data_format or getattr(model, "data_format", "NCHW")
    macs: Dict[str, int] = {}

    def hook(layer, inputs, output):
        name, _ = names[id(layer)]
        out = [int(s) for s in output.shape[1:]]
        w = [int(s) for s in layer.weight.shape]
        if isinstance(layer, nn.Conv2D):
            macs[name] = macs.get(name, 0) + int(np.prod(out)) * w[1] * w[2] * w[3]
        else:
            macs[name] = macs.get(name, 0) + int(np.prod(out[:-1] or [1])) * w[0] * w[1]

    handles = [layer.register_forward_post_hook(hook) for _, layer in names.values()]
    shape = [1, in_channels, crop_size, crop_size] if data_format == "NCHW" else [1, crop_size, crop_size, in_channels]
    was_training = model.training
    model.eval()
    try:
        with paddle.no_grad():
            model(paddle.zeros(shape, dtype="float32"))
    finally:
        for h in handles:
            h.remove()
        if was_training:
            model.train()
    return macs
