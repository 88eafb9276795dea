"""The oneDNN ops (ppdlx/ops/onednn_kernels.cc) against Paddle's own kernels: convolution (outputs,
input and filter gradients, for every geometry the models use), training batch norm (+ ReLU) with
its running statistics, and max pooling; the convolution on every instruction-set path of oneDNN
this CPU can run."""
import json
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest

from ppdlx.cpu_features import cpu_features, onednn_runs_bf16
from ppdlx.layers import layer_config
from ppdlx.layers.cpu_kernels import kernel_counts
from ppdlx.models import MODELS
from ppdlx.models.resnet import Bottleneck
from ppdlx.layers import ConvNormAct as ConvBNAct
from ppdlx.ops import onednn

CASES = [  # in, out, kernel, stride, padding, groups, dilation
    (8, 16, 3, 1, 1, 1, 1),
    (8, 16, 1, 2, 0, 1, 1),
    (16, 16, 3, 2, 1, 16, 1),  # depthwise
    (6, 12, 5, 1, 2, 3, 2),  # grouped, dilated
    (3, 8, 7, 2, 3, 1, 1),  # ResNet stem
    (8, 8, 3, 2, "SAME", 8, 1),  # EfficientNet's depthwise "SAME"
    (4, 6, 3, 1, [1, 0, 2, 1], 1, 1),  # asymmetric [top, bottom, left, right]
]


