"""Export a configured model: ``export_model(cfg, ...)`` builds it, loads ``model.weights``,
saves the inference program, checks it against the dynamic model with Paddle Inference (and
onnxruntime with ``onnx=True``), and writes ``inference.yml``."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from typing import List, Optional, Sequence

import paddle

from ppdlx.checkpoint import load_weights
from ppdlx.dist import seed_everything
from ppdlx.engine.step import check_finite_weights
from ppdlx.errors import ConfigError, UnsupportedError, paddle_error_line
from ppdlx.export.families import default_format, export_graph, export_onnx_target
from ppdlx.export.files import ensure_output_dir, file_records, publish_export, staged_export
from ppdlx.export.int8 import SIMULATED_INT8, int8_program_facts, is_quantized_program, qat_section
from ppdlx.export.meta import META_FILE, TRT_MIN_SUBGRAPH_SIZE, build_meta, trt_suggestion, write_meta
from ppdlx.export.onednn_int8 import ONEDNN_INT8_OPS, default_headroom
from ppdlx.export.paddle_export import PaddleInferenceRunner, random_feeds, run_dynamic
from ppdlx.models.qat import is_quantized
from ppdlx.registry import TASKS
from ppdlx.tasks import task_of
from ppdlx.tasks.preprocess import resolve_preprocessing

log = logging.getLogger("ppdlx")

ONNX_FILE = "inference.onnx"


def read_labels(path: str, num_classes: int) -> List[str]:
    if not os.path.isfile(path):
        raise ConfigError(f"--labels {path}: file not found (one class name per line)")
    with open(path, encoding="utf-8") as f:
        names = [line.strip() for line in f if line.strip()]
    if len(names) != num_classes:
        raise ConfigError(f"--labels {path}: {len(names)} names but model.num_classes={num_classes}")
    return names


def labels_from_data(cfg, family: str = "classification") -> Optional[List[str]]:
    """The class names of the training data when they match ``model.num_classes``, as the task plug-in of
    ``family`` reads them (``Task.class_names_from_data``: class folders, or COCO category names)."""
    return TASKS.get(family).class_names_from_data(cfg)


def labels_from_checkpoint(weights: Optional[str], num_classes: int) -> Optional[List[str]]:
    """``classes.json`` next to the checkpoint (training writes it): ``{"names": [...]}`` or a list."""
    if not weights:
        return None
    path = os.path.join(os.path.dirname(os.path.abspath(weights)), "classes.json")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    names = data.get("names") if isinstance(data, dict) else data
    return [str(n) for n in names] if isinstance(names, list) and len(names) == num_classes else None


def find_labels(cfg, family: str, weights: Optional[str], num_classes: int) -> Optional[List[str]]:
    """The class names an export carries when ``--labels`` is not given: from the data, else from the
    checkpoint's folder; None (with a warning) when neither has them."""
    labels = labels_from_data(cfg, family) or labels_from_checkpoint(weights, num_classes)
    if labels is None:
        log.warning("export: no class names found (data.root has no %s, no classes.json next to model.weights): "
                    "inference.yml labels is null and predictions show class indices; pass --labels FILE",
                    TASKS.get(family).class_source)
    return labels


def export_layout_cfg(cfg):
    """``cfg`` with ``model.data_format`` set to the layout the export is written in
    (``export.data_format``): a model trained in NHWC is exported as NCHW unless told otherwise."""
    layout = cfg.export.data_format
    return cfg if cfg.model.data_format == layout else cfg.replace({"model.data_format": layout})


def relayout_model(cfg, model):
    """The same weights in a model built in ``cfg.model.data_format`` (parameters and BatchNorm
    statistics have one shape in both layouts; only the activations' axes differ)."""
    task = task_of(cfg)
    rebuilt = task.build_model(cfg, int(getattr(model, "num_classes", cfg.model.num_classes)))
    task.prepare_model(cfg, rebuilt)
    missing, unexpected = rebuilt.set_state_dict(model.state_dict())
    if missing or unexpected:
        raise ConfigError(f"export.data_format={cfg.model.data_format}: the model built in that layout does not "
                          f"take the trained weights (missing {list(missing)[:3]}, unexpected "
                          f"{list(unexpected)[:3]}); export with export.data_format={model.data_format}")
    rebuilt.eval()
    return rebuilt


