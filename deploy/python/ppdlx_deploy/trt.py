"""Paddle-TRT for an export: which of Paddle's two TensorRT integrations takes the program, its
``Config`` calls as data, and the evidence that TensorRT really ran.

* ``paddle-trt-subgraph``: a legacy ``.pdmodel`` program. ``Config.enable_tensorrt_engine``
  rewires the classic pass builder, whose ``tensorrt_subgraph_pass`` replaces convertible
  subgraphs by ``tensorrt_engine`` ops (serialised to ``trt_serialized_*`` in the cache dir with
  ``use_static``); int8 scales come from quantize ops or from a calibration run (``trt_calib_*``).
* ``pir-trt``: a PIR ``.json`` program. Paddle's predictor sends ``.json`` files through the PIR
  pass pipeline, which has no TensorRT step, so ``enable_tensorrt_engine`` would be ignored and
  the model would run on plain CUDA. Paddle 3's ``paddle.tensorrt.convert`` instead rewrites the
  program with ``pd_op.tensorrt_engine`` ops (built on GPU 0, int8 only from quantize ops), and
  a plain GPU predictor runs the converted program.

Every combination that would not engage TensorRT is refused with one line naming the fix.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
from typing import Dict, List, Optional, Sequence

import numpy as np

from .config_calls import plan_call
from .errors import DeployError, UnsupportedError
from .integrity import file_digest, parse_program_desc

SUBGRAPH = "paddle-trt-subgraph"
PIR_TRT = "pir-trt"
SUBGRAPH_PRECISION = {"fp32": "Float32", "fp16": "Half", "int8": "Int8"}  # paddle.inference.PrecisionType
PIR_TRT_PRECISION = {"fp32": "FP32", "fp16": "FP16", "int8": "INT8"}      # paddle.tensorrt.PrecisionMode
LEGACY_EXPORT_FIX = "re-export with tools/export_model.py --format program (a legacy .pdmodel for the subgraph engine)"


def trt_shape_ranges(meta: dict, opt_batch: Optional[int] = None, max_batch: Optional[int] = None) -> dict:
    """min/max/opt dicts for ``set_trt_dynamic_shape_info`` from inference.yml, with the batch
    dimension optionally overridden (opt = the serving batch, max >= opt)."""
    ranges = meta["tensorrt"]["shape_range"]
    out = {"min": {}, "max": {}, "opt": {}}
    for name, r in ranges.items():
        mn, opt, mx = list(r["min"]), list(r["opt"]), list(r["max"])
        if opt_batch:
            opt[0] = int(opt_batch)
        if max_batch:
            mx[0] = int(max_batch)
        mx[0] = max(mx[0], opt[0])
        mn[0] = min(mn[0], opt[0])
        out["min"][name], out["opt"][name], out["max"][name] = mn, opt, mx
    return out


def largest_trt_batch(meta: dict, batch_size: int, trt_max_batch: Optional[int]) -> int:
    """The largest batch the TensorRT shape range admits (``--trt-max-batch``, else inference.yml's,
    and never below the serving batch)."""
    return _ranges_and_largest_batch(meta, batch_size, trt_max_batch)[1]


def _ranges_and_largest_batch(meta: dict, batch_size: int, trt_max_batch: Optional[int]) -> tuple:
    override = trt_max_batch or meta.get("tensorrt", {}).get("max_batch_size")
    ranges = trt_shape_ranges(meta, opt_batch=batch_size, max_batch=override)
    return ranges, max(r[0] for r in ranges["max"].values())


def engine_cache_dir(base: str, route: str, files: dict, settings: dict) -> str:
    """Where a TensorRT route keeps its engines (and the subgraph route its calibration table): one
    folder per model content and TensorRT settings. Neither route names engines after what they
    hold: the subgraph pass after its subgraph's variable names (``GenerateEngineKey`` in
    tensorrt_subgraph_pass.cc), paddle.tensorrt after the graph's structure, not the weights or
    shape ranges, so a shared folder would hand a retrained or re-exported model of the same
    architecture the old engine, weights included, and models sharing one folder would rebuild
    each other's engines on every run."""
    key = dict(settings, model_sha256=file_digest(files["model_file"]),
               params_sha256=file_digest(files["params_file"]))
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return os.path.join(base, f"{route}_{settings['precision']}_{digest}")


