"""``model.weights``: loading weights only into a built model (train, eval, export, distill, tools/infer).

The one loader of ``model.weights``: a ppdlx checkpoint (either layout, :mod:`ppdlx.checkpoint.files`), or a
foreign checkpoint (``SOURCE:FILE``, or a file whose layout ``ppdlx.weights`` recognises) imported in memory;
``model.reset_head`` decides what a classifier of another class count does.
"""
from __future__ import annotations

import logging
import os

import paddle

from ppdlx.checkpoint.files import check_and_set, is_ppdlx_prefix, read_pdparams
from ppdlx.errors import ConfigError
from ppdlx.weights import import_state, parse_weights_spec, summary_line

log = logging.getLogger("ppdlx")
RESET_HEAD = ("auto", "true", "false")


def classifier_keys(model) -> list:
    """The state_dict keys of the classifier named by the model's ``default_cfg["classifier"]``."""
    prefix = (getattr(model, "default_cfg", None) or {}).get("classifier")
    if not prefix:
        return []
    return [k for k in model.state_dict() if k.startswith(prefix + ".")]


def _import_foreign(model, spec: str) -> dict:
    """A foreign checkpoint mapped onto ppdlx names by ``ppdlx.weights.import_state``, at the file's class
    count (the head is then kept or reset like a ppdlx file's). Needs the model's registry name and arguments
    (``model.build_spec``, recorded by :func:`ppdlx.models.from_config.build_registered`) to probe the class-count
    shapes."""
    build_spec = getattr(model, "build_spec", None)
    if build_spec is None:
        raise ConfigError(f"model.weights={spec}: a foreign checkpoint is imported into models built from a config "
                          f"(ppdlx.models.from_config); convert it first with tools/convert_weights.py")
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


def load_weights(model, path: str, reset_head="false", copy: str = "auto") -> list:
    """Load weights only (``model.weights``): a ppdlx checkpoint, ``SOURCE:FILE`` or a foreign file. Shape
    mismatch -> one line naming the parameter, unless ``reset_head`` (``auto``: only the classifier's shapes
    differ; ``true``: always) drops the classifier so the model keeps its fresh one.

    ``copy`` (``model.weights_copy``): the EMA or the raw weights of a ppdlx checkpoint
    (:func:`ppdlx.checkpoint.files.read_pdparams`).

    Returns the names of model parameters that were not loaded.
    """
    reset_head = {True: "true", False: "false"}.get(reset_head, reset_head)
    if reset_head not in RESET_HEAD:
        raise ConfigError(f"model.reset_head={reset_head!r}: use auto, true or false")
    source, file = parse_weights_spec(path)
    if source is None and (is_ppdlx_prefix(path) or not os.path.isfile(file)):
        loaded = read_pdparams(path, copy)
    else:
        loaded = _import_foreign(model, path)
    return check_and_set(model, _reset_head(model, loaded, path, reset_head), path)