def model_in_layout(cfg, weights: Optional[str], model=None):
    """The trained model in ``cfg.model.data_format``: ``model`` itself, the same weights rebuilt
    in that layout when ``model`` has the other one, or built from ``weights`` when it is None."""
    if model is None:
        return build_trained_model(cfg, weights)
    if getattr(model, "data_format", cfg.model.data_format) != cfg.model.data_format:
        return relayout_model(cfg, model)
    return model


def require_weights(cfg, random_weights: bool, what: str) -> None:
    """The export tools deploy ``model.weights``; without it they would deploy random initial values
    that predict nothing, so they ask for it unless random weights are asked for (speed tests)."""
    if not cfg.model.weights and not random_weights:
        raise ConfigError(f"model.weights is not set: pass -o model.weights=<checkpoint prefix> (trained, or "
                          f"converted by tools/convert_weights.py), or --random-weights to {what} randomly "
                          f"initialised weights (speed tests)")


def build_trained_model(cfg, weights: Optional[str]):
    """The configured model with ``weights`` loaded, in eval mode: what export saves and what
    ``--verify`` compares the export with. Built by the config's task plug-in, as training and
    ``tools/eval.py`` build it (a detector takes its input size from ``data.coco.image_size``)."""
    seed_everything(cfg.global_cfg.seed)  # random-init exports (benchmarks) are reproducible
    task = task_of(cfg)
    model = task.build_model(cfg, cfg.model.num_classes)
    task.prepare_model(cfg, model)
    if weights:
        missing = load_weights(model, weights, copy=cfg.model.weights_copy)
        if missing:
            log.warning("export: %d model parameters not in %s (e.g. %s)", len(missing), weights, missing[0])
        apply_evaluation_statistics(cfg, model)
        check_finite_weights(model, weights)
    else:
        log.warning("export: model.weights is not set: exporting randomly initialised weights")
    model.eval()
    return model


def apply_evaluation_statistics(cfg, model) -> int:
    """The BatchNorm statistics ppdlx's evaluator uses, in the model (``Task.evaluation_statistics``: the
    detection evaluator re-estimates them from training images with ``detection.precise_bn_batches``), so that
    the export predicts what ``tools/eval.py`` reports. Returns the batches used (0: nothing to do)."""
    return task_of(cfg).evaluation_statistics(cfg, model, "export")


def int8_headroom(setting) -> tuple:
    """``(factor, reason)`` of a QAT int8 program's activation ranges: ``export.int8_activation_headroom``, or
    this CPU's need (:func:`ppdlx.export.onednn_int8.default_headroom`)."""
    return (float(setting), "export.int8_activation_headroom") if setting else default_headroom()


def qat_meta(model, files, target, headroom) -> dict:
    """``inference.yml``'s ``precision`` (an int8 Paddle program) and ``quantization`` of a
    quantization-aware-trained model's export."""
    int8_program = is_quantized_program(files)
    onnx = (target.meta_section or {}).get("qdq") if target is not None else None
    factor = headroom[0] if int8_program else 1.0
    section = qat_section(model, int8_program_facts(files) if int8_program else None, onnx, ONEDNN_INT8_OPS,
                          {"factor": factor, "reason": headroom[1] if int8_program else "no int8 program"})
    if not int8_program:
        section["program_numerics"] = SIMULATED_INT8
        section["program"] = ("float: the QAT model computed in float, its quantization simulated (weights on their "
                              "int8 grid, activations clipped and rounded to their int8 steps); the detector's "
                              "post-processing traces into PIR only, whose CPU passes drop quantize ops "
                              "(docs/int8.md); its int8 graph is inference.onnx")
    return {"precision": "int8", "quantization": section} if int8_program else {"quantization": section}


