"""Which predictor runs an export: :func:`create_predictor` for a backend and precision, with the
measured choices resolved first (``backend="auto"``, and on paddle-cpu ``precision="auto"`` /
``cpu_variant="auto"``: :mod:`ppdlx_deploy.tuning`). The predictor's first note says in one line
what was chosen and why."""
from __future__ import annotations

from .errors import UnsupportedError
from .meta import load_meta, model_files, onnx_precision
from .openvino_runtime import OpenVinoPredictor
from .plan import check_backend_available, default_threads
from .predictors import OnnxPredictor, PaddlePredictor
from .tuning import choose_backend, choose_cpu_plan, failed_verify

# create_predictor's own options (not passed on to a predictor).
CHOICE_OPTIONS = ("progress", "cache_file")


def bf16_failed_verify(meta: dict) -> bool:
    """Whether ``tools/export_model.py --verify`` ran this export on paddle-cpu in bf16 and it missed the gate."""
    return failed_verify(meta, "paddle-cpu", "bf16") is not None


def _auto_backend(model_dir: str, precision: str, kwargs: dict):
    meta = kwargs.get("meta") or load_meta(model_dir)
    threads = kwargs.get("threads") or default_threads()
    decision = choose_backend(model_dir, meta, model_files(model_dir, meta), precision, threads=threads,
                              batch_size=kwargs.get("batch_size", 1), progress=kwargs.get("progress"),
                              cache_file=kwargs.get("cache_file"))
    spec = decision["spec"]
    options = {k: v for k, v in kwargs.items() if k not in ("cpu_variant", "cpu_engine", "meta", "threads")}
    predictor = create_predictor(model_dir, spec["backend"], spec["precision"], meta=meta, threads=threads,
                                 **options, **spec["options"])
    predictor.plan["notes"].insert(0, decision["line"])
    predictor.plan["backend_choice"] = {k: decision.get(k) for k in ("chosen", "cached", "medians", "rejected",
                                                                     "skipped", "line")}
    return predictor


def create_predictor(model_dir: str, backend: str = "auto", precision: str = "fp32", **kwargs):
    """A predictor (``run(feeds) -> [outputs]``, ``plan``) for ``backend``/``precision``.

    ``backend="auto"``: the fastest CPU runtime on this machine (paddle-cpu and its plan variants,
    onnxruntime, OpenVINO) whose outputs agree with the export's, measured once per machine, export,
    threads and batch size, each candidate in its own process, and cached. On paddle-cpu,
    ``precision="auto"`` and/or ``cpu_variant="auto"`` choose among Paddle's plans the same way.
    ``progress``: called with a line before each measurement (nothing is printed otherwise)."""
    if backend == "auto":
        return _auto_backend(model_dir, precision, kwargs)
    progress, cache_file = (kwargs.pop(k, None) for k in CHOICE_OPTIONS)
    if backend == "onnxruntime":
        meta = kwargs.get("meta") or load_meta(model_dir)
        if precision not in (onnx_precision(meta), "auto"):
            raise UnsupportedError(f"--backend onnxruntime --precision {precision}: this export's ONNX file is "
                                   f"{onnx_precision(meta)} (onnxruntime runs it as written)")
        return OnnxPredictor(model_dir, threads=kwargs.get("threads"), meta=meta)
    if backend == "openvino":
        check_backend_available(backend)
        return OpenVinoPredictor(model_dir, "fp32" if precision == "auto" else precision,
                                 threads=kwargs.get("threads"), meta=kwargs.get("meta"))
    if backend == "paddle-cpu" and precision == "auto":
        meta = kwargs.get("meta") or load_meta(model_dir)
        kwargs["meta"] = meta
        if meta.get("precision") == "int8":  # an int8 export run as fp32 only emulates its quantize ops, slowly
            precision = "int8"
        elif bf16_failed_verify(meta):
            predictor = create_predictor(model_dir, backend, "fp32", **kwargs)
            predictor.plan["notes"].insert(0, "cpu plan: fp32 (this export's --verify found bf16 outside its gate: "
                                              "inference.yml verify)")
            return predictor
    if backend == "paddle-cpu" and "auto" in (precision, kwargs.get("cpu_variant")):
        check_backend_available(backend)
        meta = kwargs.get("meta") or load_meta(model_dir)
        kwargs["meta"] = meta
        kwargs["threads"] = kwargs.get("threads") or default_threads()
        choice = choose_cpu_plan(model_dir, model_files(model_dir, meta), precision, kwargs.pop("cpu_variant", None),
                                 threads=kwargs["threads"], batch_size=kwargs.get("batch_size", 1), meta=meta,
                                 cache_file=cache_file, progress=progress)
        predictor = PaddlePredictor(model_dir, backend, choice["precision"], cpu_variant=choice["cpu_variant"],
                                    **kwargs)
        predictor.plan["notes"].insert(0, choice["line"])
        predictor.plan["cpu_choice"] = choice
        return predictor
    return PaddlePredictor(model_dir, backend, precision, **kwargs)

