"""Naming and reading ppdlx checkpoints of either layout; writing one file atomically.

A checkpoint is named by a path (``output/x/best``); a ``.pdparams``/``.pdopt``/``.pdstates`` suffix is
ignored, and a file inside a unit (``output/x/best/model.pdparams``) names the unit. Two layouts are read:

* a unit directory (:mod:`ppdlx.checkpoint.unit`), checked against its manifest;
* the earlier layout, files ``<prefix>.pdparams`` / ``.pdopt`` / ``.pdstates`` renamed into place one after
  another (``tools/convert_weights.py`` still writes its ``.pdparams`` + ``.pdstates`` so). Each file read
  must load as what it should hold; a training checkpoint read whole must hold all three, agreeing (the same
  optimizer step, ``.pdstates`` written last): a save killed between two renames left a mix.

Loading a state into a model casts each value to the dtype the model holds (:func:`set_state_cast`), so a
float32 checkpoint loads into an AMP O2 model's fp16 parameters and back.
"""
from __future__ import annotations

import io
import logging
import os
import pickle

import paddle

from ppdlx.checkpoint.unit import (MANIFEST, MODEL, OPTIMIZER, STATES, UNIT_FILES, CheckpointError, fsync_dir,
                                   is_unit, read_file, read_manifest, write_durably)
from ppdlx.errors import ConfigError
from ppdlx.weights.paddle_pickle import load_paddle_pickle
from ppdlx.weights.unpickle import Refused, refusal_line, restricted_loads

log = logging.getLogger("ppdlx")

SUFFIXES = (".pdparams", ".pdopt", ".pdstates")
# model.weights_copy: which of a checkpoint's two copies of the weights model.weights loads
WEIGHTS_COPIES = ("auto", "ema", "raw")
ROLES = {"model": (MODEL, ".pdparams"), "optimizer": (OPTIMIZER, ".pdopt"), "states": (STATES, ".pdstates")}
# Earlier layout: a .pdparams/.pdopt written this long after its .pdstates came from a later save that was
# killed before its own .pdstates (a copy that did not keep the times writes all three within moments).
MIXED_AFTER_SECONDS = 60


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint file whose pickle names code to run: refused, never passed over for an older checkpoint."""


def serialize(obj, plain_pickle: bool = False):
    """The bytes ``paddle.save`` writes (``plain_pickle``: ``pickle``, which keeps numpy RNG arrays as they are)."""
    if plain_pickle:
        return pickle.dumps(obj, protocol=4)
    buffer = io.BytesIO()
    paddle.save(obj, buffer)
    return buffer.getbuffer()


def atomic_save(obj, path: str, plain_pickle: bool = False) -> None:
    """One file written to a temporary name, fsynced and renamed into place (the earlier layout's writer)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        write_durably(tmp, serialize(obj, plain_pickle))
        os.replace(tmp, path)
        fsync_dir(directory)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def strip_suffix(path: str) -> str:
    for suffix in SUFFIXES:
        if path.endswith(suffix):
            return path[: -len(suffix)]
    return path


def locate(path: str):
    """``("unit", directory)``, ``("files", prefix)`` (earlier layout) or ``(None, prefix)``: what ``path`` names."""
    if os.path.basename(path) in UNIT_FILES + (MANIFEST,) and is_unit(os.path.dirname(path) or "."):
        return "unit", os.path.dirname(path)
    prefix = strip_suffix(path)
    prefix = prefix.rstrip(os.sep) or prefix
    if is_unit(prefix):
        return "unit", prefix
    if any(os.path.isfile(prefix + suffix) for suffix in SUFFIXES):
        return "files", prefix
    return None, prefix


def is_ppdlx_prefix(path: str) -> bool:
    return locate(path)[0] is not None


def not_found(prefix: str) -> str:
    if os.path.isdir(prefix):
        inside = [n for n in ("best", "latest") if locate(os.path.join(prefix, n))[0]]
        return f"{prefix} is a directory, not a checkpoint" + (f" (use {prefix}/{inside[0]})" if inside else "")
    return f"{prefix}.pdparams not found, nor a checkpoint directory {prefix}"


def _loaded(data: bytes, path: str, role: str):
    """Unpickle one file's bytes through the allow-list (:mod:`ppdlx.weights.paddle_pickle`): ``.pdstates`` as
    plain data, the others as ``paddle.load`` returns them. A global outside the allow-list is refused naming
    the file; what does not load as a dict is named as damaged."""
    try:
        value = restricted_loads(data) if role == "states" else load_paddle_pickle(data)
    except Refused as err:
        raise UnsafeCheckpointError(refusal_line(path, err)) from None
    except Exception as err:  # noqa: BLE001 - any unpickling failure means the same to the user
        raise CheckpointError(f"{path} is truncated or damaged (it does not load: {type(err).__name__})") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path} is truncated or damaged (it loads as {type(value).__name__}, not a dict)")
    return value


