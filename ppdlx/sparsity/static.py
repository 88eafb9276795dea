"""Mask application by parameter name, for trainers that do not run ``ASPHook``
(the static-graph trainer calls this on its scope after every step).

``masks`` map a name to a bool/0-1 mask of the weight's shape: the structured names
``ASPHook.masks`` uses, or program parameter names via :func:`masks_by_param_name`.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping

import numpy as np
import paddle


def masks_by_param_name(model, masks: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Re-key structured-name masks (``"stages.0.0.conv1.conv.weight"``) by the
    parameters' program names (``"conv2d_3.w_0"``), as a static program/scope uses."""
    state = model.state_dict()
    return {state[k].name: v for k, v in masks.items() if k in state}


def apply_masks(tensors: Mapping[str, Any], masks: Mapping[str, Any], place=None, strict: bool = True) -> int:
    """Multiply ``tensors[name]`` by ``masks[name]`` in place for every masked name.

    Values of ``tensors`` may be numpy arrays (multiplied in place), paddle Tensors
    (``multiply_``; give paddle masks of the same dtype to keep it cheap), or scope
    tensors (``scope.find_var(name).get_tensor()``: read, multiplied, ``set`` back on
    ``place``). Returns the number of tensors masked; ``strict`` raises ``KeyError`` for
    a masked name missing from ``tensors``.
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
        elif isinstance(t, paddle.Tensor):
            mk = mask if isinstance(mask, paddle.Tensor) else paddle.to_tensor(np.asarray(mask, np.float32))
            if mk.dtype != t.dtype:
                mk = mk.astype(t.dtype)
            with paddle.no_grad():
                t.multiply_(mk)
        elif hasattr(t, "set"):
            arr = np.array(t)
            arr *= np.asarray(mask, dtype=arr.dtype)
            t.set(arr, place if place is not None else t._place())
        else:
            raise TypeError(f"apply_masks: cannot mask '{name}' of type {type(t).__name__}")
        done += 1
    return done


def apply_masks_to_scope(scope, masks: Mapping[str, Any], place, strict: bool = True) -> int:
    """:func:`apply_masks` on the variables of a static ``scope`` (masks keyed by program names)."""
    tensors = {}
    for name in masks:
        var = scope.find_var(name)
        if var is not None:
            tensors[name] = var.get_tensor()
    return apply_masks(tensors, masks, place=place, strict=strict)