def collection_batch_sizes(batch_size: int, other_sizes: Sequence[int] = ()) -> List[int]:
    """The batch sizes ``--trt-shapes collect`` runs, in order: each size once and the serving batch
    once more. TensorRT's optimal shape is the one collected most often (``StatisticShapeRangeInfo``
    on the subgraph route, the PIR shape collection paddle.tensorrt reads), and with one run each a
    tie would hand it the largest (subgraph) or the smallest (PIR) batch instead."""
    return sorted({1, int(batch_size), *(int(b) for b in other_sizes)}) + [int(batch_size)]


def trt_environment(gpu_id: int) -> dict:
    """What a serialised TensorRT engine is valid for besides the model and settings: the GPU
    (name and compute capability: an A100 engine does not load on an A10), the TensorRT library
    Paddle runs and Paddle's version. Paddle reloads any engine file of the same name it finds."""
    import paddle  # loaded by the TensorRT route only (see the package's docstring)
    from paddle import inference  # as above
    try:
        runtime = inference.get_trt_runtime_version()
    except (RuntimeError, OSError) as err:  # a TensorRT build whose libnvinfer cannot be loaded
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise UnsupportedError(f"--backend trt: Paddle cannot load the TensorRT library ({first}); install the "
                               f"TensorRT this Paddle was built with") from None
    env = {"paddle": paddle.__version__, "tensorrt": ".".join(str(v) for v in runtime), "gpu": None}
    if paddle.device.cuda.device_count() > int(gpu_id):
        env["gpu"] = paddle.device.cuda.get_device_name(int(gpu_id))
        env["capability"] = list(paddle.device.cuda.get_device_capability(int(gpu_id)))
    return env


# trt_support_nhwc_pass (paddle/fluid/framework/ir/trt_support_nhwc_pass.cc) switches an NHWC op to
# NCHW only if it knows the op's weights; any other op marked NHWC (data_format or data_layout) whose
# inputs are 4-D stops the pass with "op not supported" when the predictor is built.
NHWC_PASS_SWITCHES = {"conv2d", "pool2d", "batch_norm", "bilinear_interp", "bilinear_interp_v2", "nearest_interp",
                      "nearest_interp_v2", "prelu"}
NHWC_PASS_LEAVES = {"relu", "elementwise_add", "affine_channel", "softmax", "temporal_shift"}


def nhwc_ops_the_pass_cannot_switch(model_file: str) -> List[str]:
    """The op types of a legacy program marked NHWC, with every input 4-D (read from the program's
    variable shapes, as the pass reads them), that trt_support_nhwc_pass neither switches nor leaves
    alone."""
    program = parse_program_desc(model_file)
    found = set()
    for block in program.blocks:
        ranks = {v.name: len(v.type.dense_tensor.tensor.dims) for v in block.vars}
        for op in block.ops:
            layout = {a.name: a.s for a in op.attrs}
            if op.type in NHWC_PASS_SWITCHES | NHWC_PASS_LEAVES or \
                    layout.get("data_format", layout.get("data_layout")) != "NHWC":
                continue
            if all(ranks.get(name) == 4 for var in op.inputs for name in var.arguments):
                found.add(op.type)
    return sorted(found)


def pir_trt_import_error() -> Optional[str]:
    """Why ``paddle.tensorrt`` cannot be used here (None when it imports). It ships only with
    TensorRT-enabled GPU builds and imports the ``tensorrt`` wheel."""
    try:
        import paddle.tensorrt  # noqa: F401  (TensorRT-enabled GPU builds only: the question asked here)
    except (ImportError, OSError) as err:
        return f"{type(err).__name__}: {err}"
    return None


def refuse_pir_without_converter(model_file: str, reason: str) -> UnsupportedError:
    return UnsupportedError(
        f"--backend trt: {os.path.basename(model_file)} is a PIR program, which Paddle Inference's TensorRT "
        f"subgraph engine (enable_tensorrt_engine) skips, and paddle.tensorrt (PIR-TRT) cannot be used here "
        f"({reason}); install paddlepaddle-gpu built with TensorRT plus the tensorrt wheel, or {LEGACY_EXPORT_FIX}")


