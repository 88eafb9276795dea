"""Checkpoints: ``<prefix>.pdparams`` (model), ``.pdopt`` (optimizer), ``.pdstates``
(epoch, step, best metric, LR schedule, loss scaler, EMA, RNG, extra state).

Every file is written to a temporary name and renamed into place, ``.pdstates``
last: an interrupted save never leaves a half-written file under a real name, and
a prefix counts as complete only when its ``.pdstates`` exists.

``load_weights`` is the one loader of ``model.weights`` (train, eval, export, distill, detect_image):
a ppdlx prefix, or a foreign checkpoint (``SOURCE:FILE`` or a file whose layout ``ppdlx.weights``
recognises) imported in memory; ``model.reset_head`` decides what a classifier of another class count does.
"""
from __future__ import annotations

import glob
import logging
import os
import random

import numpy as np
import paddle

from ppdlx.engine.checkpoint_files import (SUFFIXES, atomic_save, check_and_set, is_ppdlx_prefix, load_states,  # noqa: F401
                                           read_pdparams, strip_suffix)
from ppdlx.errors import ConfigError

log = logging.getLogger("ppdlx")
RESET_HEAD = ("auto", "true", "false")


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


def resolve_resume(resume: str, output_dir: str):
    """``auto`` -> ``<output_dir>/latest`` if complete, else None; otherwise the given prefix. Converted
    weights (``tools/convert_weights.py``: ``weights_import`` and no ``epoch``) are refused."""
    if resume == "auto":
        prefix = os.path.join(output_dir, "latest")
        return prefix if os.path.isfile(prefix + ".pdstates") else None
    prefix = strip_suffix(resume)
    if not os.path.isfile(prefix + ".pdstates"):
        raise ConfigError(f"train.resume={resume}: no complete checkpoint at {prefix}.pdstates "
                          f"(use train.resume=auto or a prefix such as {output_dir}/latest)")
    states = load_states(prefix + ".pdstates")
    if isinstance(states, dict) and "weights_import" in states and "epoch" not in states:
        origin = states["weights_import"]
        raise ConfigError(f"train.resume={resume}: {prefix} holds weights converted from {origin.get('source')} "
                          f"({origin.get('file')}), not a training checkpoint (no epoch, optimizer or RNG state); "
                          f"start from them with -o model.weights={prefix} and no train.resume")
    return prefix


def load_checkpoint(prefix: str):
    model = paddle.load(prefix + ".pdparams")
    opt = paddle.load(prefix + ".pdopt") if os.path.isfile(prefix + ".pdopt") else None
    states = load_states(prefix + ".pdstates")
    return model, opt, states


def classifier_keys(model) -> list:
    """The state_dict keys of the classifier named by the model's ``default_cfg["classifier"]``."""
    prefix = (getattr(model, "default_cfg", None) or {}).get("classifier")
    if not prefix:
        return []
    return [k for k in model.state_dict() if k.startswith(prefix + ".")]


def _import_foreign(model, spec: str) -> dict:
    """A foreign checkpoint mapped onto ppdlx names by ``ppdlx.weights.import_state``, at the file's class
    count (the head is then kept or reset like a ppdlx file's). Needs the model's registry name and
    arguments (``model.build_spec``, recorded by the engine's builders) to probe the class-count shapes."""
    from ppdlx.weights import import_state, summary_line
    build_spec = getattr(model, "build_spec", None)
    if build_spec is None:
        raise ConfigError(f"model.weights={spec}: a foreign checkpoint is imported into models built from a config "
                          f"(ppdlx.engine); convert it first with tools/convert_weights.py")
    name, args = build_spec
    state, metadata = import_state(spec, name, model_args=args)
    log.info("model.weights=%s: imported %s", spec, summary_line(metadata))
    for note in metadata["notes"]:
        log.info("note: %s", note)
    return {k: paddle.to_tensor(v) for k, v in state.items()}


def _reset_head(model, loaded: dict, path: str, reset_head: str) -> dict:
    """``loaded`` without the classifier keys when ``reset_head`` says so (one log line)."""
    head = [k for k in classifier_keys(model) if k in loaded]
    own = model.state_dict()
    mismatched = [k for k in loaded if k in own and list(own[k].shape) != list(loaded[k].shape)]
    if not head or (reset_head == "auto" and not (mismatched and set(mismatched) <= set(head))) or \
            reset_head == "false":
        return loaded
    shapes = ", ".join(f"{k} {list(loaded[k].shape)} -> {list(own[k].shape)}" for k in head)
    log.info("model.weights=%s: classifier re-initialised (%s; model.reset_head=%s)", path, shapes, reset_head)
    return {k: v for k, v in loaded.items() if k not in head}


def load_weights(model, path: str, reset_head="false") -> list:
    """Load weights only (``model.weights``): a ppdlx prefix, ``SOURCE:FILE`` or a foreign file. Shape
    mismatch -> one line naming the parameter, unless ``reset_head`` (``auto``: only the classifier's shapes
    differ; ``true``: always) drops the classifier so the model keeps its fresh one.

    Returns the names of model parameters that were not loaded.
    """
    reset_head = {True: "true", False: "false"}.get(reset_head, reset_head)
    if reset_head not in RESET_HEAD:
        raise ConfigError(f"model.reset_head={reset_head!r}: use auto, true or false")
    from ppdlx.weights import parse_weights_spec
    source, file = parse_weights_spec(path)
    if source is None and (is_ppdlx_prefix(path) or not os.path.isfile(file)):
        loaded = read_pdparams(path)
    else:
        loaded = _import_foreign(model, path)
    return check_and_set(model, _reset_head(model, loaded, path, reset_head), path)


def prune_epoch_checkpoints(output_dir: str, keep: set) -> None:
    for path in glob.glob(os.path.join(output_dir, "epoch_*.pdstates")):
        prefix = strip_suffix(path)
        if os.path.basename(prefix) not in keep:
            for suffix in SUFFIXES:
                if os.path.exists(prefix + suffix):
                    os.remove(prefix + suffix)
