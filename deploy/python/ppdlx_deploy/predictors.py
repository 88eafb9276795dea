"""Predictors with one interface, ``run(feeds) -> [outputs]`` (host arrays in, host arrays out:
the copies are part of the timed network call) and ``plan`` (what runs, with notes; ``plan["graph"]``
says whether the Paddle program or the ONNX graph ran): Paddle Inference for paddle-cpu (oneDNN /
Paddle's OpenVINO engine), paddle-gpu and trt (the Paddle-TRT routes of :mod:`ppdlx_deploy.trt`), and
onnxruntime on CPU (OpenVINO's own package: :mod:`ppdlx_deploy.openvino_runtime`). paddle and
onnxruntime are imported where a predictor of theirs is built: a deployment on one runtime, and each
benchmark worker, loads no other runtime's libraries and threads."""
from __future__ import annotations

import os
from typing import Dict, List, Optional

import numpy as np

from .config_calls import apply_plan
from .errors import DeployError
from .integrity import check_onnx_file, runtime_load_error
from .meta import load_meta, model_files, onnx_precision
from .plan import build_plan, check_backend_available, default_threads
from .signal_stack import signal_stack_kept
from .trt import SUBGRAPH, convert_pir_trt, drop_engines_of_other_shapes, subgraph_engine_count


class _executor_flags:
    """Temporarily set ``FLAGS_new_executor_serial_run`` (restored on exit)."""

    def __init__(self, serial: bool):
        self.serial = serial

    def __enter__(self):
        if self.serial:
            import paddle  # see the module's docstring: loaded by Paddle deployments only
            self.previous = paddle.get_flags(["FLAGS_new_executor_serial_run"])["FLAGS_new_executor_serial_run"]
            paddle.set_flags({"FLAGS_new_executor_serial_run": True})
        return self

    def __exit__(self, *exc):
        if self.serial:
            import paddle  # see the module's docstring: loaded by Paddle deployments only
            paddle.set_flags({"FLAGS_new_executor_serial_run": self.previous})
        return False


def _create_paddle_predictor(pi, config, files: dict):
    """``pi.create_predictor`` with a failure to read the files as one line naming the file."""
    try:
        return pi.create_predictor(config)
    except (RuntimeError, ValueError, OSError) as err:
        error = runtime_load_error(files, err)
        if error is None:
            raise
        raise error from None


def collect_shape_ranges(pi, plan: dict, files: dict, sample_feeds) -> None:
    """``--trt-shapes collect`` on the subgraph route: run the sample batches through a predictor
    with the plan's ``collect_calls``, which writes ``plan["shape_file"]`` when it is destroyed."""
    if not sample_feeds:
        raise DeployError("--trt-shapes collect needs sample inputs (--input images)")
    shape_file = plan["shape_file"]
    os.makedirs(os.path.dirname(os.path.abspath(shape_file)), exist_ok=True)
    previous_shapes = None
    if os.path.isfile(shape_file):
        with open(shape_file, "rb") as f:
            previous_shapes = f.read()
    config = pi.Config(plan["model_file"], plan["params_file"])
    apply_plan(config, plan["collect_calls"])
    predictor = _create_paddle_predictor(pi, config, files)
    for feeds in sample_feeds:
        for name in predictor.get_input_names():
            h = predictor.get_input_handle(name)
            h.reshape(list(feeds[name].shape))
            h.copy_from_cpu(np.ascontiguousarray(feeds[name]))
        predictor.run()
    del predictor  # the shape file is written when the collecting predictor is destroyed
    if plan["engine"] == SUBGRAPH and drop_engines_of_other_shapes(plan, previous_shapes):
        plan["notes"].append("the --input images gave other shapes than the last collection: "
                             "the TensorRT engines are built again")