def _read_plain(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as err:
        raise CheckpointError(f"{path} cannot be read ({err.strerror})") from None


def read_checkpoint(path: str, roles=("model", "optimizer", "states"), require=()) -> dict:
    """``{role: loaded dict or None}`` for ``roles`` of the checkpoint ``path`` names (verified); a role in
    ``require`` that the checkpoint lacks is an error. Reading all three of an earlier-layout checkpoint
    requires all three and checks that they come from one save."""
    kind, where = locate(path)
    if kind is None:
        raise CheckpointError(not_found(where))
    out = {}
    if kind == "unit":
        manifest = read_manifest(where)
        for role in roles:
            name = ROLES[role][0]
            if name not in manifest["files"]:
                if role in require:
                    raise CheckpointError(f"{where} holds no {name}")
                out[role] = None
                continue
            out[role] = _loaded(read_file(where, manifest, name), os.path.join(where, name), role)
        return out
    whole = set(roles) == set(ROLES)
    for role in roles:
        file = where + ROLES[role][1]
        if not os.path.isfile(file):
            if role in require or whole:
                raise CheckpointError(f"{file} is missing")
            out[role] = None
            continue
        out[role] = _loaded(_read_plain(file), file, role)
    if whole:
        _check_one_save(where, out)
    return out


def _check_one_save(prefix: str, loaded: dict) -> None:
    """Earlier layout: the three files of ``prefix`` must come from the same save."""
    saved = (loaded["optimizer"].get("LR_Scheduler") or {}).get("last_epoch")
    recorded = (loaded["states"].get("lr_schedule") or {}).get("last_epoch")
    if saved is not None and recorded is not None and saved != recorded:
        raise CheckpointError(f"{prefix}.pdopt (LR step {saved}) and {prefix}.pdstates (LR step {recorded}) come "
                              f"from different saves: a save was interrupted between them")
    states_time = os.path.getmtime(prefix + ".pdstates")
    for suffix in (".pdparams", ".pdopt"):
        late = os.path.getmtime(prefix + suffix) - states_time
        if late > MIXED_AFTER_SECONDS:
            raise CheckpointError(f"{prefix}{suffix} was written {late:.0f} s after {prefix}.pdstates: it comes from "
                                  f"a later save that was interrupted before its .pdstates")


def load_states(path: str) -> dict:
    """The ``.pdstates`` of the checkpoint ``path`` names (``output/x/latest`` or ``output/x/latest.pdstates``)."""
    return read_checkpoint(path, ("states",), require=("states",))["states"]


def read_pdparams(path: str, copy: str = "auto") -> dict:
    """The model state of the checkpoint ``path`` names, as name -> tensor (a ``{"model": ...}`` wrapper is
    unwrapped); a missing or damaged file is one line starting ``model.weights=<path>:``.

    ``copy`` (``model.weights_copy``): a run with ``ema.eval_with_ema`` picks ``best`` and reports its
    metrics on the EMA, which the checkpoint keeps beside the raw weights, so ``auto`` loads the copy
    its last metrics were measured on; ``ema`` or ``raw`` name one."""
    if copy not in WEIGHTS_COPIES:
        raise ConfigError(f"model.weights_copy={copy!r}: use {', '.join(WEIGHTS_COPIES)}")
    try:
        # the .pdstates (with the EMA) only when the copy may come from it
        loaded = read_checkpoint(path, ("model",) if copy == "raw" else ("model", "states"), require=("model",))
    except CheckpointError as err:
        raise CheckpointError(f"model.weights={path}: {err}") from None
    state, states = loaded["model"], loaded.get("states") or {}
    if isinstance(state, dict) and "model" in state and isinstance(state["model"], dict):
        state = state["model"]
    shadow = (states.get("ema") or {}).get("shadow")
    measured_on = (states.get("last_metrics") or {}).get("weights", "raw")
    if copy == "ema" and not shadow:
        raise CheckpointError(f"model.weights={path}: model.weights_copy=ema, but the checkpoint holds no EMA "
                              f"(trained with ema.enabled=false); use model.weights_copy=auto")
    if copy == "ema" or (copy == "auto" and shadow and measured_on == "ema"):
        log.info("model.weights=%s: the EMA copy, %s (-o model.weights_copy=raw loads the raw weights)", path,
                 "as asked" if copy == "ema" else "the weights its metrics were measured on")
        return {**state, **shadow}
    return state


def set_state_cast(model, state: dict) -> None:
    """Set the entries of ``state`` (all or some of ``model.state_dict()``'s keys) into the model, each
    cast to the dtype the model holds: a float32 checkpoint into an O2 model's fp16 parameters, or
    back. ``Layer.set_state_dict`` refuses a dtype mismatch and warns for every key a partial dict
    lacks."""
    own = model.state_dict()
    with paddle.no_grad():
        for key, value in state.items():
            target = own.get(key)
            if target is None:
                continue
            if not paddle.is_tensor(value):
                value = paddle.to_tensor(value)
            if value.dtype != target.dtype:
                value = value.astype(target.dtype)
            target.set_value(value)


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


def load_prefix_weights(model, path: str, copy: str = "auto") -> list:
    """A ppdlx checkpoint's model state into ``model`` as it is (no import, no head reset)."""
    return check_and_set(model, read_pdparams(path, copy), path)
