"""Post-training int8 quantization of a classification export:
``quantize(model_dir, calib_dir, output_dir, ...)`` calibrates the export's own program with
Paddle's ``paddle.static.quantization.PostTrainingQuantization`` on real images (pre-processed as
the export's ``inference.yml`` says) and writes an export directory deploy loads as is.

What the output holds, and why this route (docs/int8.md has the library lines):

* ``quantize_linear`` / ``dequantize_linear`` ops (``onnx_format=True``) whose ``Scale`` tensors
  carry the calibrated abs-max ranges, int8 weights with per-output-channel scales. These are the
  scales Paddle Inference's oneDNN int8 passes read on CPU and Paddle-TRT reads on GPU (implicit
  int8 via ``delete_quant_dequant_linear_op_pass``, explicit Q/DQ layers via its
  ``quantize_linear`` converter), so one calibration serves both.
* A legacy ``.pdmodel``: ``PostTrainingQuantization`` rewrites legacy programs only, and Paddle
  Inference has oneDNN int8 passes for legacy programs only (its PIR CPU pass list deletes
  quantize ops and computes fp32).
* ``inference.yml``: the source export's, plus ``precision: int8`` and a ``quantization``
  section (algorithm, calibration images, op counts, the runtime calls, the fp32-vs-int8 check).
"""
from __future__ import annotations

import collections
import logging
import os
import time
from typing import Optional

import numpy as np
import paddle
from paddle.base.proto import framework_pb2
from paddle.static.quantization import PostTrainingQuantization

from ppdlx.errors import ConfigError, UnsupportedError
from ppdlx.export import META_FILE, find_model_files, read_meta
from ppdlx.export.files import ModelFiles, file_records, publish_export, staged_export
from ppdlx.export.meta import write_meta
from ppdlx.export.onednn_int8 import ACTIVATION_HEADROOM, ONEDNN_INT8_OPS, default_headroom  # noqa: F401  (re-exported)
from ppdlx.quantization.compare import compare_predictions
from ppdlx.quantization.images import (ExportPreprocess, labelled_images, list_images, number_of_batches,
                                       spread_subset)

log = logging.getLogger("ppdlx")

# PostTrainingQuantization's activation-range algorithms that end in the quantize-op scales
# (min_max takes a separate branch that keeps two thresholds per tensor).
ALGOS = ("abs_max", "avg", "hist", "mse", "KL")
DEFAULT_ALGO = "abs_max"
DEFAULT_NUM_IMAGES = 100
DEFAULT_BATCH_SIZE = 10
# Below this per-image top-1 agreement with the fp32 export the calibration is refused: a wrong
# pre-processing or scale convention lands near chance, a sound calibration near 100 %.
DEFAULT_MIN_AGREEMENT = 0.9
QUANT_OPS = ("quantize_linear", "dequantize_linear")
# What a predictor must call to run the int8 kernels (recorded in inference.yml for deploy).
RUNTIME_CALLS = {
    "paddle-cpu": ["disable_gpu()", "enable_onednn()",
                   "enable_onednn_int8({%s})" % ", ".join(repr(op) for op in ONEDNN_INT8_OPS),
                   "enable_new_ir(False)", "switch_ir_optim(True)"],
    "trt": ["enable_tensorrt_engine(precision_mode=PrecisionType.Int8, use_calib_mode=False)"],
}


class CalibrationCheckError(ConfigError):
    """The int8 model disagrees with the fp32 export on too many images."""


def _source(model_dir: str):
    """The fp32 export to calibrate: its inference.yml and a legacy program, or one line why not."""
    if not os.path.isdir(model_dir):
        raise ConfigError(f"{model_dir}: export directory not found (run tools/export_model.py --format program)")
    if not os.path.isfile(os.path.join(model_dir, META_FILE)):
        raise ConfigError(f"{model_dir}: no {META_FILE}, so not a ppdlx export: the calibration images are "
                          f"pre-processed as inference.yml says (run tools/export_model.py --format program)")
    meta = read_meta(model_dir)
    if not isinstance(meta, dict) or meta.get("ppdlx_inference") != 1:
        raise ConfigError(f"{os.path.join(model_dir, META_FILE)}: not a ppdlx inference.yml (schema version 1)")
    if meta.get("precision") == "int8":
        raise ConfigError(f"{model_dir}: already an int8 export; calibrate the fp32 export it came from "
                          f"({meta.get('quantization', {}).get('source', {}).get('model_dir')})")
    files = find_model_files(model_dir)
    if files.format != "program":
        raise UnsupportedError(
            f"{model_dir}: a PIR export ({files.model_filename}); int8 calibration needs the legacy program "
            f"(tools/export_model.py --format program): PostTrainingQuantization rewrites legacy programs only and "
            f"Paddle Inference's PIR CPU passes drop quantize ops instead of running int8 (docs/int8.md)")
    return meta, files


