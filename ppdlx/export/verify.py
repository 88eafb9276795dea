"""``--verify``: does the export predict like the trained model on real validation images?

``verify_export(cfg, model_dir, source="val", max_images=None, max_drop=1.0)`` runs, for every
backend/precision this machine offers (:func:`verify_cases`: paddle-cpu fp32, bf16 where the CPU
has bf16 hardware, int8 for a quantised export, onnxruntime when the export has an ONNX file,
OpenVINO when installed and the export has a file it reads, paddle-gpu/trt on a CUDA build), the
export through the deploy package exactly as a service would (:mod:`ppdlx.export.verify_runs`),
scores it against ppdlx's own evaluator on the same images and gates it
(:mod:`ppdlx.export.verify_judge`). The figures go into ``inference.yml`` (``verify:``) and the
returned record; a failed case carries one line naming the cause (labels, pre-processing or
numerics). :func:`raise_on_failure` turns a failed record into that one line.
"""
from __future__ import annotations

import datetime
import os
import shutil
import tempfile
from typing import List, Optional

import numpy as np

import ppdlx.export.meta as M
from ppdlx.errors import ConfigError, PpdlxError
import ppdlx.export.verify_judge as J
from ppdlx.export.verify_data import build_verify_set
from ppdlx.export.verify_runs import deploy_run, evaluator_detections, evaluator_metrics, trained_model_runs

# A precision the deploy predictor runs only when asked (--precision bf16) or when --precision auto
# measured it faster: its rounding is a property of the model, not a defect of the export, so a bf16
# case outside the gate is a warning in the record, and --precision auto then keeps fp32 for this
# export (ppdlx_deploy.backends.create_predictor reads verify: from inference.yml).
ADVISORY_PRECISIONS = ("bf16",)

QUANTIZED_ONNX_OPS = ("QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul", "ConvInteger",
                      "MatMulInteger", "DynamicQuantizeLinear")


class VerifyError(PpdlxError):
    """The export does not predict like the trained model (the gate failed)."""

    exit_code = 1


def _onnx_is_quantized(path: str) -> bool:
    import onnx
    graph = onnx.load(path, load_external_data=False).graph
    return any(node.op_type in QUANTIZED_ONNX_OPS for node in graph.node)


def verify_cases(model_dir: str, meta: dict, D, cuda: Optional[bool] = None) -> List[dict]:
    """``{"backend", "precision", "run_precision", "skipped"}`` for every backend/precision; ``cuda``
    None: whether this Paddle build sees a CUDA device."""
    import paddle
    if cuda is None:
        cuda = paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0
    cases = []
    files = D.model_files(model_dir, meta)
    quantized = D.is_quantized(files["model_file"])
    if quantized:
        cases.append({"backend": "paddle-cpu", "precision": "int8"})
    else:
        cases.append({"backend": "paddle-cpu", "precision": "fp32"})
        cases.append({"backend": "paddle-cpu", "precision": "bf16"} if D.cpu_has_bf16() else
                     {"backend": "paddle-cpu", "precision": "bf16",
                      "skipped": "this CPU has no avx512_bf16/amx_bf16 (oneDNN would compute fp32)"})
    onnx_file = os.path.join(model_dir, meta["model"].get("onnx_file") or "inference.onnx")
    if os.path.isfile(onnx_file):
        try:
            import onnxruntime  # noqa: F401
            cases.append({"backend": "onnxruntime", "precision": "int8" if _onnx_is_quantized(onnx_file) else "fp32",
                          "run_precision": D.onnx_precision(meta)})
        except ImportError:
            cases.append({"backend": "onnxruntime", "precision": "fp32", "skipped": "onnxruntime is not installed"})
    if not quantized and (os.path.isfile(onnx_file) or files["format"] == "program"):  # what OpenVINO reads
        cases.append({"backend": "openvino", "precision": "fp32"} if D.runtime_installed("openvino") else
                     {"backend": "openvino", "precision": "fp32", "skipped": "openvino is not installed"})
    if cuda and quantized:  # its quantize ops are int8 only through TensorRT on a GPU
        cases.append({"backend": "trt", "precision": "int8"})
        cases.append({"backend": "paddle-gpu", "precision": "int8",
                      "skipped": "a quantised program runs int8 on GPU through TensorRT only"})
    elif cuda:
        cases.append({"backend": "paddle-gpu", "precision": "fp32"})
        cases.append({"backend": "paddle-gpu", "precision": "fp16"})
        cases.append({"backend": "trt", "precision": "fp16"})
    else:
        cases.append({"backend": "paddle-gpu/trt", "precision": "-", "skipped": "no CUDA device or CPU-only Paddle"})
    return cases


