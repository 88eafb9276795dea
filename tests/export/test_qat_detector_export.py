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
from ppdlx.export.families import export_graph
from ppdlx.export.onnx_detection import check_detections_close
from ppdlx.export.onnx_export import ExportCheckError
from ppdlx.export.paddle_export import PaddleInferenceRunner, random_feeds, run_dynamic
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