def _calibrate(files: ModelFiles, preprocess: ExportPreprocess, paths, output_dir: str, algo: str,
               batch_size: int, headroom: float) -> dict:
    """Run PostTrainingQuantization on the legacy program, widen the activation ranges by
    ``headroom`` and save the program in ``output_dir``."""
    with paddle.pir_utils.OldIrGuard():  # static mode + legacy IR, both restored on exit
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope):
            executor = paddle.static.Executor(paddle.CPUPlace())
            ptq = PostTrainingQuantization(
                executor=executor, scope=scope, model_dir=files.model_dir, model_filename=files.model_filename,
                params_filename=files.params_filename, data_loader=lambda: preprocess.batches(paths, batch_size),
                batch_size=batch_size, batch_nums=number_of_batches(len(paths), batch_size), algo=algo,
                weight_quantize_type="channel_wise_abs_max", onnx_format=True,
                # conv+BN folded first: the per-channel weight scales are those of the weights
                # every runtime computes with (oneDNN and TensorRT fold BN into the conv too).
                optimize_model=True)
            program = ptq.quantize()
            scaled = _widen_activation_ranges(program, scope, headroom) if headroom != 1 else 0
            ptq.save_quantized_model(output_dir, model_filename=files.model_filename,
                                     params_filename=files.params_filename)
    return {**read_saved_program(os.path.join(output_dir, files.model_filename)), "widened_ranges": scaled}


def read_saved_program(model_file: str) -> dict:
    """``{"ops": {type: count}, "fetch_names": [...]}`` of a saved legacy program (counted from the
    file: saving prunes the ops the fetches do not need)."""
    program = framework_pb2.ProgramDesc()
    with open(model_file, "rb") as f:
        program.ParseFromString(f.read())
    ops = [op for block in program.blocks for op in block.ops]
    fetches = sorted((next(a.i for a in op.attrs if a.name == "col"), op.inputs[0].arguments[0])
                     for op in ops if op.type == "fetch")
    return {"ops": dict(collections.Counter(op.type for op in ops)), "fetch_names": [name for _, name in fetches]}


def _widen_activation_ranges(program, scope, factor: float) -> int:
    """Multiply every activation quantize/dequantize range by ``factor`` (weights untouched);
    returns how many range tensors changed."""
    block, done = program.global_block(), set()
    for op in block.ops:
        if op.type not in QUANT_OPS or block.var(op.input("X")[0]).persistable:
            continue
        name = op.input("Scale")[0]
        if name not in done:
            tensor = scope.find_var(name).get_tensor()
            tensor.set(np.array(tensor) * np.float32(factor), paddle.CPUPlace())
            done.add(name)
    return len(done)


def _check_agreement(result: dict, min_agreement: float, where: str) -> None:
    if result["top1_agreement"] < min_agreement:
        raise CalibrationCheckError(
            f"int8 calibration: top-1 agrees with the fp32 export on {100 * result['top1_agreement']:.1f} % of "
            f"{result['images']} {where} images (need {100 * min_agreement:.1f} %); check the calibration images "
            f"match the model's data, or try another --algo ({', '.join(ALGOS)})")


def check_output_dir(output_dir: str, prefix: str = "inference") -> None:
    """Refuse a folder that holds an export this function did not write: the int8 export would replace it.
    An earlier int8 export there is replaced, once the new one is complete."""
    output_dir = os.path.abspath(output_dir)
    programs = [prefix + ext for ext in (".json", ".pdmodel") if os.path.isfile(os.path.join(output_dir, prefix + ext))]
    if os.path.isfile(os.path.join(output_dir, META_FILE)):
        try:
            earlier = read_meta(output_dir)
        except (OSError, ValueError):
            earlier = None
        if isinstance(earlier, dict) and earlier.get("quantization"):
            return
        raise ConfigError(f"--output-dir {output_dir}: holds another export ({META_FILE} of a model that is not "
                          f"int8), which the int8 export would replace; write it to a new folder")
    if programs:
        raise ConfigError(f"--output-dir {output_dir}: holds {programs[0]} without its {META_FILE}, which the int8 "
                          f"export would replace; write it to a new folder")


