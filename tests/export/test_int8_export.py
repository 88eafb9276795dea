"""The int8 export of a quantization-aware-trained classifier (tools/export_model.py on a ``qat.enabled`` config):
one legacy program with the quantize ops and scales Paddle-TRT's explicit-int8 converters and Paddle Inference's
oneDNN int8 read, an ONNX QDQ graph that onnxruntime runs with the same top-1, the deploy predictor's
``--precision int8``, and a 2:4-pruned model's pattern kept in its int8 weights, Paddle and ONNX.

A tiny ResNet trained with QAT for a few epochs on the demo digits (359 val images) stands in for the demo
ResNet50: the same layers, seconds instead of minutes."""
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest
import yaml

from ppdlx.export import find_model_files
from ppdlx.export.onnx_export import ExportCheckError, check_close
from ppdlx.export.onnx_qdq import quantized_check
from ppdlx.quantization import ONEDNN_INT8_OPS
from ppdlx.sparsity import check_path, raise_on_violation
from ppdlx.sparsity.rules import SparsityRules

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml")
DEPLOY = os.path.join(ROOT, "deploy", "python")


def tool(name, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "tools", name), *args], capture_output=True, text=True,
                          timeout=1200, cwd=ROOT)


def tiny_qat(tree, out, *extra):
    return [f"data.root={tree}", f"global.output_dir={out}", "global.device=cpu", "model.name=resnet18_bottleneck_tiny",
            "data.backend=paddle", "data.workers=0", "amp.enabled=false", "qat.enabled=true", "train.epochs=3",
            "train.steps_per_epoch=20", "eval.interval=3", "lr.base_lr=0.4", "lr.warmup_epochs=0",
            "model.args.zero_init_last_bn=false", *extra]


@pytest.fixture(scope="module")
def qat_export(demo_data, tmp_path_factory):
    """A tiny ResNet trained with QAT from scratch (60 steps), pruned 2:4 and fine-tuned with QAT (20 steps), then
    exported with --onnx."""
    base = tmp_path_factory.mktemp("qat_export")
    proc = tool("train.py", "-c", CONFIG, "-o", *tiny_qat(demo_data, base / "dense"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = base / "asp"
    proc = tool("prune_asp.py", "-c", CONFIG, "-o", *tiny_qat(demo_data, run, f"model.weights={base}/dense/latest",
                                                             "train.epochs=1", "eval.interval=1", "lr.base_lr=0.05"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = tool("export_model.py", "-c", CONFIG, "-o", *tiny_qat(demo_data, run, f"model.weights={run}/latest"),
                "--output-dir", str(base / "int8"), "--onnx")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"dir": str(base / "int8"), "dense_checkpoint": str(base / "dense" / "latest")}


@pytest.fixture(scope="module")
def demo_data():
    tree = os.path.join(ROOT, "data", "demo", "digits")
    if not os.path.isdir(os.path.join(tree, "val")):
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "prepare_demo_data.py")], check=True, cwd=ROOT,
                       capture_output=True)
    return tree


def test_int8_program_holds_what_paddle_trt_explicit_int8_reads(qat_export):
    """Paddle-TRT's converters (paddle/fluid/inference/tensorrt/convert/quantize_linear_op.cc and
    dequantize_linear_op.cc) take a quantize_linear / dequantize_linear op's ``Scale`` from a persistable float32
    tensor in the scope, divide it by 127 into the Q/DQ layer's scale and set its axis from the int ``quant_axis``
    attribute when >= 0: so every activation range is one positive float (axis -1), every weight an int8 tensor
    whose dequantize op carries one positive range per output channel (axis 0 for a convolution's [out, in, kh, kw],
    1 for a matmul's [in, out]), 8 bits. The same ops are what quant_dequant_onednn_pass reads on CPU."""
    with open(os.path.join(qat_export["dir"], "inference.yml"), encoding="utf-8") as f:
        meta = yaml.safe_load(f)
    assert meta["precision"] == "int8" and meta["model"]["format"] == "program"
    q = meta["quantization"]
    assert q["method"] == "qat" and q["onednn_int8_ops"] == list(ONEDNN_INT8_OPS)
    assert q["quantized_layers"] == {"conv": 17, "linear": 1, "residual": 4, "call_sites": 0}
    assert q["program"]["ops_with_quantized_inputs"] == {"conv2d": 17, "matmul_v2": 1, "elementwise_add": 4}
    assert q["onnx"]["int8_weights"] == q["program"]["int8_weights"] == 18
    with paddle.pir_utils.OldIrGuard():
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope):
            program, _, _ = paddle.static.load_inference_model(os.path.join(qat_export["dir"], "inference"),
                                                               paddle.static.Executor(paddle.CPUPlace()))
            block = program.global_block()
            producers = {out: op for op in block.ops for out in op.output_arg_names}
            checked = 0
            for op in block.ops:
                if op.type not in ("conv2d", "matmul_v2"):
                    continue
                act_slot, weight_slot = ("Input", "Filter") if op.type == "conv2d" else ("X", "Y")
                act, weight = producers[op.input(act_slot)[0]], producers[op.input(weight_slot)[0]]
                assert act.type == weight.type == "dequantize_linear"
                quantize = producers[act.input("X")[0]]
                assert quantize.type == "quantize_linear" and quantize.input("Scale") == act.input("Scale")
                act_scale = scope.find_var(act.input("Scale")[0]).get_tensor()
                assert block.var(act.input("Scale")[0]).persistable and np.array(act_scale).dtype == np.float32
                assert np.array(act_scale).size == 1 and float(np.array(act_scale).ravel()[0]) > 0
                assert act.attr("quant_axis") == quantize.attr("quant_axis") == -1
                w = np.array(scope.find_var(weight.input("X")[0]).get_tensor())
                w_scale = np.array(scope.find_var(weight.input("Scale")[0]).get_tensor()).ravel()
                axis = 0 if op.type == "conv2d" else 1
                assert block.var(weight.input("X")[0]).persistable and w.dtype == np.int8
                assert weight.attr("quant_axis") == axis and w_scale.size == w.shape[axis] and (w_scale > 0).all()
                assert np.abs(w.astype(np.int32)).max() == 127 and w_scale.dtype == np.float32
                assert weight.attr("bit_length") == act.attr("bit_length") == 8
                checked += 1
    assert checked == 18


