"""A training's checkpoints: saving its state each epoch, finding the one to resume, its random states.

On disk (:mod:`ppdlx.checkpoint.unit`) each save is one directory ``<output_dir>/epoch_N/`` holding
``model.pdparams`` (model), ``optimizer.pdopt`` (optimizer), ``states.pdstates`` (epoch, step, best metric,
LR schedule, loss scaler, EMA, RNG, hooks' state) and ``manifest.json`` (written last: sizes, sha256, epoch,
model identity). It appears whole by one rename; ``latest`` and ``best`` are symlinks to such directories,
each replaced by one rename. Readers verify the manifest; checkpoints of the earlier three-file layout
(``<prefix>.pdparams`` / ``.pdopt`` / ``.pdstates``) are still read (:mod:`ppdlx.checkpoint.files`).

``train.resume=auto`` takes ``latest``; when it is missing or fails verification, the newest complete
``epoch_N``/``best`` (by the epoch it records), with one log line saying which.
"""
from __future__ import annotations

import logging
import os
import random
import re

import numpy as np
import paddle

import ppdlx.checkpoint.unit as unit
import ppdlx.models  # noqa: F401  (registers every family: a manifest's model name resolves through MODELS)
from ppdlx.checkpoint.files import (SUFFIXES, UnsafeCheckpointError, load_states, locate, not_found, read_checkpoint,
                                    serialize, strip_suffix)
from ppdlx.checkpoint.unit import CheckpointError
from ppdlx.errors import ConfigError
from ppdlx.registry import MODELS

log = logging.getLogger("ppdlx")
LATEST, BEST = "latest", "best"
EPOCH_NAME = re.compile(r"epoch_(\d+)")


def _device_generator():
    """The Paddle generator this process's GPU draws from (None on CPU). ``paddle.get_rng_state`` would
    return one per visible GPU, and ``set_rng_state`` needs as many back: a rank uses its own GPU's only."""
    device = paddle.get_device()
    if device.startswith("gpu:"):
        return paddle.framework.core.default_cuda_generator(int(device.split(":")[1]))
    return None


def capture_rng() -> dict:
    """This process's random state: Paddle's CPU generator, its GPU's generator, numpy's and Python's."""
    device = _device_generator()
    return {"cpu": paddle.framework.core.default_cpu_generator().get_state(),
            "device": device.get_state() if device is not None else None,
            "numpy": np.random.get_state(), "python": random.getstate()}


