"""The export directory: ``inference.yml`` (written by ppdlx's export, schema version 1) and the
program/weights files, with the facts read from the program itself (its op types)."""
from __future__ import annotations

import os
import re
from typing import Optional

import yaml

from .errors import DeployError
from .integrity import REEXPORT, check_export_files, parse_program_desc

META_FILE = "inference.yml"
# The sections every reader here relies on, and their types.
REQUIRED_SECTIONS = {"model": dict, "inputs": list, "outputs": list, "preprocess": dict, "postprocess": dict}


def load_meta(model_dir: str) -> dict:
    path = os.path.join(model_dir, META_FILE)
    if not os.path.isfile(path):
        raise DeployError(f"{model_dir}: no {META_FILE} (export with tools/export_model.py)")
    try:
        with open(path, encoding="utf-8") as f:
            meta = yaml.safe_load(f)
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or type(err).__name__
        raise DeployError(f"{path}: not valid YAML{where} ({problem}): damaged or edited by hand; {REEXPORT}") from None
    if not isinstance(meta, dict) or meta.get("ppdlx_inference") != 1:
        raise DeployError(f"{path}: not a ppdlx inference.yml (no 'ppdlx_inference: 1' mapping); {REEXPORT}")
    for key, kind in REQUIRED_SECTIONS.items():
        if not isinstance(meta.get(key), kind):
            state = "missing" if key not in meta else f"a {type(meta[key]).__name__}, not a {kind.__name__}"
            raise DeployError(f"{path}: section '{key}' is {state}; {REEXPORT}")
    if not meta["model"].get("family"):
        raise DeployError(f"{path}: model.family is missing; {REEXPORT}")
    return meta


def graph_roles(meta: dict, graph: str) -> list:
    """The output roles of the graph a predictor runs (its ``plan["graph"]``): the Paddle program's
    (``outputs``), or for ``"onnx"`` those of the ONNX graph when ``inference.yml`` describes it apart
    (``onnx.outputs``: a detection ONNX graph ends before NMS)."""
    if graph == "onnx" and (meta.get("onnx") or {}).get("outputs"):
        return [o["role"] for o in meta["onnx"]["outputs"]]
    return [o["role"] for o in meta["outputs"]]


def model_files(model_dir: str, meta: Optional[dict] = None) -> dict:
    """``{"format": "pir"|"program", "model_file", "params_file"}`` decided by the files present, checked
    against what the export wrote (:func:`ppdlx_deploy.integrity.check_export_files`) before a runtime
    reads them."""
    prefix = "inference"
    if meta:
        prefix = os.path.splitext(meta["model"]["params_file"])[0]
    found = [(fmt, os.path.join(model_dir, prefix + ext)) for fmt, ext in (("pir", ".json"), ("program", ".pdmodel"))
             if os.path.isfile(os.path.join(model_dir, prefix + ext))]
    if not found:
        raise DeployError(f"{model_dir}: neither {prefix}.json nor {prefix}.pdmodel exists")
    if len(found) > 1:
        raise DeployError(f"{model_dir}: both {prefix}.json and {prefix}.pdmodel exist; remove the stale one")
    params = os.path.join(model_dir, prefix + ".pdiparams")
    if not os.path.isfile(params):
        raise DeployError(f"{model_dir}: {prefix}.pdiparams is missing next to {os.path.basename(found[0][1])}; "
                          f"{REEXPORT}")
    files = {"format": found[0][0], "model_file": found[0][1], "params_file": params}
    check_export_files(files, meta)
    return files


def program_op_types(model_file: str) -> set:
    """The op types of a program file: a PIR .json names each op ``"#":"<dialect>.<op>"``; a
    legacy .pdmodel is a ProgramDesc protobuf. (Its op_version_map lists every registered op,
    quantize ops included, so a byte search there would call every legacy program quantised.)"""
    if model_file.endswith(".json"):
        try:
            with open(model_file, encoding="utf-8") as f:
                return set(re.findall(r'"#":"\d+\.(\w+)"', f.read()))
        except UnicodeDecodeError:
            raise DeployError(f"{model_file}: not a PIR program (not UTF-8 text); {REEXPORT}") from None
    program = parse_program_desc(model_file)
    return {op.type for block in program.blocks for op in block.ops}


def is_quantized(model_file: str) -> bool:
    """A QAT/PTQ export carries (fake) (de)quantize ops."""
    return any("quantize" in op for op in program_op_types(model_file))


def onnx_precision(meta: dict) -> str:
    """``int8`` for an export whose ONNX file is a QDQ graph (``quantization.onnx`` in inference.yml: a
    quantization-aware-trained model), else ``fp32``: onnxruntime runs the file as it is."""
    return "int8" if (meta.get("quantization") or {}).get("onnx") else "fp32"
