"""Parameters, MACs and per-layer output shapes of any ppdlx model (``tools/model_info.py``).

One eval-mode forward of a ``[1, 3, R, R]`` (or NHWC) zero batch with a pre- and post-hook on
every sub-layer:

* ``layers``: one entry per sub-layer **call**, in call order (a container before its
  children), ``{"name", "type", "out_shape"}``; a layer that returns a list/tuple (detection
  heads: one tensor per pyramid level) gets the list of shapes; a shared layer called once per
  level appears once per call.
* ``macs``: multiply-accumulates of convolutions and linear layers per image (BN, activations,
  pooling, additions and resizes are not counted, the usual convention):
  conv ``out_elements * (C_in / groups) * k_h * k_w`` (read off the weight shape
  ``[C_out, C_in/groups, k_h, k_w]``, so depthwise and grouped convs are counted right),
  transposed conv ``in_elements * (C_out / groups) * k_h * k_w``, linear
  ``out_elements * in_features``. Biases are not counted.
* ``macs_by_layer``: the same MACs per named conv / linear layer (summed over its calls), which
  the ASP report (``tools/prune_asp.py``) turns into FLOP shares.
* ``params``: every parameter (trainable or frozen) except BN running mean/variance (paddle keeps
  them as non-trainable parameters; PyTorch as buffers): ResNet50 = 25,557,032 as torchvision.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np
import paddle


def _shapes(out):
    if isinstance(out, paddle.Tensor):
        return [int(d) for d in out.shape]
    if isinstance(out, (list, tuple)):
        return [_shapes(o) for o in out]
    if isinstance(out, dict):
        return {str(k): _shapes(v) for k, v in out.items()}
    return None


def _numel(t) -> int:
    return int(np.prod([int(d) for d in t.shape])) if isinstance(t, paddle.Tensor) else 0


def layer_macs(layer, inputs, output) -> int:
    """MACs of one call of a conv / linear layer (0 for anything else)."""
    weight = getattr(layer, "weight", None)
    if weight is None or not isinstance(output, paddle.Tensor):
        return 0
    kind = type(layer).__name__
    per_out = int(np.prod([int(d) for d in weight.shape[1:]]))
    if isinstance(layer, paddle.nn.Linear):
        return _numel(output) * int(weight.shape[0])
    if isinstance(layer, paddle.nn.layer.conv._ConvNd):
        if "Transpose" in kind:
            return _numel(inputs[0]) * per_out
        return _numel(output) * per_out
    return 0


def count_params(model) -> int:
    """Every parameter, trainable or frozen, except BN running mean/variance (paddle stores those as
    non-trainable parameters; they are statistics, not weights)."""
    stats = {id(getattr(layer, a)) for layer in model.sublayers(include_self=True)
             for a in ("_mean", "_variance") if isinstance(getattr(layer, a, None), paddle.Tensor)}
    return int(sum(int(np.prod([int(d) for d in p.shape])) for p in model.parameters() if id(p) not in stats))


def count_trainable_params(model) -> int:
    """The parameters the optimizer updates (frozen ones and BN statistics left out); ppdlx.models.info.count_params
    counts every weight, frozen or not."""
    return int(sum(int(np.prod(p.shape)) for p in model.parameters() if not p.stop_gradient))


def model_info(model, resolution: int, data_format: Optional[str] = None, in_channels: int = 3) -> Dict[str, Any]:
    """``{"params", "macs", "resolution", "output_shape", "layers", "macs_by_layer"}`` for one image
    at ``resolution``, fed in ``data_format`` (default: the model's own ``data_format``, else NCHW)."""
    data_format = data_format or getattr(model, "data_format", "NCHW")
    names = {id(layer): name for name, layer in model.named_sublayers()}
    layers: List[dict] = []
    pending: Dict[int, List[dict]] = {}
    macs_by_layer: Dict[str, int] = {}
    handles = []

    def pre_hook(layer, inputs):
        entry = {"name": names[id(layer)], "type": type(layer).__name__, "out_shape": None}
        layers.append(entry)
        pending.setdefault(id(layer), []).append(entry)

    def post_hook(layer, inputs, output):
        entry = pending[id(layer)].pop()
        entry["out_shape"] = _shapes(output)
        count = layer_macs(layer, inputs, output)
        if count:
            macs_by_layer[entry["name"]] = macs_by_layer.get(entry["name"], 0) + count

    for _, layer in model.named_sublayers():
        handles.append(layer.register_forward_pre_hook(pre_hook))
        handles.append(layer.register_forward_post_hook(post_hook))
    shape = [1, in_channels, resolution, resolution] if data_format == "NCHW" else \
        [1, resolution, resolution, in_channels]
    was_training = model.training
    model.eval()
    try:
        with paddle.no_grad():
            output = model(paddle.zeros(shape, dtype="float32"))
    finally:
        for h in handles:
            h.remove()
        if was_training:
            model.train()
    return {"params": count_params(model), "macs": int(sum(macs_by_layer.values())), "resolution": int(resolution),
            "output_shape": _shapes(output), "layers": layers, "macs_by_layer": macs_by_layer}
