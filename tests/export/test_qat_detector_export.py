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
from ppdlx.layers import site_quantized_convs
from ppdlx.models.qat import is_quantized, layer_scales, summary, without_quanters
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


def test_each_pyramid_level_quantizes_the_shared_head_inputs_with_its_own_range():
    """Before: one range per head convolution, a moving average over the five levels' calls, which followed the
    levels that ran last (on the demo: 3.1 against P3 inputs up to 18.5 and P7 inputs below one int8 step)."""
    cfg = resolve_preprocessing(load_config(CONFIG, ["model.weights=", "data.root=/nonexistent"]))
    paddle.seed(1)
    task = task_of(cfg)
    model = task.build_model(cfg, 3)
    task.prepare_model(cfg, model)
    shared = site_quantized_convs(model)
    assert len(shared) == 16 and summary(model)["call_sites"] == 80  # 2 heads x 4 separable convs x 2, x 5 levels
    assert all(conv.activation_quanter is None for conv, _ in shared)
    seen = {}

    def record(layer, inputs):  # returns None: a pre-hook's result would replace the inputs
        seen.setdefault(id(layer), float(paddle.abs(inputs[0]).max()))
    hooks = [stub.register_forward_pre_hook(record) for _, stubs in shared for stub in stubs]
    model.train()
    with paddle.no_grad():
        model(paddle.randn([2, 3, 64, 64]))
    for hook in hooks:
        hook.remove()
    scales = layer_scales(model)
    for conv, stubs in shared:
        ranges = scales[conv.weight.name]["activation"]
        # a first call's moving average (Paddle's quanter starts with state 1, accumulator 1, rate 0.9)
        expected = [(0.9 + seen[id(stub)]) / 1.9 for stub in stubs]
        np.testing.assert_allclose(ranges, expected, rtol=1e-5)
    inputs = [seen[id(stub)] for stub in shared[0][1]]
    assert max(inputs) > 2 * min(inputs)  # the levels' inputs do differ


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
    # as the export checks it (the saved ops, no oneDNN): to the bit. Before: Paddle Inference's CPU config starts
    # with oneDNN on, whose convolutions flipped rounding steps (the demo's QAT export then refused itself)
    as_checked = PaddleInferenceRunner(graph.files, threads=1, ir_optim=False).run(feeds)
    assert all(np.array_equal(a, b) for a, b in zip(as_checked, qat_model))
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
    # a head convolution shared over the levels reads each level's input through that level's own scale
    import onnx
    from onnx import numpy_helper
    graph = onnx.load(os.path.join(str(tmp_path), "inference.onnx")).graph
    constants = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    conv = site_quantized_convs(model)[-1][0]
    readers = [n for n in graph.node if n.op_type == "Conv" and n.input[1] == conv.weight.name + ".dq"]
    scales = [float(constants[producer[n.input[0]].input[1]]) for n in readers]
    np.testing.assert_allclose(scales, np.array(layer_scales(model)[conv.weight.name]["activation"]) / 127,
                               rtol=1e-6)


def _detections(scores, boxes, classes):
    padded = np.zeros([1, 100], np.float32)
    padded[0, :len(scores)] = scores
    box_array = np.zeros([1, 100, 4], np.float32)
    box_array[0, :len(boxes)] = boxes
    class_array = np.full([1, 100], -1, np.int64)
    class_array[0, :len(classes)] = classes
    return [box_array, padded, class_array, np.array([len(scores)], np.int32)]


def test_detections_are_matched_both_ways():
    """Before: each of the other side's detections needed a counterpart in the reference, not the reverse, so two
    detections of one class passed for a reference with one of each class."""
    boxes = [[0, 0, 10, 10], [20, 20, 30, 30]]
    two_kinds = _detections([0.5, 0.5], boxes, [0, 1])
    one_kind_twice = _detections([0.5, 0.5], [boxes[0], boxes[0]], [0, 0])
    assert check_detections_close("same", two_kinds, two_kinds, 1e-4, 1e-4) == 0.0
    with pytest.raises(ExportCheckError, match="the reference against it: image 0 candidate 1 .class 1"):
        check_detections_close("both ways", two_kinds, one_kind_twice, 1e-4, 1e-4)
    with pytest.raises(ExportCheckError, match=r"detections per image \[1\] differ from the reference's \[2\]"):
        check_detections_close("counts", two_kinds, _detections([0.5], boxes[:1], [0]), 1e-4, 1e-4)


def test_a_weight_read_at_other_call_counts_than_its_ranges_is_one_line(tmp_path):
    """One input range per call, in graph order: a Conv weight read twice takes its two ranges in that order, and a
    count that differs from the ranges' is refused naming both (the float graph does not match the QAT model)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from ppdlx.errors import UnsupportedError
    from ppdlx.export.onnx_qdq import insert_qdq
    weight = numpy_helper.from_array(np.ones([2, 2, 1, 1], np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"]), helper.make_node("Conv", ["y", "w"], ["z"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 2, 4, 4])], [weight])
    path = str(tmp_path / "shared.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)

    def scales(ranges):
        return {"w": {"layer": "head", "kind": "conv", "activation": ranges, "weight": np.ones(2, np.float32),
                      "weight_axis": 0}}
    with pytest.raises(UnsupportedError, match=r"^ONNX QDQ: w is read 2 times, its layer has input ranges for 3 "
                                               r"calls: the float graph does not match the QAT model$"):
        insert_qdq(path, scales([1.0, 2.0, 3.0]), str(tmp_path / "refused.onnx"))
    insert_qdq(path, scales([1.0, 2.0]), str(tmp_path / "qdq.onnx"))
    written = onnx.load(str(tmp_path / "qdq.onnx")).graph
    constants = {t.name: numpy_helper.to_array(t) for t in written.initializer}
    producer = {out: node for node in written.node for out in node.output}
    convs = [n for n in written.node if n.op_type == "Conv"]
    np.testing.assert_allclose([float(constants[producer[n.input[0]].input[1]]) for n in convs],
                               [1 / 127, 2 / 127], rtol=1e-6)
