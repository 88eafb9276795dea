"""Convert a published checkpoint onto ppdlx's parameter names, in memory: ``convert_state`` (and
``import_state``, which recognises the layout first); ``ppdlx.checkpoint.convert_weights`` writes the result.

``convert_state(source, path, model)``:

1. reads the file without running its code (``readers.read_checkpoint``);
2. finds the state_dict inside wrappers (``state_dict_ema``/``model_ema`` first, then
   ``state_dict``/``model``; ``state_key`` picks one) and strips ``module.``/``_orig_mod.``/``model.``
   when every key carries it;
3. renames every tensor with the source's mapping (``sources.SOURCES``) and checks that each one
   is used exactly once (or dropped for a stated reason), that every ppdlx parameter and BN
   statistic is filled and that shapes match -- the first problem is one line naming the file
   and the tensor;
4. classifier tensors (the ones whose shape follows ``num_classes``, found by building the model
   at two class counts) are kept when ``num_classes`` equals the file's, otherwise left out of the
   output so the model initialises them for the new class count (one note line says so);
5. returns float32 arrays and the metadata (``{source, mapping_version, file, sha256, ...}``) that
   ``ppdlx.checkpoint.convert_weights`` writes as ``.pdparams`` and ``.pdstates`` (``weights_import``).
"""
from __future__ import annotations

import collections
import datetime
import os
from typing import Callable, Optional, Union

import numpy as np
import paddle.nn as nn

import ppdlx.models  # noqa: F401  (registers the families)
from ppdlx.registry import MODELS
from ppdlx.weights.errors import WeightsError
from ppdlx.weights.readers import read_checkpoint
from ppdlx.weights.sources import SOURCES, Drop, MappingContext, detect_source

STATE_KEYS_EMA_FIRST = ("state_dict_ema", "model_ema", "state_dict", "model")
STATE_KEYS_RAW_FIRST = ("state_dict", "model", "state_dict_ema", "model_ema")
WRAPPER_PREFIXES = ("module.", "_orig_mod.", "model.")
TORCH_BN_RENAMES = {"running_mean": "_mean", "running_var": "_variance"}


def _is_tensor_dict(obj) -> bool:
    return (isinstance(obj, dict) and bool(obj) and all(isinstance(k, str) for k in obj)
            and all(isinstance(v, np.ndarray) for v in obj.values()))


def find_state_dict(content, path: str, state_key: Optional[str] = None, prefer_ema: bool = True):
    """``(state_dict, entry)``; ``entry`` names where it was found (``"<top level>"``, ``"state_dict_ema"``)."""
    if state_key:
        node = content
        for part in state_key.split("."):
            if not isinstance(node, dict) or part not in node:
                keys = sorted(map(str, node)) if isinstance(node, dict) else type(node).__name__
                raise WeightsError(f"{path}: --state-key {state_key}: no entry '{part}' (found: {keys})")
            node = node[part]
        if not _is_tensor_dict(node):
            raise WeightsError(f"{path}: --state-key {state_key} is not a name -> tensor dict")
        return node, state_key
    if _is_tensor_dict(content):
        return content, "<top level>"
    if isinstance(content, dict):
        for key in STATE_KEYS_EMA_FIRST if prefer_ema else STATE_KEYS_RAW_FIRST:
            if _is_tensor_dict(content.get(key)):
                return content[key], key
        keys = sorted(str(k) for k in content)
        raise WeightsError(f"{path}: no state_dict found (top-level entries: {', '.join(keys[:12])}); "
                           f"name the entry with --state-key")
    raise WeightsError(f"{path}: holds a {type(content).__name__}, not a state_dict")


def strip_wrapper_prefixes(state: dict):
    stripped = []
    while True:
        prefix = next((p for p in WRAPPER_PREFIXES if all(k.startswith(p) for k in state)), None)
        if prefix is None:
            return state, stripped
        state = collections.OrderedDict((k[len(prefix):], v) for k, v in state.items())
        stripped.append(prefix)


def model_factory(model: Union[str, Callable], model_args: Optional[dict] = None) -> Callable:
    """``model``: a registered name, or a callable ``num_classes -> Layer``."""
    if callable(model):
        return model
    builder = MODELS.get(model)
    return lambda num_classes: builder(num_classes=num_classes, **(model_args or {}))


