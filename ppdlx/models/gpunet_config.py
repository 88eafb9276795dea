"""GPUNet's JSON architecture format: reading and validating a layer list (``ppdlx.models.gpunet``
documents the format). Every error is one ``ConfigError`` line naming the file, the entry index and
the key."""
from __future__ import annotations

import difflib
import json
from typing import Any, Dict, List

from ppdlx.errors import ConfigError

ACTIVATIONS = ("relu", "swish")
_IO = ("num_in_channels", "num_out_channels")
# keys the reference builder reads for each layer type (``stage`` is a name label only: optional)
REQUIRED_KEYS = {
    False: {
        "head": _IO,
        "conv": _IO + ("kernel_size", "stride", "act"),
        "irb": _IO + ("kernel_size", "stride", "expansion", "use_se", "act"),
        "fused_irb": _IO + ("kernel_size", "stride", "expansion", "use_se", "act"),
        "tail": _IO + ("num_classes",),
    },
    True: {
        "head": _IO,
        "head_large": _IO,
        "irb": _IO + ("kernel_size", "stride", "expansion", "groups"),
        "fused_irb": _IO + ("kernel_size", "stride", "expansion"),
        "tail": _IO + ("num_classes",),
    },
}
_POSITIVE_INT_KEYS = ("num_in_channels", "num_out_channels", "kernel_size", "stride", "groups",
                      "num_classes", "img_resolution")


def _fail(source, msg):
    raise ConfigError(f"{source}: {msg}".replace("\n", " "))


def _check_value(source, where, key, value):
    if key in _POSITIVE_INT_KEYS:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            _fail(source, f"{where}: '{key}' must be a positive integer, got {value!r}")
    elif key == "expansion":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            _fail(source, f"{where}: 'expansion' must be a positive number, got {value!r}")
    elif key in ("use_se", "distill"):
        if not isinstance(value, bool):
            _fail(source, f"{where}: '{key}' must be true or false, got {value!r}")
    elif key == "act":
        if value not in ACTIVATIONS:
            _fail(source, f"{where}: unsupported act {value!r} (GPUNet supports: relu, swish)")


def validate_config(config: Any, source: str = "<gpunet config>") -> List[Dict[str, Any]]:
    """Check a parsed GPUNet JSON; raise ``ConfigError`` (one line: file, entry index, key)."""
    if not isinstance(config, list):
        _fail(source, f"expected a JSON list of layer objects, got {type(config).__name__}")
    if not config:
        _fail(source, "empty layer list; entry 0 must be {\"layer_type\": \"data\", ...}")
    for i, entry in enumerate(config):
        if not isinstance(entry, dict):
            _fail(source, f"entry {i}: expected a JSON object, got {type(entry).__name__}")
        if "layer_type" not in entry:
            _fail(source, f"entry {i}: missing key 'layer_type'")
    data = config[0]
    if data["layer_type"] != "data":
        _fail(source, f"entry 0 must be the 'data' layer, got layer_type {data['layer_type']!r}")
    for key in ("img_resolution", "distill"):
        if key not in data:
            _fail(source, f"entry 0 (data): missing key '{key}'")
        _check_value(source, "entry 0 (data)", key, data[key])
    distill = data["distill"]
    family = REQUIRED_KEYS[distill]
    prev_out = None
    for i, entry in enumerate(config[1:], start=1):
        ltype = entry["layer_type"]
        where = f"entry {i} ({ltype})"
        if not isinstance(ltype, str):
            _fail(source, f"entry {i}: 'layer_type' must be a string, got {ltype!r}")
        if ltype == "data":
            _fail(source, f"entry {i}: 'data' is only allowed as entry 0")
        if ltype not in family:
            if ltype in REQUIRED_KEYS[not distill]:
                _fail(source, f"entry {i}: layer_type {ltype!r} is not supported when the data layer has "
                              f"distill={str(distill).lower()} (supported: {', '.join(family)})")
            close = difflib.get_close_matches(str(ltype), list(family), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            _fail(source, f"entry {i}: unknown layer_type {ltype!r}{hint} (known: {', '.join(family)})")
        for key in family[ltype]:
            if key not in entry:
                _fail(source, f"{where}: missing key '{key}'")
            _check_value(source, where, key, entry[key])
        if "act" in entry and ltype == "head" and not distill:
            _check_value(source, where, "act", entry["act"])
        if prev_out is not None and entry["num_in_channels"] != prev_out:
            _fail(source, f"{where}: num_in_channels {entry['num_in_channels']} does not match the previous "
                          f"layer's num_out_channels {prev_out}")
        prev_out = entry["num_out_channels"]
        if distill and ltype in ("irb", "fused_irb"):
            mid = entry["num_in_channels"] * entry["expansion"]
            if mid != int(mid):
                _fail(source, f"{where}: 'expansion' {entry['expansion']!r} must make num_in_channels*expansion "
                              f"an integer in the distill family (got {mid})")
            if ltype == "irb":  # groups of the two 1x1 convs (read but unused by the distill fused_irb)
                for ch in (entry["num_in_channels"], int(mid), entry["num_out_channels"]):
                    if ch % entry["groups"]:
                        _fail(source, f"{where}: 'groups' {entry['groups']} does not divide channel count {ch}")
        if ltype == "tail" and i != len(config) - 1:
            _fail(source, f"{where}: the tail must be the last entry (found at {i} of {len(config) - 1})")
    if config[-1]["layer_type"] != "tail" or len(config) < 2:
        _fail(source, f"entry {len(config) - 1}: the last entry must be a 'tail' (the classifier)")
    return config


def read_json(json_path: str) -> Any:
    """Parse a JSON file; unreadable or malformed files fail with one line naming the file."""
    try:
        with open(json_path, "r", encoding="utf-8") as f:
            config = json.load(f)
    except FileNotFoundError:
        _fail(json_path, "file not found")
    except (OSError, UnicodeDecodeError) as e:
        _fail(json_path, f"cannot read: {e}")
    except json.JSONDecodeError as e:
        _fail(json_path, f"invalid JSON: {e}")
    return config


def load_config(json_path: str) -> List[Dict[str, Any]]:
    """Read and validate a GPUNet JSON file."""
    return validate_config(read_json(json_path), source=json_path)
