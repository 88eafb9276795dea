"""The quantization-aware-training model (ppdlx.models.qat): fake quantization where NVIDIA's QAT program
has it, float checkpoints load into it, its activation ranges are running statistics, and the float graph of the
same weights is one context away."""
import collections
import copy

import numpy as np
import paddle
import pytest
from paddle.static.quantization.quanter import _quant_config_default, quant_aware

from ppdlx import dist
from ppdlx.checkpoint.files import check_and_set
from ppdlx.errors import UnsupportedError
from ppdlx.models import MODELS
from ppdlx.models.resnet import resnet_tiny
from ppdlx.models.qat import check_training, layer_scales, refresh_weight_scales, simulated_quantization, summary
from ppdlx.quantization import NVIDIA_QUANTIZED_OPS, quantize_model, without_quanters

TRACED = ("conv2d", "depthwise_conv2d", "matmul_v2", "elementwise_add")


def quantized_inputs(program):
    """Per op of ``TRACED`` types, in program order: the op type and the input slots fed by a (fake)
    quantize-dequantize op."""
    block = program.global_block()
    producers = {out: op.type for op in block.ops for out in op.output_arg_names}
    return [(op.type, tuple(sorted(slot for slot in op.input_names for name in op.input(slot)
                                   if "quantize" in producers.get(name, ""))))
            for op in block.ops if op.type in TRACED]


def training_program(build, nvidia: bool):
    """The legacy training program of ``build()``'s model: NVIDIA's (``quant_aware`` with fleet
    QATOptimizer's config: conv/mul/matmul inputs, channel_wise_abs_max weights) or ppdlx's (the QAT model)."""
    with paddle.pir_utils.OldIrGuard():
        paddle.enable_static()
        try:
            main, startup = paddle.static.Program(), paddle.static.Program()
            with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
                image = paddle.static.data("image", [None, 3, 32, 32], "float32")
                model = build()
                if not nvidia:
                    quantize_model(model)
                model.train()
                model(image)
            paddle.static.Executor(paddle.CPUPlace()).run(startup)
            if nvidia:
                config = copy.deepcopy(_quant_config_default)
                config.update(quantize_op_types=list(NVIDIA_QUANTIZED_OPS), weight_quantize_type="channel_wise_abs_max")
                main = quant_aware(main, paddle.CPUPlace(), config=config, return_program=True)
            return quantized_inputs(main)
        finally:
            paddle.disable_static()


def test_fake_quantization_sits_where_nvidias_quant_aware_puts_it():
    """NVIDIA's --qat (quant_aware through fleet's QATOptimizer) quantizes the activation and weight inputs of
    every convolution and matmul and the earlier input of each residual add; the ppdlx model traced into the same
    kind of program has fake quantize ops on exactly those inputs, op for op (the bias add of the classifier is
    left alone by both)."""
    nvidia = training_program(lambda: resnet_tiny(num_classes=10), nvidia=True)
    ours = training_program(lambda: resnet_tiny(num_classes=10), nvidia=False)
    assert ours == nvidia
    counts = collections.Counter(nvidia)
    assert counts[("conv2d", ("Filter", "Input"))] == 17 and counts[("matmul_v2", ("X", "Y"))] == 1
    assert counts[("elementwise_add", ("Y",))] == 4 and counts[("elementwise_add", ())] == 1


def test_float_checkpoint_loads_and_quanters_add_only_their_states():
    paddle.seed(0)
    float_model = resnet_tiny(num_classes=10)
    model = resnet_tiny(num_classes=10)
    assert quantize_model(model) == {"conv": 17, "linear": 1, "residual": 4, "call_sites": 0} == summary(model)
    missing = check_and_set(model, float_model.state_dict(), "float")
    assert missing and all("_quanter." in name or "residual_quant." in name for name in missing)
    assert not set(float_model.state_dict()) - set(model.state_dict())  # same keys for the float weights
    model.eval()
    x = paddle.to_tensor(np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype("float32"))
    float_model.eval()
    with without_quanters(model):  # the same weights in float: the float model's outputs exactly
        np.testing.assert_array_equal(model(x).numpy(), float_model(x).numpy())
    model.train()
    for layer in model.sublayers():
        if isinstance(layer, paddle.nn.BatchNorm2D):
            layer.eval()  # the float model's statistics stay
    for _ in range(40):  # the activation ranges follow the batches' abs max (moving average)
        model(x)
    model.eval()
    refresh_weight_scales(model)
    quantized, reference = model(x).numpy(), float_model(x).numpy()
    assert 0 < np.abs(quantized - reference).max() < 0.1 * np.abs(reference).max()