def trt_plan(meta: dict, files: dict, precision: str, gpu_calls: List[dict], *, batch_size: int, gpu_id: int,
             cache_dir: Optional[str], shape_source: str, shape_file: Optional[str], trt_max_batch: Optional[int],
             workspace_bytes: Optional[int], min_subgraph_size: Optional[int], quantized: bool,
             pir_trt_available: Optional[bool], environment: Optional[dict] = None) -> dict:
    """The TensorRT part of ``build_plan``: ``gpu_calls`` (enable_use_gpu, switch_ir_optim) plus
    the route's calls. ``pir_trt_available`` None = try importing ``paddle.tensorrt`` when needed;
    ``environment`` None = :func:`trt_environment` of ``gpu_id`` (part of the engine cache key)."""
    if shape_source not in ("yml", "collect"):
        raise DeployError(f"--trt-shapes {shape_source}: choose yml or collect")
    trt = meta.get("tensorrt", {})
    ranges, max_batch = _ranges_and_largest_batch(meta, batch_size, trt_max_batch)
    # absolute: a converted PIR program records its engine files' paths as given
    cache_dir = os.path.abspath(cache_dir or os.path.join(os.path.dirname(files["model_file"]), "_trt_cache"))
    workspace = int(workspace_bytes or trt.get("workspace_size_bytes", 1 << 30))
    min_subgraph = int(min_subgraph_size or trt.get("min_subgraph_size", 3))
    shapes = "inference.yml" if shape_source == "yml" else "the --input images"
    plan = {"cache_dir": cache_dir, "collect_calls": None, "shape_file": shape_file, "calibration": False,
            "pir_trt": None, "model_file": files["model_file"], "params_file": files["params_file"],
            "max_batch": int(max_batch)}

    if files["format"] == "program":
        unswitchable = nhwc_ops_the_pass_cannot_switch(files["model_file"]) \
            if meta.get("model", {}).get("data_format") == "NHWC" else []
        if unswitchable:
            raise UnsupportedError(f"--backend trt: {os.path.basename(files['model_file'])} is an NHWC program with "
                                   f"{', '.join(unswitchable)} ops, which Paddle-TRT's trt_support_nhwc_pass cannot "
                                   f"turn to NCHW (it stops building the predictor); re-export with "
                                   f"-o export.data_format=NCHW (the same weights)")
        use_calib = precision == "int8" and not quantized
        cache_dir = engine_cache_dir(cache_dir, "subgraph", files, {
            "environment": environment or trt_environment(gpu_id), "precision": precision,
            "workspace_size": workspace, "max_batch_size": int(max_batch), "min_subgraph_size": min_subgraph,
            "calibration": bool(use_calib), "shape_source": shape_source,
            "shape_ranges": ranges if shape_source == "yml" else None})
        plan["cache_dir"] = cache_dir
        calls = gpu_calls + [plan_call("enable_new_ir", False),  # the legacy passes own the TRT subgraph step
                             plan_call("set_optim_cache_dir", cache_dir)]
        calls.append(plan_call("enable_tensorrt_engine", workspace_size=workspace, max_batch_size=int(max_batch),
                               min_subgraph_size=min_subgraph, precision_mode=SUBGRAPH_PRECISION[precision],
                               use_static=True,  # serialise engines into cache_dir (one folder per model + settings)
                               use_calib_mode=bool(use_calib)))
        if precision == "int8" and quantized:
            # the quantize/dequantize ops become TensorRT Q/DQ layers with the program's scales (TensorRT's
            # explicit quantization; its implicit int8, dynamic ranges per tensor, is deprecated since TensorRT 10)
            calls.append(plan_call("enable_tensorrt_explicit_quantization"))
        if shape_source == "yml":
            calls.append(plan_call("set_trt_dynamic_shape_info", ranges["min"], ranges["max"], ranges["opt"]))
        else:
            plan["shape_file"] = shape_file or os.path.join(cache_dir, "shape_range_info.pbtxt")
            plan["collect_calls"] = gpu_calls + [plan_call("enable_new_ir", False),
                                                 plan_call("collect_shape_range_info", plan["shape_file"])]
            calls.append(plan_call("enable_tuned_tensorrt_dynamic_shape", plan["shape_file"], True))
        notes = [f"engine {SUBGRAPH}: Paddle-TRT {precision} on the legacy program, workspace {workspace} bytes, "
                 f"max batch {max_batch}, min subgraph {min_subgraph}, shapes from {shapes}, engine cache {cache_dir}"]
        if precision == "int8":
            notes.append("int8 scales from the model's quantize ops (QAT/PTQ), explicit Q/DQ layers" if quantized else
                         "int8 calibration (use_calib_mode=True): run sample images once to write the table")
        plan.update(engine=SUBGRAPH, calls=calls, notes=notes, calibration=bool(use_calib))
        return plan

    if meta.get("model", {}).get("data_format") == "NHWC":
        # pd_op.conv2d is marked convertible whatever its data_format, and the converter builds an
        # NCHW convolution from it (python/paddle/tensorrt/converter_utils.py convert_conv2d)
        raise UnsupportedError(f"--backend trt: {os.path.basename(files['model_file'])} is an NHWC graph and "
                               f"paddle.tensorrt converts convolutions as NCHW; re-export with "
                               f"-o export.data_format=NCHW (the same weights)")
    if pir_trt_available is None:
        reason = pir_trt_import_error()
    else:
        reason = None if pir_trt_available else "not importable"
    if reason:
        raise refuse_pir_without_converter(files["model_file"], reason)
    if precision == "int8" and not quantized:
        raise UnsupportedError("--backend trt --precision int8: paddle.tensorrt (the route of PIR .json exports) "
                               "takes int8 scales only from a QAT/PTQ export's quantize ops and cannot calibrate; "
                               f"quantise the model, or {LEGACY_EXPORT_FIX} and calibrate with --calib-dir")
    if int(gpu_id) != 0:
        raise UnsupportedError(f"--backend trt --gpu-id {gpu_id}: paddle.tensorrt converts PIR programs on GPU 0 "
                               f"only; select the card with CUDA_VISIBLE_DEVICES={gpu_id} and --gpu-id 0")
    prefix = os.path.join(engine_cache_dir(cache_dir, "pir_trt", files, {
        "environment": environment or trt_environment(gpu_id), "precision": precision,
        "workspace_size": workspace, "min_subgraph_size": min_subgraph, "shape_source": shape_source,
        "shape_ranges": ranges if shape_source == "yml" else None}), "inference")
    plan["pir_trt"] = {
        "source_model": files["model_file"], "source_params": files["params_file"], "save_prefix": prefix,
        "precision": PIR_TRT_PRECISION[precision], "workspace_size": workspace, "min_subgraph_size": min_subgraph,
        "shape_source": shape_source,
        "inputs": [{"name": n, "min": ranges["min"][n], "opt": ranges["opt"][n], "max": ranges["max"][n]}
                   for n in ranges["min"]]}
    notes = [f"engine {PIR_TRT}: paddle.tensorrt {precision} conversion of the PIR program into {prefix}.json "
             f"(reused while model, settings and GPU match), workspace {workspace} bytes, max batch {max_batch}, "
             f"min subgraph {min_subgraph}, shapes from {shapes}"]
    if precision == "int8":
        notes.append("int8 scales from the model's quantize ops (QAT/PTQ)")
    plan.update(engine=PIR_TRT, calls=list(gpu_calls), notes=notes, model_file=prefix + ".json",
                params_file=prefix + ".pdiparams")
    return plan


