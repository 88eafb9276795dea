"""The export directory: ``inference.yml`` (written by ppdlx's export, schema version 1) and the
program/weights files, with the facts read from the program itself (its op types)."""
from __future__ import annotations

import os
import re
from typing import Optional

import yaml

from .errors import DeployError

META_FILE = "inference.yml"


def load_meta(model_dir: str) -> dict:
    path = os.path.join(model_dir, META_FILE)
    if not os.path.isfile(path):
        raise DeployError(f"{model_dir}: no {META_FILE} (export with tools/export_model.py)")
    with open(path, encoding="utf-8") as f:
        meta = yaml.safe_load(f)
    if not isinstance(meta, dict) or meta.get("ppdlx_inference") != 1:
        raise DeployError(f"{path}: not a ppdlx inference.yml (schema version 1)")
    return meta


def graph_roles(meta: dict, backend: str) -> list:
    """The output roles of the graph ``backend`` runs: the Paddle program's (``outputs``), or for
    onnxruntime those of the ONNX graph when ``inference.yml`` describes it apart (``onnx.outputs``:
    a detection ONNX graph ends before NMS)."""
    if backend == "onnxruntime" and (meta.get("onnx") or {}).get("outputs"):
        return [o["role"] for o in meta["onnx"]["outputs"]]
    return [o["role"] for o in meta["outputs"]]


def model_files(model_dir: str, meta: Optional[dict] = None) -> dict:
    """``{"format": "pir"|"program", "model_file", "params_file"}`` decided by the files present."""
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
        raise DeployError(f"{model_dir}: {prefix}.pdiparams is missing")
    return {"format": found[0][0], "model_file": found[0][1], "params_file": params}


def program_op_types(model_file: str) -> set:
    """The op types of a program file: a PIR .json names each op ``"#":"<dialect>.<op>"``; a
    legacy .pdmodel is a ProgramDesc protobuf. (Its op_version_map lists every registered op,
    quantize ops included, so a byte search there would call every legacy program quantised.)"""
    if model_file.endswith(".json"):
        with open(model_file, encoding="utf-8") as f:
            return set(re.findall(r'"#":"\d+\.(\w+)"', f.read()))
    from paddle.base.proto import framework_pb2
    program = framework_pb2.ProgramDesc()
    with open(model_file, "rb") as f:
        program.ParseFromString(f.read())
    return {op.type for block in program.blocks for op in block.ops}


def is_quantized(model_file: str) -> bool:
    """A QAT/PTQ export carries (fake) (de)quantize ops."""
    return any("quantize" in op for op in program_op_types(model_file))
