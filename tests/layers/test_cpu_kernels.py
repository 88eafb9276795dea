"""ppdlx's CPU training kernels, picked when a model is built under ``layer_config(cpu_kernels=True)``
(ppdlx/layers/conv.py, norm_act.py, cpu_kernels.py): 1x1 convolutions as matmuls (same outputs and gradients as
Paddle's conv kernel, only where that holds: plain NHWC 1x1 convs), the oneDNN BatchNorm of every model family,
and freed memory kept for the next step."""
import json
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest

from ppdlx.layers import BatchNormAct2D, Conv2D, layer_config
from ppdlx.layers.conv import is_plain_1x1
from ppdlx.layers.cpu_kernels import kernel_counts
from ppdlx.models import MODELS


@pytest.mark.parametrize("stride,bias", [(1, False), (2, False), (2, True)])
def test_matmul_1x1_matches_conv_forward_and_backward(stride, bias):
    paddle.seed(0)
    conv = Conv2D(16, 24, 1, stride=stride, data_format="NHWC", bias_attr=None if bias else False)
    x = paddle.randn([3, 9, 7, 16])
    outs, grads = [], []
    for patch in (False, True):
        if patch:  # the matmul kernel itself, at any stride (training picks it for stride 1 only)
            assert is_plain_1x1(conv) and conv.cpu_kernel is None
            conv.cpu_kernel = "matmul"
        xi = x.clone()
        xi.stop_gradient = False
        y = conv(xi)
        (y * paddle.arange(y.size, dtype="float32").reshape(y.shape) / y.size).sum().backward()
        outs.append(y.numpy())
        grads.append((xi.grad.numpy(), conv.weight.grad.numpy()))
        conv.clear_gradients()
    assert outs[0].shape == outs[1].shape == (3, (9 + stride - 1) // stride, (7 + stride - 1) // stride, 24)
    assert np.abs(outs[0] - outs[1]).max() < 1e-5
    assert np.abs(grads[0][0] - grads[1][0]).max() < 1e-5 and np.abs(grads[0][1] - grads[1][1]).max() < 1e-4


def test_only_plain_nhwc_1x1_convs_are_replaced():
    with layer_config(cpu_kernels=True):
        nchw = MODELS.build("resnet18_bottleneck_tiny", num_classes=4, data_format="NCHW")
        nhwc = MODELS.build("resnet18_bottleneck_tiny", num_classes=4, data_format="NHWC")
        grouped = Conv2D(8, 8, 1, groups=2, data_format="NHWC")
    assert kernel_counts(nchw)["matmul"] == 0
    convs = [l for l in nhwc.sublayers() if isinstance(l, paddle.nn.Conv2D)]
    ones = [l for l in convs if list(l.weight.shape[2:]) == [1, 1] and l._stride in (1, [1, 1], (1, 1))]
    assert 0 < kernel_counts(nhwc)["matmul"] == len(ones) < len(convs)
    assert all((l.cpu_kernel == "matmul") == (l in ones) for l in convs)
    assert grouped.cpu_kernel == "onednn"


@pytest.mark.parametrize("name,args", [("gpunet_0", {"dropout": 0.0, "drop_path_rate": 0.0}),
                                       ("gpunet_d1", {"dropout": 0.0}),
                                       ("efficientdet_d0", {"image_size": 64})])
def test_fast_kernels_fuse_the_batch_norms_of_every_family(name, args):
    """Every BatchNorm followed by ReLU or by nothing trains through oneDNN, whichever family built it
    (GPUNet's reference-named blocks, EfficientDet's BiFPN); those followed by swish keep Paddle's. A
    train step then matches Paddle's NHWC kernels within the rounding noise between Paddle's own NCHW
    and NHWC kernels: outputs, gradients and the updated running statistics."""
    paddle.seed(0)
    models = {layout: MODELS.build(name, data_format=layout.upper()[:4], **args) for layout in ("nchw", "nhwc")}
    with layer_config(cpu_kernels=True):
        models["nhwc_fast"] = MODELS.build(name, data_format="NHWC", **args)
    for layout in ("nhwc", "nhwc_fast"):
        models[layout].set_state_dict(models["nchw"].state_dict())
    norms = [layer for layer in models["nhwc_fast"].sublayers() if type(layer) is BatchNormAct2D]
    fusable = [layer for layer in norms if type(layer.act) in (paddle.nn.ReLU, paddle.nn.Identity)]
    assert kernel_counts(models["nhwc_fast"])["batch_norm"] == len(fusable) > 0
    assert all((layer.cpu_kernel == "onednn") == (layer in fusable) for layer in norms)
    x = paddle.randn([4, 3, 64, 64])
    outs, grads, stats = {}, {}, {}
    for layout, model in models.items():
        model.train()
        out = model(x if layout == "nchw" else x.transpose([0, 2, 3, 1]))
        out = [out] if isinstance(out, paddle.Tensor) else [t for level in out for t in level]
        if layout == "nchw" and out[0].ndim == 4:
            out = [t.transpose([0, 2, 3, 1]) for t in out]
        sum((t * paddle.linspace(-1, 1, t.shape[-1])).sum() for t in out).backward()
        outs[layout] = np.concatenate([t.numpy().ravel() for t in out])
        grads[layout] = np.concatenate([p.grad.numpy().ravel() for p in model.parameters() if p.grad is not None])
        stats[layout] = np.concatenate([v.numpy().ravel() for k, v in model.state_dict().items()
                                        if k.endswith(("._mean", "._variance"))])

    def max_diff(values, a, b):
        return np.abs(values[a] - values[b]).max()

    def rel(a, b):
        return np.linalg.norm(grads[a] - grads[b]) / np.linalg.norm(grads[a])

    assert grads["nhwc_fast"].size == grads["nhwc"].size and stats["nhwc_fast"].size == stats["nhwc"].size
    assert max_diff(outs, "nhwc", "nhwc_fast") <= max(2 * max_diff(outs, "nchw", "nhwc"),
                                                      1e-5 * np.abs(outs["nhwc"]).max())
    assert max_diff(stats, "nhwc", "nhwc_fast") <= max(2 * max_diff(stats, "nchw", "nhwc"), 1e-6)
    assert rel("nhwc", "nhwc_fast") <= max(3 * rel("nchw", "nhwc"), 1e-4)


FREED_MEMORY = r"""
import json, resource, sys
sys.path.insert(0, sys.argv[1])
import paddle
from ppdlx.cpu_env import keep_freed_memory
if sys.argv[2] == "fast":  # what a training with the fast CPU kernels sets up (ppdlx.engine.run)
    keep_freed_memory()
faults = []
for _ in range(16):  # what training steps do: large activations allocated, written and freed
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    tensors = [paddle.full([16, 56, 56, 256], 1.0) for _ in range(3)]  # 51 MB each
    del tensors
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps(faults))
"""


def test_fast_kernels_keep_freed_activations_mapped():
    """By default glibc maps large blocks per allocation and unmaps them when freed, so every step
    page-faults its activations in afresh (the kernel zeroing each page). With the fast CPU kernels
    later steps reuse the memory of the ones before (once the heap has grown, within a few steps):
    no new page faults."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    faults = {}
    for mode in ("plain", "fast"):
        proc = subprocess.run([sys.executable, "-c", FREED_MEMORY, root, mode], capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        faults[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    pages = 3 * 16 * 56 * 56 * 256 * 4 // 4096
    assert min(faults["plain"][8:]) > pages // 2, faults  # Paddle's default: mapped again every time
    # the heap grows over the first few steps (small allocations in between fragment it; a few
    # times the steps' working set here), then stops: the second half faults no page in again
    assert sum(faults["fast"][8:]) < pages // 50, faults
    assert sum(faults["fast"]) < 6 * pages, faults
