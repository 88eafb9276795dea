"""Export a configured model: ``export_model(cfg, ...)`` builds it, loads ``model.weights``,
saves the inference program, checks it against the dynamic model with Paddle Inference (and
onnxruntime with ``onnx=True``), and writes ``inference.yml``."""
from __future__ import annotations

import logging
import os
import time
from typing import List, Optional, Sequence

import ppdlx.export.meta as M
from ppdlx.errors import ConfigError, UnsupportedError
from ppdlx.export.families import export_graph, legacy_export_spec
from ppdlx.export.onnx_export import OnnxRunner, check_close, export_onnx
from ppdlx.export.paddle_export import PaddleInferenceRunner, random_feeds, run_dynamic

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


def labels_from_data(cfg) -> Optional[List[str]]:
    """Class names from ``data.root/<train_split>`` sub-directories when they match num_classes."""
    split_dir = os.path.join(cfg.data.root, cfg.data.train_split)
    if not os.path.isdir(split_dir):
        return None
    names = sorted(d.name for d in os.scandir(split_dir) if d.is_dir())
    return names if len(names) == cfg.model.num_classes else None


def _program_outputs(runner: PaddleInferenceRunner, inputs: Sequence[dict], roles: Sequence[str]) -> List[dict]:
    """The saved program's outputs with their roles, after checking its inputs and output count."""
    if runner.input_names != [i["name"] for i in inputs]:
        raise ConfigError(f"exported program inputs {runner.input_names} differ from the expected "
                          f"{[i['name'] for i in inputs]}")
    if len(runner.output_names) != len(roles):
        raise ConfigError(f"exported program has {len(runner.output_names)} outputs, expected {len(roles)} "
                          f"({list(roles)})")
    return [{"name": n, "role": r} for n, r in zip(runner.output_names, roles)]


def export_model(cfg, output_dir: Optional[str] = None, weights: Optional[str] = None, onnx: Optional[bool] = None,
                 labels: Optional[Sequence[str]] = None, fmt: str = "pir", model=None, check: bool = True,
                 check_batch_sizes: Sequence[int] = (1, 2), atol: float = 1e-4, rtol: float = 1e-4,
                 trt_opt_batch: Optional[int] = None, trt_max_batch: Optional[int] = None,
                 threads: int = 1, export_spec: Optional[dict] = None) -> dict:
    """Export ``cfg.model`` to ``output_dir`` (default ``cfg.export.output_dir`` or
    ``<global.output_dir>/inference``). ``model`` overrides building from the config (tests).
    ``export_spec`` (see :mod:`ppdlx.export.families`) says what the model is and how it is fed and
    read; without one it is derived from the model (``legacy_export_spec``).

    Returns a report: files, I/O, max abs diffs (Paddle Inference and ONNX vs dynamic).
    """
    from ppdlx.engine.builders import build_model, seed_everything
    from ppdlx.engine.checkpoint import load_weights

    started = time.time()
    output_dir = output_dir or cfg.export.output_dir or os.path.join(cfg.global_cfg.output_dir, "inference")
    onnx = cfg.export.onnx if onnx is None else onnx
    weights = weights if weights is not None else cfg.model.weights
    if model is None:
        seed_everything(cfg.global_cfg.seed)  # random-init exports (benchmarks) are reproducible
        model = build_model(cfg)
        if weights:
            missing = load_weights(model, weights)
            if missing:
                log.warning("export: %d model parameters not in %s (e.g. %s)", len(missing), weights, missing[0])
        else:
            log.warning("export: model.weights is not set: exporting randomly initialised weights")
    model.eval()
    data_format = getattr(model, "data_format", cfg.model.data_format)
    if onnx and data_format == "NHWC":
        raise UnsupportedError("--onnx: paddle2onnx cannot convert NHWC convolutions; export the same weights "
                               "with model.data_format=NCHW for ONNX (Paddle Inference/TRT take the NHWC export)")
    num_classes = int(getattr(model, "num_classes", cfg.model.num_classes))
    spec = export_spec if export_spec is not None else legacy_export_spec(cfg, model)
    graph = export_graph(model, spec, output_dir, data_format, fmt)
    files, inputs = graph.files, graph.inputs
    runner = PaddleInferenceRunner(files, threads=threads)
    outputs = _program_outputs(runner, inputs, graph.output_roles)
    opt_batch = trt_opt_batch or spec["trt_batches"]["opt_batch"]
    max_batch = max(trt_max_batch or spec["trt_batches"]["max_batch"], opt_batch)
    tensorrt = M.trt_suggestion(inputs, 1, opt_batch, max_batch)

    report = {"model_dir": os.path.abspath(output_dir), "family": spec["family"], "name": cfg.model.name,
              "format": files.format, "model_file": files.model_file, "params_file": files.params_file,
              "inputs": inputs, "outputs": outputs, "checks": {}}
    onnx_runner = None
    onnx_file = None
    if onnx:
        onnx_file = export_onnx(files, os.path.join(output_dir, ONNX_FILE), opset=cfg.export.opset)
        onnx_runner = OnnxRunner(onnx_file, threads=threads)
        report["onnx_file"] = onnx_file
    if check or onnx:
        for bs in check_batch_sizes:
            feeds = random_feeds(inputs, bs)
            reference = run_dynamic(graph.layer, inputs, feeds)
            if check:
                diff = check_close(f"Paddle Inference ({files.format}) vs dynamic, batch {bs}", reference,
                                   runner.run(feeds), atol, rtol)
                report["checks"][f"paddle_inference_bs{bs}_max_abs_diff"] = diff
            if onnx_runner is not None:
                diff = check_close(f"onnxruntime vs dynamic, batch {bs}", reference, onnx_runner.run(feeds),
                                   atol, rtol)
                report["checks"][f"onnxruntime_bs{bs}_max_abs_diff"] = diff
    meta = M.build_meta(family=spec["family"], name=cfg.model.name, num_classes=num_classes, data_format=data_format,
                        files=files, inputs=inputs, outputs=outputs, preprocess=spec["preprocess"],
                        postprocess=graph.postprocess, labels=labels, tensorrt=tensorrt,
                        onnx_file=os.path.basename(onnx_file) if onnx_file else None,
                        extra={"export_check": report["checks"]} if report["checks"] else None)
    report["meta_file"] = M.write_meta(output_dir, meta)
    report["seconds"] = round(time.time() - started, 2)
    return report


__all__ = ["export_model", "read_labels", "labels_from_data"]