class PaddlePredictor:
    """Paddle Inference predictor built from :func:`build_plan`. ``run(feeds) -> [outputs]``
    (host arrays in, host arrays out: the copies are part of the timed network call)."""

    def __init__(self, model_dir: str, backend: str = "paddle-cpu", precision: str = "fp32",
                 threads: Optional[int] = None, batch_size: int = 1, meta: Optional[dict] = None,
                 sample_feeds: Optional[List[Dict[str, np.ndarray]]] = None, tuned_cpu: bool = True,
                 plan: Optional[dict] = None, **plan_kwargs):
        """``plan``: a :func:`build_plan` result to use as is (backend/precision/kwargs then unused)."""
        check_backend_available(plan["backend"] if plan else backend)
        import paddle.inference as pi  # see the module's docstring: loaded by Paddle deployments only
        self.meta = meta or load_meta(model_dir)
        self.files = model_files(model_dir, self.meta)
        self.plan = plan or build_plan(self.meta, self.files, backend, precision, threads=threads,
                                       batch_size=batch_size, tuned_cpu=tuned_cpu, **plan_kwargs)
        # The PIR executor otherwise schedules ops through a worker thread pool: on few (shared)
        # cores that costs context switches for no parallelism (measured in
        # benchmarks/infer.py). The flag is read when the executor is built (creation and
        # first run), so it is set around those only and other predictors keep their own mode.
        self._serial_run = (self.plan["backend"] == "paddle-cpu" and self.plan.get("tuned_cpu", tuned_cpu)
                            and self.files["format"] == "pir")
        self._built = False
        if self.plan["pir_trt"]:
            self.plan["tensorrt_engines"] = convert_pir_trt(self.plan["pir_trt"], sample_feeds)
        if self.plan["collect_calls"]:
            collect_shape_ranges(pi, self.plan, self.files, sample_feeds)
        config = pi.Config(self.plan["model_file"], self.plan["params_file"])
        apply_plan(config, self.plan["calls"])
        config.disable_glog_info()
        self.config = config
        # Paddle's OpenVINO engine loads OpenVINO's CPU plugin, which swaps the thread's signal stack
        self._keeps_signal_stack = self.plan["engine"] == "paddle-openvino"
        with _executor_flags(self._serial_run), signal_stack_kept():
            self.predictor = _create_paddle_predictor(pi, config, self.files)
        self.input_names = list(self.predictor.get_input_names())
        self.output_names = list(self.predictor.get_output_names())
        self._inputs = {n: self.predictor.get_input_handle(n) for n in self.input_names}
        self._outputs = [self.predictor.get_output_handle(n) for n in self.output_names]

    def run(self, feeds: Dict[str, np.ndarray]) -> List[np.ndarray]:
        for name, handle in self._inputs.items():
            array = feeds[name]
            handle.reshape(list(array.shape))
            handle.copy_from_cpu(array)
        if self._built and not self._keeps_signal_stack:
            self.predictor.run()
        elif self._built:
            with signal_stack_kept():
                self.predictor.run()
        else:
            with _executor_flags(self._serial_run), signal_stack_kept():
                self.predictor.run()
            self._built = True
            if self.plan["engine"] == SUBGRAPH:  # the subgraph pass has built (or loaded) its engines by now
                self.plan["tensorrt_engines"] = subgraph_engine_count(self.plan)
        return [h.copy_to_cpu() for h in self._outputs]


class OnnxPredictor:
    def __init__(self, model_dir: str, threads: Optional[int] = None, meta: Optional[dict] = None,
                 onnx_file: Optional[str] = None, profile_prefix: Optional[str] = None):
        """``profile_prefix``: record onnxruntime's profile (``session.end_profiling()`` writes it there)."""
        check_backend_available("onnxruntime")
        import onnxruntime as ort  # optional runtime, see the module's docstring
        self.meta = meta or load_meta(model_dir)
        onnx_file = onnx_file or os.path.join(model_dir, self.meta["model"].get("onnx_file") or "inference.onnx")
        if not os.path.isfile(onnx_file):
            raise DeployError(f"{onnx_file}: not found (export with tools/export_model.py --onnx)")
        check_onnx_file(onnx_file)
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(threads or default_threads())
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        if profile_prefix:
            options.enable_profiling = True
            options.profile_file_prefix = profile_prefix
        try:
            self.session = ort.InferenceSession(onnx_file, options, providers=["CPUExecutionProvider"])
        except Exception as err:  # onnxruntime's errors (InvalidProtobuf, Fail, ...) derive from Exception only
            first = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
            raise DeployError(f"{onnx_file}: onnxruntime cannot load it ({first[:160]}); re-export the model with "
                              f"tools/export_model.py --onnx") from None
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.plan = {"backend": "onnxruntime", "engine": "onnxruntime", "precision": onnx_precision(self.meta),
                     "graph": "onnx",
                     "threads": options.intra_op_num_threads,
                     "notes": [f"onnxruntime {ort.__version__} CPUExecutionProvider, ORT_ENABLE_ALL, "
                               f"{options.intra_op_num_threads} intra-op thread(s)"]}

    def run(self, feeds: Dict[str, np.ndarray]) -> List[np.ndarray]:
        return self.session.run(None, {n: feeds[n] for n in self.input_names})
