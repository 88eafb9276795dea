"""``config.pbtxt`` text for the models of a repository (Triton's model-configuration protobuf in text
form): tensors, batching, instances, parameters, the TensorRT accelerator of the ONNX Runtime backend
and the ensemble's steps. Plain strings, so a test can read them back field by field."""
from __future__ import annotations

import json
from typing import Dict, List, Optional, Sequence, Tuple

from ppdlx_deploy.errors import DeployError

DATA_TYPES = {"float32": "TYPE_FP32", "int64": "TYPE_INT64", "int32": "TYPE_INT32", "uint8": "TYPE_UINT8"}
ONNX_PRECISIONS = {"fp32": "FP32", "fp16": "FP16", "int8": "INT8"}


def quote(text: str) -> str:
    """A protobuf text-format string literal (JSON's escapes are a subset it reads)."""
    return json.dumps(str(text), ensure_ascii=False)


class Tensor:
    """One input or output: name, numpy dtype name, dims without the batch dimension."""

    def __init__(self, name: str, dtype: str, dims: Sequence[int], label_filename: Optional[str] = None,
                 ragged: bool = False):
        if dtype not in DATA_TYPES:
            raise DeployError(f"tensor {name}: dtype {dtype} has no Triton type here ({', '.join(DATA_TYPES)})")
        self.name, self.dtype, self.dims = name, dtype, [int(d) for d in dims]
        self.label_filename, self.ragged = label_filename, ragged

    def text(self) -> str:
        fields = [f"name: {quote(self.name)}", f"data_type: {DATA_TYPES[self.dtype]}",
                  f"dims: [ {', '.join(str(d) for d in self.dims)} ]"]
        if self.ragged:
            fields.append("allow_ragged_batch: true")
        if self.label_filename:
            fields.append(f"label_filename: {quote(self.label_filename)}")
        return "  { " + " ".join(fields) + " }"


def _tensors(key: str, tensors: Sequence[Tensor]) -> str:
    return f"{key} [\n" + ",\n".join(t.text() for t in tensors) + "\n]"


def _parameters(parameters: Dict[str, str]) -> List[str]:
    return [f"parameters {{ key: {quote(k)} value: {{ string_value: {quote(v)} }} }}" for k, v in parameters.items()]


def batching(max_batch_size: int, preferred: Sequence[int], queue_delay_us: int) -> str:
    sizes = ", ".join(str(int(b)) for b in preferred if 0 < int(b) <= max_batch_size)
    preferred_text = f" preferred_batch_size: [ {sizes} ]" if sizes else ""
    return f"dynamic_batching {{{preferred_text} max_queue_delay_microseconds: {int(queue_delay_us)} }}"


def model_config(name: str, *, inputs: Sequence[Tensor], outputs: Sequence[Tensor], max_batch_size: int,
                 backend: Optional[str] = None, platform: Optional[str] = None,
                 instances: Optional[Tuple[str, int]] = None, dynamic_batching: Optional[str] = None,
                 parameters: Optional[Dict[str, str]] = None, extra: Sequence[str] = ()) -> str:
    """``instances``: ``(kind, count)``, kind ``KIND_CPU`` or ``KIND_GPU``."""
    lines = [f"name: {quote(name)}"]
    if platform:
        lines.append(f"platform: {quote(platform)}")
    if backend:
        lines.append(f"backend: {quote(backend)}")
    lines += [f"max_batch_size: {int(max_batch_size)}", _tensors("input", inputs), _tensors("output", outputs)]
    if instances:
        lines.append(f"instance_group [ {{ kind: {instances[0]} count: {int(instances[1])} }} ]")
    if dynamic_batching:
        lines.append(dynamic_batching)
    lines += list(extra) + _parameters(parameters or {})
    return "\n".join(lines) + "\n"


def tensorrt_accelerator(precision: str, workspace_bytes: int, cache_dir: str, profile: Dict[str, str],
                         calibration_table: Optional[str] = None) -> str:
    """The ONNX Runtime backend's TensorRT execution provider: precision, workspace, the engine cache and
    the optimisation profile (``min``/``opt``/``max``: ``"image:1x3x224x224"``). INT8 without Q/DQ nodes
    needs a TensorRT calibration table (ppdlx writes none for ONNX): refused without one."""
    if precision not in ONNX_PRECISIONS:
        raise DeployError(f"--precision {precision}: the TensorRT accelerator takes {', '.join(ONNX_PRECISIONS)}")
    parameters = {"precision_mode": ONNX_PRECISIONS[precision], "max_workspace_size_bytes": str(int(workspace_bytes)),
                  "trt_engine_cache_enable": "1", "trt_engine_cache_path": cache_dir,
                  "trt_profile_min_shapes": profile["min"], "trt_profile_opt_shapes": profile["opt"],
                  "trt_profile_max_shapes": profile["max"]}
    if precision == "int8":
        if not calibration_table:
            raise DeployError("--precision int8 on the ONNX route needs --int8-calibration-table FILE (a TensorRT "
                              "calibration cache for this model: ppdlx's ONNX export has no Q/DQ nodes)")
        parameters["int8_calibration_table_name"] = calibration_table
        parameters["int8_use_native_calibration_table"] = "1"
    fields = " ".join(f"parameters {{ key: {quote(k)} value: {quote(v)} }}" for k, v in parameters.items())
    return ("optimization { execution_accelerators { gpu_execution_accelerator: [ { name: \"tensorrt\" "
            + fields + " } ] } }")


def ensemble_config(name: str, *, inputs: Sequence[Tensor], outputs: Sequence[Tensor], max_batch_size: int,
                    steps: Sequence[Tuple[str, Dict[str, str], Dict[str, str]]],
                    parameters: Optional[Dict[str, str]] = None) -> str:
    """``steps``: ``(model, {step input: ensemble tensor}, {step output: ensemble tensor})`` in order."""
    step_texts = []
    for model, input_map, output_map in steps:
        maps = [f"input_map {{ key: {quote(k)} value: {quote(v)} }}" for k, v in input_map.items()]
        maps += [f"output_map {{ key: {quote(k)} value: {quote(v)} }}" for k, v in output_map.items()]
        step_texts.append(f"  {{ model_name: {quote(model)} model_version: -1 " + " ".join(maps) + " }")
    scheduling = "ensemble_scheduling { step [\n" + ",\n".join(step_texts) + "\n] }"
    return model_config(name, platform="ensemble", inputs=inputs, outputs=outputs, max_batch_size=max_batch_size,
                        parameters=parameters, extra=[scheduling])