def quantize(model_dir: str, calib_dir: str, output_dir: str, num_images: Optional[int] = DEFAULT_NUM_IMAGES,
             algo: str = DEFAULT_ALGO, batch_size: int = DEFAULT_BATCH_SIZE, eval_dir: Optional[str] = None,
             check: bool = True, min_agreement: float = DEFAULT_MIN_AGREEMENT, threads: int = 1,
             activation_headroom: Optional[float] = None) -> dict:
    """Calibrate the fp32 classification export in ``model_dir`` on up to ``num_images`` images found
    under ``calib_dir`` (evenly spread over the sorted files) and write the int8 export to
    ``output_dir``.

    ``check`` compares fp32 and int8 Paddle Inference (CPU) predictions on ``eval_dir`` (an
    ImageFolder split: adds top-1 of both) or else on the calibration images, and refuses the
    result below ``min_agreement``. ``activation_headroom``: factor on every calibrated activation
    range (None: :func:`default_headroom` of this CPU). Returns the report also written to
    ``inference.yml``.
    """
    started = time.time()
    meta, files = _source(os.path.abspath(model_dir))
    preprocess = ExportPreprocess(meta)
    if algo not in ALGOS:
        raise ConfigError(f"--algo {algo}: choose one of {', '.join(ALGOS)}")
    if batch_size < 1:
        raise ConfigError(f"--batch-size {batch_size}: need at least 1")
    if activation_headroom is None:
        headroom, headroom_reason = default_headroom()
    elif activation_headroom >= 1:
        headroom, headroom_reason = float(activation_headroom), "given"
    else:
        raise ConfigError(f"--activation-headroom {activation_headroom}: need >= 1 (1 = the calibrated ranges)")
    if not 0.0 <= min_agreement <= 1.0:
        raise ConfigError(f"--min-agreement {min_agreement}: a fraction of images, from 0 to 1 (e.g. 0.98)")
    paths = spread_subset(list_images(calib_dir), num_images)
    output_dir = os.path.abspath(output_dir)
    if output_dir == files.model_dir:
        raise ConfigError(f"--output-dir {output_dir}: is the fp32 export itself; write the int8 export elsewhere")
    check_output_dir(output_dir, files.prefix)
    # published only when complete and checked: a failed calibration or check leaves an earlier int8
    # export there as it was
    os.makedirs(output_dir, exist_ok=True)
    with staged_export(output_dir) as staging:
        report = _quantize_into(staging, meta, files, preprocess, paths, calib_dir, algo, batch_size, headroom,
                                headroom_reason, eval_dir, check, min_agreement, threads, started)
        publish_export(staging, output_dir, files.prefix)
    log.info("int8: %s -> %s (%d calibration images, %s)", files.model_dir, output_dir, len(paths), algo)
    return {**report, "model_dir": output_dir, "meta_file": os.path.join(output_dir, META_FILE)}


def _quantize_into(staging, meta, files, preprocess, paths, calib_dir, algo, batch_size, headroom, headroom_reason,
                   eval_dir, check, min_agreement, threads, started) -> dict:
    calibrated = _calibrate(files, preprocess, paths, staging, algo, batch_size, headroom)
    counts = {op: calibrated["ops"].get(op, 0) for op in QUANT_OPS}
    if not counts["quantize_linear"]:
        raise UnsupportedError(f"{files.model_dir}: PostTrainingQuantization inserted no quantize ops (no conv2d/"
                               f"mul/matmul in the program?); nothing to run in int8")
    int8_files = find_model_files(staging, files.prefix)
    calibration_seconds = round(time.time() - started, 2)

    comparison = None
    if check:
        if eval_dir:
            eval_paths, eval_labels = labelled_images(eval_dir, meta.get("labels"))
            comparison = compare_predictions(files, int8_files, preprocess, eval_paths, eval_labels, threads=threads)
            comparison["directory"] = os.path.abspath(eval_dir)
        else:
            comparison = compare_predictions(files, int8_files, preprocess, paths, threads=threads)
            comparison["directory"] = "calibration images"
        _check_agreement(comparison, min_agreement, "evaluation" if eval_dir else "calibration")

    quantization = {
        "method": "post-training, paddle.static.quantization.PostTrainingQuantization (onnx_format: "
                  "quantize_linear/dequantize_linear)",
        "algo": algo,
        "weights": "int8, per output channel (channel_wise_abs_max), conv+BN folded before quantizing",
        "activations": f"int8, per tensor, range by {algo}" + (f" x {headroom:g}" if headroom != 1 else ""),
        "activation_headroom": {"factor": headroom, "reason": headroom_reason,
                                "ranges_widened": calibrated["widened_ranges"]},
        "onednn_int8_ops": list(ONEDNN_INT8_OPS),
        "ops": counts,
        "calibration": {"images": len(paths), "directory": os.path.abspath(calib_dir), "batch_size": batch_size,
                        "seconds": calibration_seconds},
        "source": {"model_dir": files.model_dir, "model_file": files.model_filename},
        "runtime_calls": RUNTIME_CALLS,
    }
    if comparison is not None:
        quantization["check"] = comparison
    out_meta = {k: v for k, v in meta.items() if k not in ("export_check", "files")}
    out_meta["files"] = file_records([int8_files.model_file, int8_files.params_file])
    out_meta["model"] = {k: v for k, v in meta["model"].items() if k != "onnx_file"}
    out_meta["model"].update(model_file=int8_files.model_filename, params_file=int8_files.params_filename)
    if len(calibrated["fetch_names"]) == len(meta["outputs"]):
        out_meta["outputs"] = [dict(o, name=n) for o, n in zip(meta["outputs"], calibrated["fetch_names"])]
    out_meta["precision"] = "int8"
    out_meta["quantization"] = quantization
    write_meta(staging, out_meta)
    return {"source_dir": files.model_dir, "seconds": round(time.time() - started, 2), **quantization}