def _owner_is_linear(model, key) -> bool:
    layer_name, _, param = key.rpartition(".")
    layer = dict(model.named_sublayers()).get(layer_name)
    return isinstance(layer, nn.Linear) and param == "weight"


def _class_axis(shape_one, shape_two):
    """(axis, per-class size, size without classes) of a parameter that follows num_classes."""
    axis = next(i for i, (a, b) in enumerate(zip(shape_one, shape_two)) if a != b)
    per_class = shape_two[axis] - shape_one[axis]
    return axis, per_class, shape_one[axis] - per_class


def _plan(source, state, path, ctx, targets):
    """src key -> target key, plus the drops; every problem raises one line."""
    plan, drops, owner = collections.OrderedDict(), [], {}
    for key in state:
        name = key
        if source.framework == "torch":
            layer, _, param = key.rpartition(".")
            if param == "num_batches_tracked":
                drops.append((key, "BatchNorm step counter"))
                continue
            name = f"{layer}.{TORCH_BN_RENAMES.get(param, param)}" if layer else key
        target = source.rename(name, ctx)
        if isinstance(target, Drop):
            drops.append((key, target.reason))
            continue
        if target is None or target not in targets:
            hint = f" (maps to '{target}', which the model lacks)" if target else ""
            raise WeightsError(f"{path}: tensor '{key}' {list(state[key].shape)} is not part of the "
                               f"'{source.name}' layout of this model{hint}; is this the right --from/--model?")
        if target in owner:
            raise WeightsError(f"{path}: tensors '{owner[target]}' and '{key}' both map to ppdlx '{target}'")
        owner[target] = key
        plan[key] = target
    return plan, drops, owner