def _program_outputs(runner: PaddleInferenceRunner, inputs: Sequence[dict], roles: Sequence[str]) -> List[dict]:
    """The saved program's outputs with their roles, after checking its inputs and output count."""
    if runner.input_names != [i["name"] for i in inputs]:
        raise ConfigError(f"exported program inputs {runner.input_names} differ from the expected "
                          f"{[i['name'] for i in inputs]}")
    if len(runner.output_names) != len(roles):
        raise ConfigError(f"exported program has {len(runner.output_names)} outputs, expected {len(roles)} "
                          f"({list(roles)})")
    return [{"name": n, "role": r} for n, r in zip(runner.output_names, roles)]


def _checked_run(runner: PaddleInferenceRunner, feeds: dict, files, data_format: str) -> list:
    """The export check's Paddle Inference run; a predictor that fails is one line, not a C++ stack."""
    try:
        return runner.run(feeds)
    except (ValueError, RuntimeError, MemoryError) as err:
        hint = ("; Paddle Inference's oneDNN passes break NHWC programs (a convolution with a bias, as in "
                "squeeze-excite, for one): leave export.data_format at NCHW" if data_format == "NHWC" else "")
        raise UnsupportedError(f"export check: Paddle Inference (CPU, oneDNN) cannot run the exported "
                               f"{os.path.basename(files.model_file)}: {paddle_error_line(err)}{hint}") from None


@contextlib.contextmanager
def on_cpu():
    """The export builds, traces and checks its model on CPU whatever device Paddle defaults to: the
    files hold no place, and the check compares with a CPU predictor, against which a GPU reference
    (TF32 convolutions and matmuls by default on Ampere) would differ by more than its tolerance."""
    previous = paddle.get_device()
    paddle.set_device("cpu")
    try:
        yield
    finally:
        paddle.set_device(previous)


