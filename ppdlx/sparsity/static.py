"""Mask application by parameter name, outside ``ASPHook`` (e.g. on a static program's scope).

``masks`` map a name to a bool/0-1 mask of the weight's shape: the structured names
``ASPHook.masks`` uses, or program parameter names via :func:`masks_by_param_name`.
Scope tensors are masked where they live (an in-place multiply on the device that holds
them, no copy through host memory).
"""
from __future__ import annotations

from typing import Any, Dict, Mapping

import numpy as np
import paddle
from paddle.base import core


def masks_by_param_name(model, masks: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Re-key structured-name masks (``"stages.0.0.conv1.conv.weight"``) by the
    parameters' program names (``"conv2d_3.w_0"``), as a static program/scope uses."""
    state = model.state_dict()
    return {state[k].name: v for k, v in masks.items() if k in state}


def device_mask(mask, like: paddle.Tensor) -> paddle.Tensor:
    """``mask`` as a tensor of ``like``'s dtype on ``like``'s place (build once, reuse every step)."""
    if isinstance(mask, paddle.Tensor):
        mk = mask
    else:
        mk = paddle.to_tensor(np.asarray(mask, np.float32), place=like.place)
    return mk if mk.dtype == like.dtype else mk.astype(like.dtype)


def apply_masks(tensors: Mapping[str, Any], masks: Mapping[str, Any], strict: bool = True) -> int:
    """Multiply ``tensors[name]`` by ``masks[name]`` in place for every masked name.

    Values of ``tensors`` may be numpy arrays (multiplied in place), paddle Tensors or
    ``DenseTensor`` objects such as ``scope.find_var(name).get_tensor()`` (both multiplied in
    place on their device; give masks from :func:`device_mask` to keep it a single kernel).
    Returns the number of tensors masked; ``strict`` raises ``KeyError`` for a masked name
    missing from ``tensors``.
    """
    done = 0
    for name, mask in masks.items():
        if name not in tensors:
            if strict:
                raise KeyError(f"apply_masks: no tensor named '{name}'")
            continue
        t = tensors[name]
        if isinstance(t, np.ndarray):
            np.multiply(t, np.asarray(mask, dtype=t.dtype), out=t)
        elif isinstance(t, (paddle.Tensor, core.DenseTensor)):
            if isinstance(t, core.DenseTensor):  # a paddle Tensor over its memory, on its own place (no copy)
                t = paddle.Tensor(t, place=t._place())
            with paddle.no_grad():
                t.multiply_(device_mask(mask, t))
        else:
            raise TypeError(f"apply_masks: cannot mask '{name}' of type {type(t).__name__}")
        done += 1
    return done


def apply_masks_to_scope(scope, masks: Mapping[str, Any], strict: bool = True) -> int:
    """:func:`apply_masks` on the variables of a static ``scope`` (masks keyed by program names)."""
    tensors = {}
    for name in masks:
        var = scope.find_var(name)
        if var is not None:
            tensors[name] = var.get_tensor()
    return apply_masks(tensors, masks, strict=strict)
