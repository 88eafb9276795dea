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
import paddle
import ppdlx_deploy
from ppdlx_deploy import DeployError, UnsupportedError, default_threads, load_meta, model_files

from ppdlx.cpu_features import cpu_features
from ppdlx.errors import ConfigError, PpdlxError
from ppdlx.export.api import model_in_layout
from ppdlx.export.int8 import SIMULATED_INT8
from ppdlx.export.meta import read_meta, write_meta
from ppdlx.export.verify_data import build_verify_set
from ppdlx.export.verify_judge import JUDGES, diagnose, gate
from ppdlx.export.verify_runs import RUNS, deploy_run, evaluator_metrics
from ppdlx.tasks import task_of
from ppdlx.tasks.preprocess import resolve_preprocessing

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
    import onnx  # optional (ppdlx[onnx]): only an export with an ONNX file gets here
    graph = onnx.load(path, load_external_data=False).graph
    return any(node.op_type in QUANTIZED_ONNX_OPS for node in graph.node)


def verify_cases(model_dir: str, meta: dict, deploy=ppdlx_deploy, cuda: Optional[bool] = None) -> List[dict]:
    """``{"backend", "precision", "run_precision", "skipped"}`` for every backend/precision ``deploy`` (the deploy
    package) can run the export on here; ``cuda`` None: whether this Paddle build sees a CUDA device."""
    if cuda is None:
        cuda = paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0
    cases = []
    files = deploy.model_files(model_dir, meta)
    quantized = deploy.is_quantized(files["model_file"])
    qdq = deploy.onnx_precision(meta) == "int8"
    if quantized:
        cases.append({"backend": "paddle-cpu", "precision": "int8"})
    elif (meta.get("quantization") or {}).get("program_numerics") == SIMULATED_INT8:
        # float kernels computing a quantized network: float error at a rounding step's edge flips the step, as
        # another int8 runtime's would, so the int8 bar applies
        cases.append({"backend": "paddle-cpu", "precision": "fp32", "gate": "int8"})
    else:
        cases.append({"backend": "paddle-cpu", "precision": "fp32"})
        cases.append({"backend": "paddle-cpu", "precision": "bf16"} if deploy.cpu_has_bf16() else
                     {"backend": "paddle-cpu", "precision": "bf16",
                      "skipped": "this CPU has no avx512_bf16/amx_bf16 (oneDNN would compute fp32)"})
    onnx_file = os.path.join(model_dir, meta["model"].get("onnx_file") or "inference.onnx")
    if os.path.isfile(onnx_file):
        try:
            import onnxruntime  # noqa: F401  (optional, ppdlx[onnx]: the ONNX case runs only where it is installed)
            cases.append({"backend": "onnxruntime", "precision": "int8" if _onnx_is_quantized(onnx_file) else "fp32",
                          "run_precision": deploy.onnx_precision(meta)})
        except ImportError:
            cases.append({"backend": "onnxruntime", "precision": "fp32", "skipped": "onnxruntime is not installed"})
    if qdq and not quantized:  # deploy runs a QDQ graph on onnxruntime only (ppdlx_deploy.tuning)
        cases.append({"backend": "openvino", "precision": "fp32",
                      "skipped": "the export's inference.onnx is a QDQ (int8) graph"})
    elif not quantized and (os.path.isfile(onnx_file) or files["format"] == "program"):  # what OpenVINO reads
        cases.append({"backend": "openvino", "precision": "fp32"} if deploy.runtime_installed("openvino") else
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
    f = cpu_features()
    isa = [flag for flag in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16") if flag in f.get("flags", [])]
    return (f"{f.get('model_name') or 'unknown CPU'} (family {f.get('family')}, {'/'.join(isa) or 'no avx2'}, "
            f"{f.get('usable_cpus')} usable cpus)")


def verify_export(cfg, model_dir: str, source: str = "val", max_images: Optional[int] = None, max_drop: float = 1.0,
                  threads: Optional[int] = None, model=None, batch_size: int = 8) -> dict:
    """Verify the export in ``model_dir`` against ``cfg``'s model (``model.weights``); returns the
    record also written to ``inference.yml`` as ``verify:`` (``passed``, per case figures, ``failure``). What
    differs by the export's family (its set, runs and judge) comes from the registries of the verify modules."""
    if not cfg.model.weights:
        raise ConfigError("--verify compares the export with the trained model: set -o model.weights=<checkpoint>")
    cfg = resolve_preprocessing(cfg)  # what export wrote and ppdlx's evaluator uses
    try:
        meta = load_meta(model_dir)
        model_files(model_dir, meta)  # a damaged export is one line here, not a failure inside a backend
    except DeployError as err:
        raise ConfigError(f"--verify: {err}") from None
    family = meta["model"]["family"]
    runs, judge = RUNS[family], JUDGES[family]
    layout = meta["model"].get("data_format", cfg.model.data_format)
    if layout != cfg.model.data_format:  # compare in the export's layout, whatever the model trained in
        cfg = cfg.replace({"model.data_format": layout, "export.data_format": layout})
    threads = threads or default_threads()
    model = model_in_layout(cfg, cfg.model.weights, model)
    expected_preprocess = task_of(cfg).export_spec(cfg, model)["preprocess"]
    workdir = tempfile.mkdtemp(prefix="ppdlx_verify_")
    try:
        vset = build_verify_set(cfg, family, source, max_images, workdir, meta["postprocess"])
        evaluator = evaluator_metrics(vset)
        reference = runs.reference(vset)
        trained = runs.trained(model, vset, cfg, meta)
        reference_metric = runs.reference_metric(trained, vset)
        cases = []
        for case in verify_cases(model_dir, meta):
            if case.get("skipped"):
                cases.append(case)
                continue
            try:
                preds, plan = deploy_run(model_dir, case["backend"], case.get("run_precision", case["precision"]),
                                         vset, threads, batch_size)
            except UnsupportedError as err:
                cases.append({**case, "skipped": str(err)})
                continue
            except DeployError as err:
                raise ConfigError(f"--verify {case['backend']} {case['precision']}: {err}") from None
            case = {**case, "engine": plan.get("engine")}
            case.update(judge.judge(case, preds, vset, trained, evaluator, meta, reference))
            case["passed"] = gate(case, evaluator, family, max_drop, trained.input_max_abs_diff)
            if not case["passed"]:
                case["cause"] = diagnose(case, meta.get("labels"), vset, trained, expected_preprocess,
                                         meta["preprocess"], evaluator, reference_metric)
            cases.append(case)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    record = {"source": vset.source, "images": len(vset), "cpu": _cpu_line(), "threads": int(threads),
              "date": datetime.date.today().isoformat(), "max_drop_points": float(max_drop),
              "reference": {"evaluator": "ppdlx.engine.run.evaluate", **{k: float(evaluator[k]) for k in judge.keys}},
              "deploy_inputs": {"max_abs_diff": trained.input_max_abs_diff,
                                "mean_abs_diff": trained.input_mean_abs_diff},
              "cases": [_rounded(c) for c in cases]}
    record.update(verdict(cases))
    on_disk = read_meta(model_dir)
    on_disk["verify"] = record
    write_meta(model_dir, on_disk)
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
