"""The checkpoint files themselves: atomic writes, prefixes, and loading a ppdlx ``.pdparams`` as it is.

Kept apart from ``ppdlx.engine.checkpoint`` (which also imports foreign checkpoints through
``ppdlx.weights``) so that ``ppdlx.weights`` can write and re-load its output without an import cycle.
"""
from __future__ import annotations

import os
import pickle

import paddle

from ppdlx.engine.amp import set_state_cast
from ppdlx.errors import ConfigError

SUFFIXES = (".pdparams", ".pdopt", ".pdstates")


def atomic_save(obj, path: str, plain_pickle: bool = False) -> None:
    """``plain_pickle`` for ``.pdstates``: paddle.load would turn its numpy RNG arrays into tensors."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    if plain_pickle:
        with open(tmp, "wb") as f:
            pickle.dump(obj, f, protocol=4)
    else:
        paddle.save(obj, tmp)
    os.replace(tmp, path)


def load_states(path: str) -> dict:
    with open(path, "rb") as f:
        return pickle.load(f)


def strip_suffix(path: str) -> str:
    for suffix in SUFFIXES:
        if path.endswith(suffix):
            return path[: -len(suffix)]
    return path


def is_ppdlx_prefix(path: str) -> bool:
    return os.path.isfile(strip_suffix(path) + ".pdparams")


def read_pdparams(path: str) -> dict:
    """``<prefix>.pdparams`` as name -> tensor (a ``{"model": ...}`` wrapper is unwrapped)."""
    file = strip_suffix(path) + ".pdparams"
    if not os.path.isfile(file):
        raise ConfigError(f"model.weights={path}: {file} not found")
    loaded = paddle.load(file)
    if isinstance(loaded, dict) and "model" in loaded and isinstance(loaded["model"], dict):
        loaded = loaded["model"]
    return loaded


def check_and_set(model, loaded: dict, path: str) -> list:
    """Copy ``loaded`` into ``model``: a shape mismatch or no matching name is one line naming the parameter.
    Returns the names of model parameters that ``loaded`` does not provide."""
    own = model.state_dict()
    for name, value in loaded.items():
        if name in own and list(own[name].shape) != list(value.shape):
            raise ConfigError(f"model.weights={path}: parameter '{name}' has shape {list(value.shape)} in the file "
                              f"but {list(own[name].shape)} in the model (different model.name/num_classes?)")
    unexpected = [k for k in loaded if k not in own]
    if own and len(unexpected) == len(loaded):
        raise ConfigError(f"model.weights={path}: no parameter names match the model "
                          f"(file has e.g. '{unexpected[0]}', model has e.g. '{next(iter(own))}')")
    set_state_cast(model, {k: v for k, v in loaded.items() if k in own})
    return [k for k in own if k not in loaded]


def load_prefix_weights(model, path: str) -> list:
    """A ppdlx ``<prefix>.pdparams`` into ``model`` as it is (no import, no head reset)."""
    return check_and_set(model, read_pdparams(path), path)
