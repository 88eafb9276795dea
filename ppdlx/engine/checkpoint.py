"""Checkpoints: ``<prefix>.pdparams`` (model), ``.pdopt`` (optimizer), ``.pdstates``
(epoch, step, best metric, LR schedule, loss scaler, EMA, RNG, extra state).

Every file is written to a temporary name and renamed into place, ``.pdstates``
last: an interrupted save never leaves a half-written file under a real name, and
a prefix counts as complete only when its ``.pdstates`` exists.
"""
from __future__ import annotations

import glob
import os
import pickle
import random

import numpy as np
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


def capture_rng() -> dict:
    return {"paddle": paddle.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def restore_rng(state: dict) -> None:
    paddle.set_rng_state(state["paddle"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def save_checkpoint(prefix: str, model_state: dict, optimizer_state: dict | None, states: dict) -> None:
    """``model_state`` values may be tensors or numpy arrays (saved as tensors either way)."""
    model_state = {k: paddle.to_tensor(v) if isinstance(v, np.ndarray) else v for k, v in model_state.items()}
    atomic_save(model_state, prefix + ".pdparams")
    if optimizer_state is not None:
        atomic_save(optimizer_state, prefix + ".pdopt")
    atomic_save(states, prefix + ".pdstates", plain_pickle=True)


def strip_suffix(path: str) -> str:
    for suffix in SUFFIXES:
        if path.endswith(suffix):
            return path[: -len(suffix)]
    return path


def resolve_resume(resume: str, output_dir: str):
    """``auto`` -> ``<output_dir>/latest`` if complete, else None; otherwise the given prefix."""
    if resume == "auto":
        prefix = os.path.join(output_dir, "latest")
        return prefix if os.path.isfile(prefix + ".pdstates") else None
    prefix = strip_suffix(resume)
    if not os.path.isfile(prefix + ".pdstates"):
        raise ConfigError(f"train.resume={resume}: no complete checkpoint at {prefix}.pdstates "
                          f"(use train.resume=auto or a prefix such as {output_dir}/latest)")
    return prefix


def load_checkpoint(prefix: str):
    model = paddle.load(prefix + ".pdparams")
    opt = paddle.load(prefix + ".pdopt") if os.path.isfile(prefix + ".pdopt") else None
    states = load_states(prefix + ".pdstates")
    return model, opt, states


def load_weights(model, path: str) -> list:
    """Load weights only (``model.weights``). Shape mismatch -> one line naming the parameter.

    Returns the names of model parameters that the file did not provide.
    """
    prefix = strip_suffix(path)
    file = prefix + ".pdparams"
    if not os.path.isfile(file):
        raise ConfigError(f"model.weights={path}: {file} not found")
    loaded = paddle.load(file)
    if isinstance(loaded, dict) and "model" in loaded and isinstance(loaded["model"], dict):
        loaded = loaded["model"]
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


def prune_epoch_checkpoints(output_dir: str, keep: set) -> None:
    for path in glob.glob(os.path.join(output_dir, "epoch_*.pdstates")):
        prefix = strip_suffix(path)
        if os.path.basename(prefix) not in keep:
            for suffix in SUFFIXES:
                if os.path.exists(prefix + suffix):
                    os.remove(prefix + suffix)
