"""The export of a quantization-aware-trained EfficientDet: its Paddle program (float, PIR: the detector has no int8
Paddle program on Paddle 3.3.1) computes what the QAT model computes, quantization included.

A tiny stand-in: EfficientDet-D0 at 64 px with QAT layers whose activation ranges were set on inputs a quarter as
wide as the ones it is then fed, so that the quantization (clipping, int8 steps) changes its detections: the
float graph of the same weights predicts something else."""
import os

import numpy as np
import paddle
import pytest

from benchmarks.infer import load_deploy_module
from ppdlx.config import load_config
from ppdlx.export import export_model
from ppdlx.export.families import export_graph
from ppdlx.export.int8 import SIMULATED_INT8
from ppdlx.export.onnx_detection import check_detections_close
from ppdlx.export.onnx_export import ExportCheckError
from ppdlx.export.paddle_export import PaddleInferenceRunner, random_feeds, run_dynamic
from ppdlx.export.verify import verify_cases
from ppdlx.models.qat import is_quantized, without_quanters
from ppdlx.tasks import task_of
from ppdlx.tasks.preprocess import resolve_preprocessing

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "demo", "efficientdet_qat_demo.yaml")
D = load_deploy_module()


@pytest.fixture(scope="module")
def qat_detector():
    cfg = resolve_preprocessing(load_config(CONFIG, ["model.weights=", "detection.precise_bn_batches=0",
                                                     "data.root=/nonexistent"]))
    paddle.seed(0)
    task = task_of(cfg)
    model = task.build_model(cfg, 3)
    task.prepare_model(cfg, model)
    assert is_quantized(model)
    model.train()
    with paddle.no_grad():
        for _ in range(3):  # ranges and BatchNorm statistics of inputs a quarter as wide as the feeds below
            model(paddle.randn([4, 3, 64, 64]) * 0.25)
    model.eval()
    return cfg, model, task.export_spec(cfg, model)


def test_the_program_of_a_qat_detector_predicts_what_the_qat_model_predicts(qat_detector, tmp_path):
    """Before: the program was the float graph of the same weights, which detects other boxes (the demo's
    paddle-cpu fp32 agreed with the QAT model on 25 % of the val images, AP 0.05 against 0.17)."""
    cfg, model, spec = qat_detector
    graph = export_graph(model, spec, str(tmp_path), "NCHW", "pir")
    runner = PaddleInferenceRunner(graph.files, threads=1)
    feeds = random_feeds(graph.inputs, 2)
    program = runner.run(feeds)
    qat_model = run_dynamic(graph.layer, graph.inputs, feeds)
    check_detections_close("program vs the QAT model", qat_model, program, 1e-4, 1e-4)
    with without_quanters(model):
        float_model = run_dynamic(graph.layer, graph.inputs, feeds)
    with pytest.raises(ExportCheckError):  # on these feeds the quantization changes the detections
        check_detections_close("the float graph vs the QAT model", qat_model, float_model, 1e-4, 1e-4)
    assert not D.is_quantized(graph.files.model_file)  # deploy runs it as the float program it is


def test_the_export_of_a_qat_detector_passes_its_checks_and_verify_judges_it_as_int8(qat_detector, tmp_path):
    """The whole export with --onnx: the program and the QDQ file pass the export's checks, inference.yml says the
    program simulates int8, and --verify's cases follow: paddle-cpu fp32 on the program is held to the int8 bar
    (before: the fp32 bar, which a quantized network run by other kernels misses by a flipped step), onnxruntime
    int8 runs the QDQ file, and OpenVINO, which deploy does not run a QDQ file on, is skipped (before: judged fp32)."""
    cfg, model, _ = qat_detector
    report = export_model(cfg, output_dir=str(tmp_path), model=model, onnx=True, check_batch_sizes=(1,))
    assert set(report["checks"]) == {"paddle_inference_bs1_max_abs_diff", "onnxruntime_bs1_max_abs_diff"}
    meta = D.load_meta(str(tmp_path))
    assert meta["quantization"]["program_numerics"] == SIMULATED_INT8 and meta["quantization"]["onnx"]
    cases = {c["backend"]: c for c in verify_cases(str(tmp_path), meta, cuda=False)}
    assert cases["paddle-cpu"] == {"backend": "paddle-cpu", "precision": "fp32", "gate": "int8"}
    assert cases["onnxruntime"]["precision"] == "int8"
    assert cases["openvino"]["skipped"] == "the export's inference.onnx is a QDQ (int8) graph"