def _cpu_line() -> str:
    from ppdlx.cpu_features import cpu_features
    f = cpu_features()
    isa = [flag for flag in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16") if flag in f.get("flags", [])]
    return (f"{f.get('model_name') or 'unknown CPU'} (family {f.get('family')}, {'/'.join(isa) or 'no avx2'}, "
            f"{f.get('usable_cpus')} usable cpus)")


def _judge_classification(case, preds, vset, trained, evaluator, output: str) -> dict:
    ref_names = [vset.classes[c] for c in trained.reference.top[:, 0]]
    ours = trained.deploy_inputs.scores
    if output == "probabilities":  # the export ends in softmax, the trained model in logits
        ours = np.exp(ours - ours.max(-1, keepdims=True))
        ours = ours / ours.sum(-1, keepdims=True)
    scores = J.classification_scores(preds.names, vset)
    out = {**scores,
           "agreement": J.top1_agreement([n[0] for n in preds.names], ref_names),
           "index_agreement": J.top1_agreement(preds.top[:, 0], trained.reference.top[:, 0]),
           "numerics_agreement": J.top1_agreement(preds.top[:, 0], trained.deploy_inputs.top[:, 0]),
           "preprocess_agreement": J.top1_agreement(trained.deploy_inputs.top[:, 0], trained.reference.top[:, 0]),
           "max_output_diff": float(np.max(np.abs(preds.scores - ours)))}
    out["drop_points"] = (evaluator["top1"] - scores["top1"]) * 100
    return out


def _judge_detection(case, preds, vset, trained, reference, postprocess: dict) -> dict:
    threshold = float(postprocess.get("score_threshold", 0.4))
    full = int(postprocess.get("max_detections", 100))
    scores = J.detection_scores(preds.dets, vset, preds.names)
    ref_named = J.keyed(reference.dets, classes=vset.classes)
    deploy_by_index = J.keyed(preds.dets, classes=vset.classes)
    ours_on_deploy_inputs = J.keyed(trained.deploy_inputs.dets, classes=vset.classes)
    return {**scores,
            "agreement": J.box_agreement(J.keyed(preds.dets, keys=preds.names), ref_named, threshold, full),
            "index_agreement": J.box_agreement(deploy_by_index, ref_named, threshold, full),
            "numerics_agreement": J.box_agreement(deploy_by_index, ours_on_deploy_inputs, threshold, full),
            "preprocess_agreement": J.box_agreement(ours_on_deploy_inputs, ref_named, threshold, full),
            "kept_boxes": int(sum(int(np.sum(d[1] >= threshold)) for d in reference.dets))}


def verify_export(cfg, model_dir: str, source: str = "val", max_images: Optional[int] = None, max_drop: float = 1.0,
                  threads: Optional[int] = None, model=None, batch_size: int = 8) -> dict:
    """Verify the export in ``model_dir`` against ``cfg``'s model (``model.weights``); returns the
    record also written to ``inference.yml`` as ``verify:`` (``passed``, per case figures, ``failure``)."""
    from ppdlx.benchmarks.infer import load_deploy_module
    from ppdlx.export.api import model_in_layout
    from ppdlx.engine.preprocess_cfg import resolve_preprocessing
    from ppdlx.engine.tasks import task_of
    if not cfg.model.weights:
        raise ConfigError("--verify compares the export with the trained model: set -o model.weights=<checkpoint>")
    cfg = resolve_preprocessing(cfg)  # what export wrote and ppdlx's evaluator uses
    D = load_deploy_module()
    try:
        meta = D.load_meta(model_dir)
        D.model_files(model_dir, meta)  # a damaged export is one line here, not a failure inside a backend
    except D.DeployError as err:
        raise ConfigError(f"--verify: {err}") from None
    family = meta["model"]["family"]
    layout = meta["model"].get("data_format", cfg.model.data_format)
    if layout != cfg.model.data_format:  # compare in the export's layout, whatever the model trained in
        cfg = cfg.replace({"model.data_format": layout, "export.data_format": layout})
    threads = threads or D.default_threads()
    model = model_in_layout(cfg, cfg.model.weights, model)
    expected_preprocess = task_of(cfg).export_spec(cfg, model)["preprocess"]
    workdir = tempfile.mkdtemp(prefix="ppdlx_verify_")
    try:
        vset = build_verify_set(cfg, family, source, max_images, workdir, meta["postprocess"])
        evaluator = evaluator_metrics(vset)
        reference = evaluator_detections(vset) if family == "detection" else None
        trained = trained_model_runs(model, vset, cfg, meta, D)
        reference_metric = None
        if family == "classification":
            reference_metric = float(np.mean(trained.reference.top[:, 0] == np.asarray(vset.truth)))
        cases = []
        for case in verify_cases(model_dir, meta, D):
            if case.get("skipped"):
                cases.append(case)
                continue
            try:
                preds, plan = deploy_run(model_dir, case["backend"], case.get("run_precision", case["precision"]),
                                         vset, D, threads, batch_size)
            except D.UnsupportedError as err:
                cases.append({**case, "skipped": str(err)})
                continue
            except D.DeployError as err:
                raise ConfigError(f"--verify {case['backend']} {case['precision']}: {err}") from None
            case = {**case, "engine": plan.get("engine")}
            if family == "classification":
                case.update(_judge_classification(case, preds, vset, trained, evaluator,
                                                  meta["postprocess"].get("output", "logits")))
            else:
                case.update(_judge_detection(case, preds, vset, trained, reference, meta["postprocess"]))
                case["drop_points"] = (evaluator["AP"] - case["AP"]) * 100
            case["passed"] = J.gate(case, evaluator, family, max_drop, trained.input_max_abs_diff)
            if not case["passed"]:
                case["cause"] = J.diagnose(case, meta.get("labels"), vset, trained, expected_preprocess,
                                           meta["preprocess"], evaluator, reference_metric)
            cases.append(case)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    keys = ("top1", "top5") if family == "classification" else ("AP", "AP50")
    record = {"source": vset.source, "images": len(vset), "cpu": _cpu_line(), "threads": int(threads),
              "date": datetime.date.today().isoformat(), "max_drop_points": float(max_drop),
              "reference": {"evaluator": "ppdlx.engine.run.evaluate", **{k: float(evaluator[k]) for k in keys}},
              "deploy_inputs": {"max_abs_diff": trained.input_max_abs_diff,
                                "mean_abs_diff": trained.input_mean_abs_diff},
              "cases": [_rounded(c) for c in cases]}
    record.update(verdict(cases))
    on_disk = M.read_meta(model_dir)
    on_disk["verify"] = record
    M.write_meta(model_dir, on_disk)
    return record


def verdict(cases: List[dict]) -> dict:
    """``passed``, ``failure`` (one line, when a required case failed) and ``warnings`` (an advisory
    precision outside the gate) of the cases that ran."""
    ran = [c for c in cases if not c.get("skipped")]
    required = [c for c in ran if c["precision"] not in ADVISORY_PRECISIONS]
    result = {"passed": bool(required) and all(c["passed"] for c in required),
              "warnings": [f"--verify: {c['backend']} {c['precision']} is outside the gate ({c['cause']}); "
                           f"deploy this export with --precision fp32 (--precision auto keeps fp32 for it)"
                           for c in ran if c["precision"] in ADVISORY_PRECISIONS and not c["passed"]]}
    failed = [c for c in required if not c["passed"]]
    if failed:
        names = ", ".join(f"{c['backend']} {c['precision']}" for c in failed)
        result["failure"] = f"--verify failed ({names}): {failed[0]['cause']}"
    return result


def _rounded(case: dict) -> dict:
    return {k: (round(float(v), 6) if isinstance(v, (float, np.floating)) else v) for k, v in case.items()}


def format_record(record: dict) -> List[str]:
    """The report lines ``tools/export_model.py --verify`` prints."""
    ref = record["reference"]
    metrics = {k: v for k, v in ref.items() if k != "evaluator"}
    lines = [f"verify: {record['images']} images of {record['source']}; ppdlx evaluator "
             + " ".join(f"{k} {v:.4f}" for k, v in metrics.items()) + f"; {record['cpu']}, {record['threads']} threads"]
    for c in record["cases"]:
        what = f"verify: {c['backend']} {c['precision']}"
        if c.get("skipped"):
            lines.append(f"{what}: skipped ({c['skipped']})")
            continue
        scores = " ".join(f"{k} {c[k]:.4f}" for k in metrics)
        outcome = "PASS" if c["passed"] else ("FAIL (advisory)" if c["precision"] in ADVISORY_PRECISIONS else "FAIL")
        lines.append(f"{what} ({c.get('engine')}): {scores}, drop {c['drop_points']:+.2f} pt, agreement "
                     f"{c['agreement']:.2%} -> {outcome}")
    return lines + [f"warning: {w}" for w in record.get("warnings", [])]


def raise_on_failure(record: dict) -> None:
    if record.get("failure"):
        raise VerifyError(record["failure"])
    if not record["passed"]:
        raise VerifyError("--verify ran no backend: " + "; ".join(
            f"{c['backend']} {c['precision']}: {c['skipped']}" for c in record["cases"] if c.get("skipped")))