def convert_state(source_name: str, path: str, model: Union[str, Callable], num_classes: Optional[int] = None,
                  state_key: Optional[str] = None, prefer_ema: bool = True, model_args: Optional[dict] = None):
    """Read and map; returns ``(state, metadata)`` with ``state`` in the model's key order."""
    if source_name not in SOURCES:
        raise WeightsError(f"unknown weights source '{source_name}' (known: {', '.join(sorted(SOURCES))})")
    source = SOURCES[source_name]
    build = model_factory(model, model_args)
    model_name = model if isinstance(model, str) else getattr(model, "__name__", "custom")
    probe_one, probe_two = build(1), build(2)
    if not isinstance(probe_one, source.model_types):
        kinds = ", ".join(t.__name__ for t in source.model_types)
        raise WeightsError(f"--from {source_name} maps onto {kinds} models; '{model_name}' is a "
                           f"{type(probe_one).__name__}")
    targets = {k: tuple(v.shape) for k, v in probe_one.state_dict().items()}
    second = {k: tuple(v.shape) for k, v in probe_two.state_dict().items()}
    class_keys = {k for k in targets if targets[k] != second[k]}

    checkpoint = read_checkpoint(path)
    state, entry = find_state_dict(checkpoint.content, path, state_key, prefer_ema)
    state, stripped = strip_wrapper_prefixes(state)
    ctx = MappingContext(state, probe_one)
    plan, drops, owner = _plan(source, state, path, ctx, targets)
    missing = [k for k in targets if k not in owner and k not in class_keys]
    if missing:
        raise WeightsError(f"{path}: {len(missing)} ppdlx parameter(s) of '{model_name}' get no tensor from the "
                           f"file, e.g. '{missing[0]}' {list(targets[missing[0]])} (entry '{entry}', "
                           f"--from {source_name})")

    notes, arrays, file_classes, cast_from = [], {}, set(), set()
    for key, target in plan.items():
        array = state[key]
        if source.framework == "torch" and _owner_is_linear(probe_one, target) and array.ndim == 2:
            array = array.T
        if source.adapt is not None:
            array, note = source.adapt(key, array, targets[target])
            if note and note not in notes:
                notes.append(note)
        expected = targets[target]
        if target in class_keys:
            axis, per_class, base = _class_axis(targets[target], second[target])
            count = (array.shape[axis] - base) / per_class if array.ndim == len(expected) else -1
            expected = tuple(array.shape[axis] if i == axis else s for i, s in enumerate(expected))
            if count >= 1 and count == int(count):
                file_classes.add(int(count))
        if tuple(array.shape) != expected:
            raise WeightsError(f"{path}: tensor '{key}' has shape {list(state[key].shape)} but ppdlx '{target}' "
                               f"needs {list(expected)}")
        if array.dtype != np.float32:
            cast_from.add(str(array.dtype))
        arrays[target] = np.ascontiguousarray(array, dtype=np.float32)
    if len(file_classes) > 1:
        raise WeightsError(f"{path}: the classifier tensors disagree on the class count {sorted(file_classes)}")
    source_classes = file_classes.pop() if file_classes else None
    if source_classes is None and class_keys and not num_classes:
        raise WeightsError(f"{path}: no classifier tensors for '{sorted(class_keys)[0]}' in the file: "
                           f"pass --num-classes")
    num_classes = num_classes or source_classes
    reinitialised = []
    if class_keys and num_classes != source_classes:
        reinitialised = [k for k in targets if k in class_keys]
        found = f"{source_classes} classes in the file" if source_classes else "not in the file"
        notes.append(f"classifier {', '.join(reinitialised)} ({found}) not written: "
                     f"the model initialises it for {num_classes} classes")
    if cast_from:
        notes.append(f"cast from {', '.join(sorted(cast_from))} to float32")
    partial = [k for k in targets if k in class_keys and k not in arrays and k not in reinitialised]
    if partial:
        held = ", ".join(f"'{owner[k]}'" for k in sorted(class_keys) if k in owner)
        raise WeightsError(f"{path}: the file holds the classifier's {held} but nothing for ppdlx '{partial[0]}' "
                           f"(entry '{entry}'): a classifier cannot be half converted: "
                           f"convert a complete state_dict, or pass --num-classes with another class count to "
                           f"initialise the classifier afresh")
    out = collections.OrderedDict((k, arrays[k]) for k in targets if k not in reinitialised)
    dropped = collections.Counter(reason for _, reason in drops)
    metadata = {
        "source": source_name, "mapping_version": source.version, "file": os.path.abspath(path),
        "sha256": checkpoint.sha256, "format": checkpoint.format, "entry": entry, "stripped_prefixes": stripped,
        "model": model_name, "num_classes": num_classes, "source_num_classes": source_classes,
        "tensors_read": len(state), "parameters_written": len(out), "reinitialised": reinitialised,
        "dropped": dict(dropped), "notes": notes,
        "converted_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    return out, metadata


def summary_line(metadata: dict) -> str:
    dropped = ", ".join(f"{n} {reason}" for reason, n in metadata["dropped"].items()) or "none"
    return (f"{metadata['source']} {metadata['format']} '{metadata['entry']}' -> {metadata['model']} "
            f"({metadata['num_classes']} classes): {metadata['tensors_read']} tensors read, "
            f"{metadata['parameters_written']} parameters written, dropped: {dropped}; "
            f"sha256 {metadata['sha256'][:12]}, mapping {metadata['mapping_version']}")


def parse_weights_spec(spec: str):
    """``"torchvision:resnet50.pth"`` -> ``("torchvision", "resnet50.pth")``; a spec without a known
    source prefix -> ``(None, spec)`` (a ppdlx prefix, or a foreign file whose layout is detected)."""
    source, sep, path = spec.partition(":")
    return (source, path) if sep and source in SOURCES else (None, spec)


def import_state(spec: str, model: Union[str, Callable], num_classes: Optional[int] = None, **kwargs):
    """In-memory import for ``model.weights``: ``(state, metadata)`` from ``SOURCE:FILE`` or a foreign
    ``FILE`` whose layout ``detect_source`` recognises; ``WeightsError`` when it recognises none."""
    source, path = parse_weights_spec(spec)
    if source is None:
        content = read_checkpoint(path).content
        state, _ = find_state_dict(content, path, kwargs.get("state_key"), kwargs.get("prefer_ema", True))
        source = detect_source(strip_wrapper_prefixes(state)[0])
        if source is None:
            raise WeightsError(f"{path}: the tensor names follow none of the known layouts "
                               f"({', '.join(sorted(SOURCES))}); name one as SOURCE:{path}")
    return convert_state(source, path, model, num_classes, **kwargs)