# --------------------------------------------------------------------------------------------
# Evidence that TensorRT ran
# --------------------------------------------------------------------------------------------

def trt_calibration_tables(cache_dir: str) -> List[str]:
    return glob.glob(os.path.join(cache_dir, "**", "trt_calib_*"), recursive=True)


def move_calibration_tables(plan: dict, since: float) -> List[str]:
    """Paddle reads a calibration table from the optimisation cache dir (``GetTrtCalibTableData``
    in tensorrt_subgraph_pass.cc) but writes it, when the calibrating predictor is destroyed
    (``SaveTrtCalibToDisk`` in analysis_predictor.cc), into ``_opt_cache`` next to the program
    whatever that dir is. The tables written since ``since`` (a ``time.time()``) are moved into the
    plan's cache dir, where the serving predictor looks; returns their new paths."""
    written = os.path.join(os.path.dirname(os.path.abspath(plan["model_file"])), "_opt_cache")
    moved = []
    for path in sorted(glob.glob(os.path.join(written, "trt_calib_*"))):
        if os.path.getmtime(path) >= since:
            os.makedirs(plan["cache_dir"], exist_ok=True)
            target = os.path.join(plan["cache_dir"], os.path.basename(path))
            os.replace(path, target)
            moved.append(target)
    if moved and not os.listdir(written):
        os.rmdir(written)
    return moved


def drop_engines_of_other_shapes(plan: dict, previous_shapes: Optional[bytes]) -> List[str]:
    """After ``--trt-shapes collect`` wrote the shape file: engines serialised from a different
    earlier collection would be loaded under the same name, so they are deleted (and rebuilt)."""
    with open(plan["shape_file"], "rb") as f:
        if previous_shapes is None or f.read() == previous_shapes:
            return []
    stale = trt_engine_files(plan["cache_dir"])
    for path in stale:
        os.remove(path)
    return stale


def trt_engine_files(cache_dir: str) -> List[str]:
    """Engines the subgraph pass serialised (``use_static``): ``<cache>/trt_serialized_<key>``."""
    return glob.glob(os.path.join(cache_dir, "**", "trt_serialized_*"), recursive=True)