def _top1(export_dir, backend, precision, images):
    sys.path.insert(0, DEPLOY)
    try:
        import ppdlx_deploy as D
    finally:
        sys.path.remove(DEPLOY)
    pipeline = D.Pipeline.open(export_dir, backend, precision, threads=2)
    return np.array([top[0][1] for _, top in pipeline.predict(images, topk=1)])  # (index, name, score)


def test_onnx_qdq_runs_in_onnxruntime_with_the_paddle_int8_top1(qat_export, demo_data):
    """On the 359 val digits: the Paddle int8 program through oneDNN int8 and the ONNX QDQ graph through
    onnxruntime (its int8 fusions on) predict the same class for nearly every image, and their accuracies differ
    by under a point."""
    import onnx
    graph = onnx.load(os.path.join(qat_export["dir"], "inference.onnx")).graph
    ops = [n.op_type for n in graph.node]
    assert ops.count("QuantizeLinear") == 22 and ops.count("DequantizeLinear") == 40
    classes = sorted(os.listdir(os.path.join(demo_data, "val")))
    images, labels = [], []
    for label, name in enumerate(classes):
        for file in sorted(os.listdir(os.path.join(demo_data, "val", name))):
            images.append(os.path.join(demo_data, "val", name, file))
            labels.append(name)
    labels = np.array(labels)
    paddle_int8 = _top1(qat_export["dir"], "paddle-cpu", "int8", images)
    onnx_int8 = _top1(qat_export["dir"], "onnxruntime", "int8", images)
    acc_paddle, acc_onnx = (paddle_int8 == labels).mean(), (onnx_int8 == labels).mean()
    assert acc_paddle > 0.5, acc_paddle  # a trained model, or agreement would mean little
    assert abs(acc_paddle - acc_onnx) <= 0.01 and (paddle_int8 == onnx_int8).mean() >= 0.95, (acc_paddle, acc_onnx)


def test_2_4_pattern_survives_qat_into_the_int8_weights(qat_export):
    """An ASP-pruned checkpoint fine-tuned with QAT: the int8 weights of the Paddle program and of the ONNX QDQ
    graph hold the 2:4 pattern (what TensorRT's sparse int8 kernels need); the dense checkpoint it was pruned
    from does not."""
    result = check_path(os.path.join(qat_export["dir"], "inference.onnx"), SparsityRules(n=2, m=4))
    raise_on_violation(result)
    assert result["checked"] == 16, result  # every conv but the stem (3 input channels); the classifier stays dense
    proc = tool("prune_asp.py", "--check", qat_export["dir"])  # the .pdmodel: the tool re-runs under legacy IR
    assert proc.returncode == 0 and "16 weights checked, 0 violating" in proc.stdout, proc.stdout[-2000:]
    proc = tool("prune_asp.py", "--check", qat_export["dense_checkpoint"])
    assert proc.returncode == 1 and "violates the 2:4 pattern" in proc.stderr, proc.stderr[-2000:]
    assert find_model_files(qat_export["dir"]).format == "program"


def test_the_qdq_check_refuses_a_quantize_dequantize_pair_whose_scales_disagree(qat_export):
    """The export's random-input check of the QDQ graph (quantized_check) passes the graph the export wrote and
    refuses the same graph with one DequantizeLinear's scale doubled (its QuantizeLinear's kept)."""
    import onnx  # optional (ppdlx[onnx]), as in the test above
    import onnxruntime
    from onnx import numpy_helper
    model = onnx.load(os.path.join(qat_export["dir"], "inference.onnx"))
    feed = model.graph.input[0]
    x = np.random.default_rng(0).standard_normal([2, 3, 32, 32]).astype("float32")

    def run(graph_model):
        options = onnxruntime.SessionOptions()
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = onnxruntime.InferenceSession(graph_model.SerializeToString(), options,
                                               providers=["CPUExecutionProvider"])
        return session.run(None, {feed.name: x})

    written = run(model)
    first_quantize = next(n for n in model.graph.node if n.op_type == "QuantizeLinear")
    dequantize = next(n for n in model.graph.node
                      if n.op_type == "DequantizeLinear" and n.input[0] == first_quantize.output[0])
    scale = next(t for t in model.graph.initializer if t.name == dequantize.input[1])
    model.graph.initializer.append(numpy_helper.from_array(numpy_helper.to_array(scale) * 2, scale.name + ".x2"))
    dequantize.input[1] = scale.name + ".x2"
    check = quantized_check(check_close)
    assert check("same graph", written, run(onnx.load(os.path.join(qat_export["dir"], "inference.onnx"))),
                 1e-4, 0.0) == 0.0
    with pytest.raises(ExportCheckError, match="exceeds the tolerance"):
        check("scales disagree", written, run(model), 1e-4, 0.0)