def export_model(cfg, output_dir: Optional[str] = None, weights: Optional[str] = None, onnx: Optional[bool] = None,
                 labels: Optional[Sequence[str]] = None, fmt: Optional[str] = None, model=None, check: bool = True,
                 check_batch_sizes: Sequence[int] = (1, 2), atol: float = 1e-4, rtol: float = 1e-4,
                 trt_opt_batch: Optional[int] = None, trt_max_batch: Optional[int] = None,
                 threads: int = 1, export_spec: Optional[dict] = None) -> dict:
    """Export ``cfg.model`` to ``output_dir`` (default ``cfg.export.output_dir`` or
    ``<global.output_dir>/inference``). ``model`` overrides building from the config (tests).
    ``export_spec`` (see :mod:`ppdlx.export.families`) says what the model is and how it is fed and
    read; without one the config's task plug-in supplies it. ``fmt`` (``pir`` | ``program``) defaults to
    ``pir``, and to ``program`` for a quantization-aware-trained classifier (its int8 program).
    ``check=False`` skips every check on random inputs, the ONNX file's as well as the program's.

    Returns a report: files, I/O, max abs diffs (Paddle Inference and ONNX vs dynamic).
    """
    started = time.time()
    cfg = resolve_preprocessing(cfg)  # inference.yml pre-processes as training and eval did
    output_dir = output_dir or cfg.export.output_dir or os.path.join(cfg.global_cfg.output_dir, "inference")
    ensure_output_dir(output_dir)
    onnx = cfg.export.onnx if onnx is None else onnx
    weights = weights if weights is not None else cfg.model.weights
    cfg = export_layout_cfg(cfg)
    data_format = cfg.model.data_format
    if onnx and data_format == "NHWC":
        raise UnsupportedError("--onnx: paddle2onnx cannot convert NHWC convolutions; leave export.data_format at "
                               "NCHW (the same weights) for ONNX")
    # written and checked in a staging folder, then published whole: a failed re-export leaves the
    # previous export working, not its inference.yml over a new, unchecked program
    with staged_export(output_dir) as staging, on_cpu():
        given_model = model
        model = model_in_layout(cfg, weights, model)
        model.eval()
        num_classes = int(getattr(model, "num_classes", cfg.model.num_classes))
        if export_spec is None:
            export_spec = task_of(cfg).export_spec(cfg, model)
        spec = export_spec
        if fmt is None:
            fmt = default_format(model, spec)
        headroom = int8_headroom(cfg.export.int8_activation_headroom) if is_quantized(model) else None
        graph = export_graph(model, spec, staging, data_format, fmt, headroom[0] if headroom else 1.0)
        files, inputs = graph.files, graph.inputs
        # a quantized network's program is checked as written (IR optimisation off: the kernels the dynamic model
        # ran), where another kernel's float error would flip rounding steps; --verify runs it as deployed
        runner = PaddleInferenceRunner(files, threads=threads, ir_optim=not is_quantized(model))
        outputs = _program_outputs(runner, inputs, graph.output_roles)
        opt_batch = trt_opt_batch or spec["trt_batches"]["opt_batch"]
        max_batch = max(trt_max_batch or spec["trt_batches"]["max_batch"], opt_batch)
        tensorrt = trt_suggestion(inputs, 1, opt_batch, max_batch,
                                    min_subgraph_size=spec.get("trt_min_subgraph_size", TRT_MIN_SUBGRAPH_SIZE))

        report = {"model_dir": os.path.abspath(output_dir), "family": spec["family"], "name": cfg.model.name,
                  "format": files.format, "model_file": files.model_file, "params_file": files.params_file,
                  "inputs": inputs, "outputs": outputs, "checks": {}}
        if labels is None:
            labels = find_labels(cfg, spec["family"], weights, num_classes)
        target = None
        if onnx:
            target = export_onnx_target(graph, spec, os.path.join(staging, ONNX_FILE), data_format,
                                        cfg.export.opset, threads)
            report["onnx_file"] = target.file
        if check:
            for bs in check_batch_sizes:
                feeds = random_feeds(inputs, bs)
                reference = graph.reference(inputs, feeds)
                diff = graph.compare(f"Paddle Inference ({files.format}) vs dynamic, batch {bs}", reference,
                                     _checked_run(runner, feeds, files, data_format), atol, rtol)
                report["checks"][f"paddle_inference_bs{bs}_max_abs_diff"] = diff
                if target is not None:
                    # the program's reference serves when ONNX computes as it does (a quantized model's QDQ graph
                    # has its own arithmetic and keeps the ranges an int8 program widens)
                    same = target.layer is graph.layer and target.reference_context is contextlib.nullcontext
                    with target.reference_context():
                        onnx_reference = reference if same else run_dynamic(target.layer, target.inputs, feeds)
                    diff = target.compare(f"onnxruntime vs dynamic, batch {bs}", onnx_reference,
                                          target.runner.run(feeds), atol, rtol)
                    report["checks"][f"onnxruntime_bs{bs}_max_abs_diff"] = diff
        extra = {"export_check": report["checks"]} if report["checks"] else {}
        extra["files"] = file_records([files.model_file, files.params_file])
        onnx_section = {k: v for k, v in (target.meta_section or {}).items() if k != "qdq"} if target else {}
        if onnx_section:
            extra["onnx"] = onnx_section
        if is_quantized(model):
            extra.update(qat_meta(model, files, target, headroom))
        meta = build_meta(family=spec["family"], name=cfg.model.name, num_classes=num_classes,
                            data_format=data_format, files=files, inputs=inputs, outputs=outputs,
                            preprocess=spec["preprocess"], postprocess=graph.postprocess, labels=labels,
                            tensorrt=tensorrt,
                            onnx_file=os.path.basename(target.file) if target else None, extra=extra or None,
                            random_weights=given_model is None and not weights)
        write_meta(staging, meta)
        publish_export(staging, output_dir)
    for key in ("model_file", "params_file", "onnx_file"):
        if report.get(key):
            report[key] = os.path.join(os.path.abspath(output_dir), os.path.basename(report[key]))
    report["meta_file"] = os.path.join(os.path.abspath(output_dir), META_FILE)
    report["seconds"] = round(time.time() - started, 2)
    return report


__all__ = ["build_trained_model", "export_layout_cfg", "export_model", "find_labels", "labels_from_checkpoint",
           "labels_from_data", "model_in_layout", "read_labels"]