def restore_rng(state: dict) -> None:
    device = _device_generator()
    if "paddle" in state:  # older checkpoints: paddle.get_rng_state() of the saving process (every GPU's on GPU)
        saved = state["paddle"]
        if device is None:
            paddle.framework.core.default_cpu_generator().set_state(saved[0])
        else:
            device.set_state(saved[int(paddle.get_device().split(":")[1]) % len(saved)])
    else:
        paddle.framework.core.default_cpu_generator().set_state(state["cpu"])
        if device is not None and state["device"] is not None:
            device.set_state(state["device"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


# ---------------------------------------------------------------------------------------------- saving
def save_checkpoint(path: str, model_state: dict, optimizer_state: dict | None, states: dict,
                    identity: dict | None = None, improved: bool = False) -> None:
    """Write the unit ``path`` (a directory). ``model_state`` values may be tensors or numpy arrays (saved as
    tensors either way); ``identity``: the model's registry ``name`` and ``num_classes`` for the manifest."""
    model_state = {k: paddle.to_tensor(v) if isinstance(v, np.ndarray) else v for k, v in model_state.items()}
    files = {unit.MODEL: lambda: serialize(model_state)}
    if optimizer_state is not None:
        files[unit.OPTIMIZER] = lambda: serialize(optimizer_state)
    files[unit.STATES] = lambda: serialize(states, plain_pickle=True)
    model = {**(identity or {}), "parameters": len(model_state), "digest": unit.model_digest(model_state)}
    unit.write_unit(path, files, {"epoch": states.get("epoch"), "global_step": states.get("global_step"),
                                  "improved": bool(improved), "model": model})


def save_epoch(output_dir: str, epoch: int, model_state: dict, optimizer_state, states: dict, *,
               identity: dict | None = None, improved: bool = False, keep=lambda epoch: True) -> None:
    """The training's save: unit ``epoch_<epoch>``, then ``latest`` (and ``best`` when ``improved``) pointed at
    it; a unit that lost its pointer and that ``keep(epoch)`` does not keep is removed. A write that fails
    (disk full, directory gone read-only) is one line; the units and pointers already there stay as they were."""
    name = f"epoch_{epoch}"
    before = {p: unit.pointer_target(output_dir, p) for p in (LATEST, BEST)}
    try:
        save_checkpoint(os.path.join(output_dir, name), model_state, optimizer_state, states, identity, improved)
        unit.point(output_dir, LATEST, name)
        if improved:
            unit.point(output_dir, BEST, name)
        after = {p: unit.pointer_target(output_dir, p) for p in (LATEST, BEST)}
        for old in set(before.values()) - set(after.values()) - {None}:
            match = EPOCH_NAME.fullmatch(old)
            if match and not keep(int(match.group(1))) and os.path.isdir(os.path.join(output_dir, old)):
                unit.retire(os.path.join(output_dir, old))
    except OSError as err:
        now = unit.pointer_target(output_dir, LATEST)
        kept = f"latest -> {now} is complete" if now else "no earlier checkpoint was touched"
        raise CheckpointError(f"saving checkpoint {os.path.join(output_dir, name)} failed ({err.strerror or err}: "
                              f"{err.filename}); {kept}. Free space or fix the directory, then continue with "
                              f"train.resume=auto") from None


# ---------------------------------------------------------------------------------------------- finding
def checkpoint_names(output_dir: str) -> list:
    """Checkpoint names present in ``output_dir`` (either layout, complete or not): latest, best, epoch_N."""
    if not os.path.isdir(output_dir):
        return []
    names = set()
    for entry in os.listdir(output_dir):
        name = strip_suffix(entry) if entry.endswith(SUFFIXES) else entry
        if name in (LATEST, BEST) or EPOCH_NAME.fullmatch(name):
            names.add(name)
    return sorted(names, key=lambda n: (n != LATEST, n != BEST, int(n[6:]) if n.startswith("epoch_") else 0))


def recorded_epoch(path: str) -> int:
    """The epoch a checkpoint records (its manifest's, else its ``.pdstates``'); CheckpointError if unreadable."""
    kind, where = locate(path)
    epoch = unit.read_manifest(where).get("epoch") if kind == "unit" else load_states(path).get("epoch")
    if not isinstance(epoch, int):
        raise CheckpointError(f"{where} records no epoch (not a training checkpoint)")
    return epoch


def recorded_global_batch(path: str):
    """The global batch a checkpoint's manifest records (``optim.global_batch_record``), None when it has none."""
    kind, where = locate(path)
    return (unit.read_manifest(where).get("model") or {}).get("global_batch") if kind == "unit" else None


def verify(path: str) -> None:
    """Raise CheckpointError unless ``path`` names a complete, intact training checkpoint."""
    kind, where = locate(path)
    if kind == "unit":
        unit.verify_unit(where)
    else:
        read_checkpoint(path)
    recorded_epoch(path)


def newest_complete(output_dir: str, skip=()) -> tuple:
    """``(path, epoch, problems)``: the newest checkpoint of ``output_dir`` that verifies (path None if none)
    and why the others examined did not."""
    candidates, problems = [], []
    for name in checkpoint_names(output_dir):
        if name in skip:
            continue
        path = os.path.join(output_dir, name)
        try:
            candidates.append((recorded_epoch(path), name != BEST, path))
        except UnsafeCheckpointError:
            raise
        except CheckpointError as err:
            problems.append(str(err))
    for epoch, _, path in sorted(candidates, reverse=True):
        try:
            verify(path)
            return path, epoch, problems
        except UnsafeCheckpointError:
            raise
        except CheckpointError as err:
            problems.append(str(err))
    return None, None, problems


def _refuse_converted(setting: str, path: str) -> None:
    states = load_states(path)
    if "weights_import" in states and "epoch" not in states:
        origin = states["weights_import"]
        raise ConfigError(f"train.resume={setting}: {path} holds weights converted from {origin.get('source')} "
                          f"({origin.get('file')}), not a training checkpoint (no epoch, optimizer or RNG state); "
                          f"start from them with -o model.weights={path} and no train.resume")


def resolve_resume(resume: str, output_dir: str):
    """The checkpoint to resume from, verified. ``auto``: ``<output_dir>/latest``, else the newest complete
    ``epoch_N``/``best`` (one log line), else None when the directory holds no checkpoint at all (refused when
    it holds only broken ones). A path: that checkpoint (a suffix is dropped). Converted weights
    (``tools/convert_weights.py``: ``weights_import`` and no ``epoch``) are refused."""
    if resume != "auto":
        kind, path = locate(resume)
        if kind is None:
            raise ConfigError(f"train.resume={resume}: no complete checkpoint there ({not_found(path)}); use "
                              f"train.resume=auto or a checkpoint such as {output_dir}/latest")
        try:
            _refuse_converted(resume, path)
            verify(path)
        except UnsafeCheckpointError as err:
            raise UnsafeCheckpointError(f"train.resume={resume}: {err}") from None
        except CheckpointError as err:
            raise CheckpointError(f"train.resume={resume}: {err}; resume from another checkpoint, e.g. "
                                  f"train.resume=auto (the newest complete one in {output_dir})") from None
        return path
    latest = os.path.join(output_dir, LATEST)
    if not checkpoint_names(output_dir):
        return None
    try:
        verify(latest)
        return latest
    except UnsafeCheckpointError as err:
        raise UnsafeCheckpointError(f"train.resume=auto: {err}") from None
    except CheckpointError as err:
        reason = str(err) if locate(latest)[0] else f"{latest} is missing"
    path, epoch, problems = newest_complete(output_dir, skip=(LATEST,))
    if path is None:
        raise CheckpointError(f"train.resume=auto: {output_dir} holds checkpoints but none is complete ({reason}"
                              f"{'; ' + problems[0] if problems else ''}); resume from a checkpoint elsewhere "
                              f"(train.resume=<path>) or start over with train.resume=never")
    log.warning("train.resume=auto: %s; resuming from %s (epoch %d), the newest complete checkpoint",
                reason, path, epoch)
    return path


def load_checkpoint(path: str):
    """``(model state, optimizer state or None, states)`` of a verified training checkpoint."""
    loaded = read_checkpoint(path, require=("model", "states"))
    return loaded["model"], loaded["optimizer"], loaded["states"]


def _same_model_name(a: str, b: str) -> bool:
    if a == b:
        return True
    return a in MODELS and b in MODELS and MODELS.get(a) is MODELS.get(b)


def model_mismatch(loaded: dict, own: dict):
    """The first difference between two state dicts' names and shapes (None when they agree)."""
    for name, value in own.items():
        if name not in loaded:
            return f"the model's parameter '{name}' is not in the checkpoint"
        if list(loaded[name].shape) != list(value.shape):
            return f"parameter '{name}' is {list(loaded[name].shape)} in the checkpoint but {list(value.shape)} here"
    extra = [k for k in loaded if k not in own]
    return f"the checkpoint holds '{extra[0]}', which the model lacks" if extra else None


def check_resumable(path: str, model, model_name: str) -> None:
    """Refuse, before training, a checkpoint of another model: another registry name (manifest), or other
    parameter names or shapes (the manifest's digest first; the model file only when they differ)."""
    kind, where = locate(path)
    if kind == "unit":
        identity = unit.read_manifest(where).get("model") or {}
        name = identity.get("name")
        if name and not _same_model_name(name, model_name):
            classes = identity.get("num_classes")
            raise CheckpointError(f"train.resume: {path} is a checkpoint of model '{name}' ({classes} classes) but "
                                  f"this run builds '{model_name}'; set model.name={name}, or train into another "
                                  f"global.output_dir (or train.resume=never to replace it)")
        if identity.get("digest") == unit.model_digest(model.state_dict()):
            return
    problem = model_mismatch(read_checkpoint(path, ("model",), require=("model",))["model"], model.state_dict())
    if problem:
        raise CheckpointError(f"train.resume: {path} is a checkpoint of another model ({problem}); resume with the "
                              f"model.name/num_classes it was trained with, or train into another global.output_dir")