@pytest.mark.parametrize("data_format", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_matches_paddle_conv2d_forward_and_backward(data_format, case):
    cin, cout, k, stride, padding, groups, dilation = case
    paddle.seed(0)
    shape = [2, cin, 11, 10] if data_format == "NCHW" else [2, 11, 10, cin]
    x = paddle.randn(shape)
    x.stop_gradient = False
    w = paddle.randn([cout, cin // groups, k, k])
    w.stop_gradient = False
    ref = paddle.nn.functional.conv2d(x, w, stride=stride, padding=padding, groups=groups, dilation=dilation,
                                      data_format=data_format)
    probe = paddle.randn(ref.shape)
    ref_grads = paddle.grad(ref, [x, w], probe)
    if isinstance(padding, int):
        padding = [padding] * 4
    out = onednn.conv2d(x, w, stride, padding, dilation, groups, data_format == "NHWC")
    grads = paddle.grad(out, [x, w], probe)
    assert out.shape == ref.shape
    assert float((out - ref).abs().max()) < 1e-4
    assert float((grads[0] - ref_grads[0]).abs().max()) < 1e-4
    assert float((grads[1] - ref_grads[1]).abs().max()) < 1e-3 * float(ref_grads[1].abs().max())


def test_network_input_gets_no_gradient_but_the_filter_does():
    x = paddle.randn([2, 3, 8, 8])  # stop_gradient: the op skips the input gradient
    w = paddle.randn([4, 3, 3, 3])
    w.stop_gradient = False
    out = onednn.conv2d(x, w, 1, [1] * 4, 1, 1, False)
    (grad_w,) = paddle.grad(out.sum(), [w])
    ref = paddle.nn.functional.conv2d(x, w, padding=1)
    (ref_grad_w,) = paddle.grad(ref.sum(), [w])
    assert x.grad is None and float((grad_w - ref_grad_w).abs().max()) < 1e-3


@pytest.mark.parametrize("data_format", ["NCHW", "NHWC"])
@pytest.mark.parametrize("fuse_relu", [False, True])
def test_batch_norm_matches_paddle_with_running_statistics(data_format, fuse_relu):
    paddle.seed(0)
    ref = paddle.nn.BatchNorm2D(6, momentum=0.9, epsilon=1e-5, data_format=data_format)
    with paddle.no_grad():
        ref.weight.set_value(paddle.randn([6]))
        ref.bias.set_value(paddle.randn([6]))
    mine = paddle.nn.BatchNorm2D(6, momentum=0.9, epsilon=1e-5, data_format=data_format)
    mine.set_state_dict(ref.state_dict())
    x = paddle.randn([4, 6, 5, 7] if data_format == "NCHW" else [4, 5, 7, 6]) * 3 + 1
    probe = paddle.randn(x.shape)
    results = []
    for layer, run in ((ref, lambda xi: paddle.nn.functional.relu(ref(xi)) if fuse_relu else ref(xi)),
                       (mine, lambda xi: onednn.batch_norm_train(xi, mine, fuse_relu, data_format == "NHWC"))):
        xi = x.clone()
        xi.stop_gradient = False
        y = run(xi)
        grads = paddle.grad(y, [xi, layer.weight, layer.bias], probe)
        results.append([y, *grads, layer._mean, layer._variance])
    names = ["y", "grad x", "grad scale", "grad shift", "running mean", "running variance"]
    for name, a, b in zip(names, *results):
        assert float((a - b).abs().max()) < 1e-4 * max(1.0, float(a.abs().max())), name
    assert float(results[1][4].abs().max()) > 0.05  # the running mean moved (momentum 0.9, mean ~1)
    if fuse_relu:
        assert float(results[1][0].min()) == 0.0


@pytest.mark.parametrize("data_format", ["NCHW", "NHWC"])
@pytest.mark.parametrize("kernel,stride,padding,size", [(3, 2, 1, (9, 8)), (2, 2, 0, (8, 8)), (3, 1, 1, (5, 7))])
def test_max_pool_matches_paddle(data_format, kernel, stride, padding, size):
    paddle.seed(0)
    x = paddle.randn([2, 5, *size] if data_format == "NCHW" else [2, *size, 5])
    x.stop_gradient = False
    ref = paddle.nn.functional.max_pool2d(x, kernel, stride, padding, data_format=data_format)
    probe = paddle.randn(ref.shape)
    (ref_grad,) = paddle.grad(ref, [x], probe)
    out = onednn.max_pool2d(x, kernel, stride, [padding] * 4, data_format == "NHWC")
    (grad,) = paddle.grad(out, [x], probe)
    assert out.shape == ref.shape
    assert float((out - ref).abs().max()) == 0.0 and float((grad - ref_grad).abs().max()) < 1e-5


@pytest.mark.parametrize("name,args", [("resnet18_bottleneck_tiny", {}),
                                       ("efficientnet_b0", {"dropout": 0.0, "drop_connect_rate": 0.0})])
def test_fast_kernels_keep_a_model_outputs_and_gradients(name, args):
    """A whole network with the fast kernels against Paddle's NHWC kernels, measured against the
    rounding noise between Paddle's own NCHW and NHWC kernels (BatchNorm over 4 samples on 1x1 maps
    amplifies rounding: EfficientNet's gradients differ by ~2e-3 between Paddle's two layouts)."""
    paddle.seed(0)
    models = {layout: MODELS.build(name, num_classes=5, data_format=layout.upper()[:4], **args)
              for layout in ("nchw", "nhwc")}
    with layer_config(cpu_kernels=True):  # the fast kernels are picked when the model is built
        models["nhwc_fast"] = MODELS.build(name, num_classes=5, data_format="NHWC", **args)
    for layout in ("nhwc", "nhwc_fast"):
        models[layout].set_state_dict(models["nchw"].state_dict())
    counts = kernel_counts(models["nhwc_fast"])
    convs = [l for l in models["nhwc_fast"].sublayers() if isinstance(l, paddle.nn.Conv2D)]
    assert counts["onednn"] > 0 and counts["paddle"] == 0 and counts["batch_norm"] > 0
    assert counts["onednn"] + counts["matmul"] == len(convs)
    assert counts["max_pool"] == sum(isinstance(l, paddle.nn.MaxPool2D) for l in models["nhwc_fast"].sublayers())
    assert counts["add_relu"] == sum(type(l) is Bottleneck for l in models["nhwc_fast"].sublayers())
    assert counts["add_relu"] > 0 or name.startswith("efficientnet")
    x = paddle.randn([4, 3, 32, 32])
    losses, grads = {}, {}
    for layout, model in models.items():
        model.train()
        loss = (model(x if layout == "nchw" else x.transpose([0, 2, 3, 1])) * paddle.arange(5, dtype="float32")).sum()
        loss.backward()
        losses[layout] = float(loss)
        grads[layout] = np.concatenate([p.grad.numpy().ravel() for p in model.parameters() if p.grad is not None])

    def rel(a, b):
        return np.linalg.norm(grads[a] - grads[b]) / np.linalg.norm(grads[a])

    assert grads["nhwc_fast"].size == grads["nhwc"].size
    assert abs(losses["nhwc_fast"] - losses["nhwc"]) <= 1e-4 * abs(losses["nhwc"])
    assert rel("nhwc", "nhwc_fast") <= max(3 * rel("nchw", "nhwc"), 1e-4)


def test_batch_norms_frozen_after_the_switch_keep_their_statistics():
    """A BN given fixed statistics after the fast kernels were applied (what
    detection.freeze_bn_max_pixels does) normalises with them and never updates them."""
    paddle.seed(0)
    with layer_config(cpu_kernels=True):
        block = ConvBNAct(3, 4, 3, act=None, data_format="NHWC")
    reference = ConvBNAct(3, 4, 3, act=None, data_format="NHWC")
    reference.set_state_dict(block.state_dict())
    assert kernel_counts(block)["batch_norm"] == 1
    for layer in (block, reference):
        layer.train()
        layer.bn._use_global_stats = True
    x = paddle.randn([4, 6, 6, 3]) * 2 + 3
    out, ref = block(x), reference(x)
    assert float((out - ref).abs().max()) < 1e-5
    assert float(block.bn._mean.abs().max()) == 0.0 and float((block.bn._variance - 1).abs().max()) == 0.0
    block.bn._use_global_stats = None  # and back to batch statistics: the running mean moves
    block(x)
    assert float(block.bn._mean.abs().max()) > 0.05


ISA_PROBE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import paddle
from ppdlx.ops import onednn
paddle.seed(0)
x = paddle.randn([2, 9, 10, 16])  # NHWC
x.stop_gradient = False
w = paddle.randn([24, 16, 3, 3])
w.stop_gradient = False
ref = paddle.nn.functional.conv2d(x, w, padding=1, data_format="NHWC")
probe = paddle.randn(ref.shape)
ref_grads = paddle.grad(ref, [x, w], probe)
out = onednn.conv2d(x, w, 1, [1] * 4, 1, 1, True)
grads = paddle.grad(out, [x, w], probe)
a, b = paddle.randn([2, 4, 4, 16]), paddle.randn([2, 4, 4, 16])
a.stop_gradient = b.stop_gradient = False
summed = paddle.nn.functional.relu(a + b)
summed_grads = paddle.grad(summed, [a, b], probe[:, :4, :4, :16])
fused = onednn.add_relu(a, b)
fused_grads = paddle.grad(fused, [a, b], probe[:, :4, :4, :16])
print("RESULT " + json.dumps({"out": float((out - ref).abs().max()),
                              "dx": float((grads[0] - ref_grads[0]).abs().max()),
                              "dw": float((grads[1] - ref_grads[1]).abs().max() / ref_grads[1].abs().max()),
                              "add_relu": max(float((u - v).abs().max()) for u, v in
                                              zip([fused, *fused_grads], [summed, *summed_grads]))}))
"""
# oneDNN picks its kernels by the CPU's instruction sets at run time; ONEDNN_MAX_CPU_ISA caps that
# choice, so every path this CPU can run is checked here, not only the one it would pick.
ISA_PATHS = {  # cap -> (flags the CPU needs, token in the kernel names, tokens that must not appear)
    "SSE41": ({"sse4_2"}, "sse41", ("avx",)),
    "AVX2": ({"avx2", "fma"}, "avx2", ("avx512",)),
    "AVX512_CORE": ({"avx512f", "avx512bw", "avx512vl"}, "avx512", ()),
}


@pytest.mark.parametrize("isa", list(ISA_PATHS))
def test_conv_and_add_relu_match_paddle_on_every_instruction_set_path(isa):
    needs, token, above = ISA_PATHS[isa]
    missing = needs - set(cpu_features()["flags"])
    if missing:
        pytest.skip(f"this CPU lacks {', '.join(sorted(missing))}: oneDNN's {isa} path cannot run here")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA=isa, ONEDNN_VERBOSE="1")
    proc = subprocess.run([sys.executable, "-c", ISA_PROBE, root], capture_output=True, text=True, timeout=600,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    kernels = [line.split(",")[6] for line in proc.stdout.splitlines()
               if line.startswith("onednn_verbose") and ",exec,cpu,convolution," in line]
    assert any(token in k for k in kernels), kernels  # the capped path really ran
    assert not any(t in k for k in kernels for t in above), kernels
    result = json.loads([line for line in proc.stdout.splitlines() if line.startswith("RESULT ")][-1][7:])
    assert result["out"] < 1e-4 and result["dx"] < 1e-4 and result["dw"] < 1e-3, result
    assert result["add_relu"] == 0.0, result  # add + ReLU is exact in float32 on every path


@pytest.mark.parametrize("shape", [[2, 5, 6, 7], [2, 4, 4, 16]])  # the op views whole rows of 64 as 2-D
def test_add_relu_matches_paddle_forward_and_backward(shape):
    paddle.seed(0)
    a, b = paddle.randn(shape), paddle.randn(shape)
    for t in (a, b):
        t.stop_gradient = False
    probe = paddle.randn(a.shape)
    reference = paddle.nn.functional.relu(a + b)
    ref_grads = paddle.grad(reference, [a, b], probe)
    out = onednn.add_relu(a, b)
    grads = paddle.grad(out, [a, b], probe)
    assert float((out - reference).abs().max()) == 0.0
    assert float((out == 0).astype("float32").mean()) > 0.3  # the ReLU mask is exercised
    for grad, ref in zip(grads, ref_grads):
        assert grad.dtype == paddle.float32 and float((grad - ref).abs().max()) == 0.0


BF16_OPS = pytest.mark.skipif(not onednn_runs_bf16(cpu_features()), reason=(
    "oneDNN has no bfloat16 primitives below AVX-512 (avx512_core): this CPU, or ONEDNN_MAX_CPU_ISA, gives it "
    "only " + (" ".join(cpu_features()["flags"]) or "no vector flags")))


@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=BF16_OPS)])
@pytest.mark.parametrize("shape", [[2, 5, 6, 7], [2, 4, 4, 16]])
def test_fork_shares_the_input_and_sums_gradients_like_paddle(shape, dtype):
    paddle.seed(0)
    x = paddle.randn(shape)
    x.stop_gradient = False
    a_probe, b_probe = paddle.randn(shape).astype(dtype), paddle.randn(shape).astype(dtype)
    x_typed = x.astype(dtype)  # a non-leaf of the tested type: the gradient reaches x through a cast
    # Paddle's own sum of the two uses' gradients, in the tested type (for bf16: its one-thread loop)
    reference = paddle.grad([x_typed * 1, x_typed * 1], [x_typed], [a_probe, b_probe])[0]
    a, b = onednn.fork(x_typed)
    assert a.data_ptr() == b.data_ptr() == x_typed.data_ptr()  # no copy in the forward
    assert a.dtype == b.dtype == x_typed.dtype and a.shape == b.shape == shape
    grad = paddle.grad([a * 1, b * 1], [x_typed], [a_probe, b_probe])[0]
    assert grad.dtype == reference.dtype
    assert float((grad.astype("float32") - reference.astype("float32")).abs().max()) == 0.0
    assert float(reference.astype("float32").abs().max()) > 1.0  # not a vacuous zero gradient


def test_fork_passes_one_gradient_through_when_only_one_use_has_one():
    x = paddle.randn([2, 4, 4, 16])
    x.stop_gradient = False
    for used in (0, 1):
        outputs = onednn.fork(x)
        grad = paddle.grad([outputs[used] * 3.0], [x])[0]
        assert float((grad - 3.0).abs().max()) == 0.0


BF16_WITHOUT_PRIMITIVES = r"""
import sys
sys.path.insert(0, sys.argv[1])
import paddle
from ppdlx.ops import onednn
x = paddle.randn([2, 4, 4, 16]).astype("bfloat16")
x.stop_gradient = False
a, b = onednn.fork(x)
try:
    paddle.grad([a * 1, b * 1], [x])
except Exception as error:  # what a training step would raise to the tools' one-line handler
    print("RAISED " + type(error).__name__ + ": " + str(error).splitlines()[0])
"""


def test_an_op_oneDNN_cannot_run_raises_instead_of_killing_the_process():
    """Under ONEDNN_MAX_CPU_ISA=AVX2 oneDNN has no bf16 binary primitive: the fork's backward used to let
    oneDNN's exception leave through Paddle's autograd node, and std::terminate aborted the process."""
    if not {"avx2", "fma"} <= set(cpu_features()["hardware_flags"]):
        pytest.skip("this CPU has no avx2: oneDNN's AVX2 cap cannot be shown here")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2")
    proc = subprocess.run([sys.executable, "-c", BF16_WITHOUT_PRIMITIVES, root], capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("RAISED ")]
    assert "ppdlx onednn fork (backward): oneDNN cannot run it in bfloat16 on this CPU" in line, line
    assert "its instruction set here: avx2; bfloat16 needs avx512_core or newer" in line, line