def subgraph_engine_count(plan: dict) -> Optional[int]:
    """After the first run of a subgraph-route predictor: how many TensorRT engines exist (None
    while it is calibrating); zero means every op ran on plain CUDA, which is refused."""
    cache_dir = plan["cache_dir"]
    if plan["calibration"] and not trt_calibration_tables(cache_dir):
        return None
    count = len(trt_engine_files(cache_dir))
    if count == 0:
        raise UnsupportedError(f"--backend trt: Paddle-TRT built no engine (no trt_serialized_* in {cache_dir} "
                               f"after the first run), so the model would run on plain CUDA; use --backend paddle-gpu "
                               f"for that")
    return count


def tensorrt_engine_count(program) -> int:
    """``pd_op.tensorrt_engine`` ops in a PIR program."""
    return sum(op.name() == "pd_op.tensorrt_engine" for op in program.global_block().ops)


# --------------------------------------------------------------------------------------------
# PIR-TRT conversion (GPU builds with paddle.tensorrt only)
# --------------------------------------------------------------------------------------------

def pir_trt_key(spec: dict, sample_shapes: Optional[Sequence[Dict[str, list]]], environment: dict) -> dict:
    """What the converted program depends on: the source files, the conversion settings, the
    sample shapes (``--trt-shapes collect``), the GPU / TensorRT / Paddle versions, and where it is
    (``save_prefix``: the program records its engine files' absolute paths, so a copied or moved
    export's conversion would load the engines of the folder it was copied from, or none)."""
    key = {k: v for k, v in spec.items() if k not in ("source_model", "source_params")}
    key.update(model_sha256=file_digest(spec["source_model"]), params_sha256=file_digest(spec["source_params"]),
               sample_shapes=list(sample_shapes) if sample_shapes else None, **environment)
    return key


def _has_files(folder: str) -> bool:
    """The converted program's serialised engines live in the folder named like its prefix."""
    return os.path.isdir(folder) and any(os.scandir(folder))


def convert_pir_trt(spec: dict, sample_feeds=None) -> int:
    """Write ``spec["save_prefix"].json`` with ``pd_op.tensorrt_engine`` ops (or reuse a matching
    earlier conversion); returns the number of TensorRT engines in it."""
    from paddle.tensorrt.export import Input, PrecisionMode, TensorRTConfig, convert  # GPU builds only

    names = [i["name"] for i in spec["inputs"]]
    collect = spec["shape_source"] == "collect"
    if collect and not sample_feeds:
        raise DeployError("--trt-shapes collect needs sample inputs (--input images)")
    sample_shapes = [{n: list(f[n].shape) for n in names} for f in sample_feeds] if collect else None
    key = pir_trt_key(spec, sample_shapes, trt_environment(0))
    prefix = spec["save_prefix"]
    key_file = prefix + ".ppdlx_key.json"
    if os.path.isfile(prefix + ".json") and os.path.isfile(key_file) and _has_files(prefix):
        with open(key_file, encoding="utf-8") as f:
            stored = json.load(f)
        if stored.get("key") == key and stored.get("tensorrt_engines", 0) > 0:
            return int(stored["tensorrt_engines"])
    if collect:
        inputs = [Input(warmup_data=tuple(np.ascontiguousarray(f[n]) for f in sample_feeds), input_data_type=None,
                        name=n) for n in names]
    else:
        inputs = [Input(min_input_shape=tuple(i["min"]), optim_input_shape=tuple(i["opt"]),
                        max_input_shape=tuple(i["max"]), name=i["name"]) for i in spec["inputs"]]
    config = TensorRTConfig(inputs=inputs, min_subgraph_size=spec["min_subgraph_size"])
    config.precision_mode = PrecisionMode[spec["precision"]]
    config.workspace_size = spec["workspace_size"]
    config.save_model_dir = prefix  # a path prefix: PREFIX.json / PREFIX.pdiparams, engines under PREFIX/
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    # A path prefix, as in paddle.tensorrt's own examples: given "x.json" it would hand that name to
    # load_inference_model, which appends ".json" again.
    engines = tensorrt_engine_count(convert(os.path.splitext(spec["source_model"])[0], config))
    if engines == 0:
        raise UnsupportedError(f"--backend trt: paddle.tensorrt converted no op of {spec['source_model']} to "
                               f"TensorRT, so the model would run on plain CUDA; use --backend paddle-gpu for that")
    with open(key_file, "w", encoding="utf-8") as f:
        json.dump({"key": key, "tensorrt_engines": engines}, f, indent=1)
    return engines