def test_activation_ranges_are_running_statistics_and_weight_scales_follow_the_weights():
    """Each rank's quanters average their own batches, so RankSync averages them with the BatchNorm statistics;
    the per-channel weight scales are the abs max of the current weights."""
    paddle.seed(0)
    model = resnet_tiny(num_classes=10)
    quantize_model(model)
    stats = dist.running_statistics(model)
    ranges = [name for name in stats if name.endswith(("._scale", "._state", "._accum")) and "weight" not in name]
    assert len(ranges) == 3 * 22  # 17 conv + 1 linear inputs + 4 residual inputs
    model.train()
    model(paddle.ones([4, 3, 32, 32]))
    scales = layer_scales(model)
    fc = scales[model.fc.weight.name]
    assert fc["kind"] == "linear" and fc["weight_axis"] == 1 and fc["activation"] > 0
    np.testing.assert_allclose(fc["weight"], np.abs(model.fc.weight.numpy()).max(axis=0), rtol=1e-6)
    assert sum(s["kind"] == "residual" for s in scales.values()) == 4


def test_every_gpunet_block_is_quantized_and_impossible_combinations_are_one_line():
    """The 7 GPUNets build the same blocks: none of GPUNet-0's convolutions or linear layers stays float."""
    paddle.seed(0)
    model = MODELS.build("gpunet_0", num_classes=10)
    assert quantize_model(model) == {"conv": 33, "linear": 1, "residual": 0, "call_sites": 0}
    assert not [m for m in model.sublayers() if type(m) in (paddle.nn.Conv2D, paddle.nn.Linear)]
    with pytest.raises(UnsupportedError, match="amp.level=O2"):
        check_training(True, True, "O2")
    check_training(True, True, "O1")


def test_simulated_quantization_computes_the_quanters_and_the_onnx_qdq_arithmetic():
    """The plain-op simulation a QAT detector's float program is traced from gives the fake quantize ops' output
    exactly, beyond the range both ways; its ONNX mode gives onnxruntime's QuantizeLinear -> DequantizeLinear with
    the scale the QDQ graph holds exactly (the export checks the QDQ graph against it: a quantized network carries
    the float ulp between the two to flipped steps downstream)."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper  # optional, as above
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Conv2D(2, 3, 1))
    quantize_model(model)
    model.train()
    model(paddle.randn([4, 2, 3, 3]))
    model.eval()
    x = paddle.to_tensor(np.linspace(-6, 6, 2 * 2 * 4 * 5, dtype="float32").reshape([2, 2, 4, 5]))
    quanter = model[0].activation_quanter
    assert float(np.abs(x.numpy()).max()) > 2 * float(quanter.scales().numpy()[0])  # beyond the range both ways
    with paddle.no_grad():
        expected = model(x).numpy()
        with simulated_quantization(model):
            np.testing.assert_array_equal(model(x).numpy(), expected)
        with simulated_quantization(model, onnx=True):
            onnx_semantics = model[0].activation_quanter(x).numpy()
        paddle_semantics = quanter(x).numpy()
    step = np.float32(float(quanter.scales().numpy()[0]) / 127)
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
         helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])],
        "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape))],
        [numpy_helper.from_array(np.array(step, np.float32), "s"), numpy_helper.from_array(np.array(0, np.int8), "z")])
    session = ort.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
                                   .SerializeToString(), providers=["CPUExecutionProvider"])
    onnxruntime_out = session.run(None, {"x": x.numpy()})[0]
    np.testing.assert_array_equal(onnx_semantics, onnxruntime_out)
    # both saturate at -128; the QAT model's own quanter lands a float ulp away from onnxruntime on some values
    assert paddle_semantics.min() == onnxruntime_out.min() < -float(quanter.scales().numpy()[0])
    np.testing.assert_allclose(paddle_semantics, onnxruntime_out, rtol=1e-6)
