"""bf16 activations between a ResNet's layers (ppdlx/models/resnet_bf16.py): the same
training arithmetic as bf16 convolutions on float32 tensors up to bf16 rounding, bf16 tensors
between the ops, float32 weights and gradients, and the model's own float32 forward wherever a
batch norm must not train."""
import types

import numpy as np
import paddle
import pytest

from ppdlx.cpu_features import cpu_features, has_bf16
from ppdlx.layers import layer_config
from ppdlx.layers.cpu_kernels import kernel_counts
from ppdlx.models import build_model
from ppdlx.models import resnet_bf16 as cpu_bf16_activations
from ppdlx.models.resnet import ResNet

pytestmark = pytest.mark.skipif(not has_bf16(cpu_features()), reason=(
    "this CPU has neither avx512_bf16 nor amx_bf16: ppdlx trains in float32 there, and oneDNN's bf16 "
    "kernels may not exist for it"))


def _models(count, num_classes=6, bf16_kernels=0):
    """``count`` tiny NHWC ResNets with the same weights; the first ``bf16_kernels`` of them built to train on
    the bf16 oneDNN kernels, the others on Paddle's."""
    paddle.seed(5)
    models = []
    for k in range(count):
        with layer_config(cpu_kernels=k < bf16_kernels, bf16=k < bf16_kernels):
            models.append(build_model("resnet18_bottleneck_tiny", num_classes=num_classes, data_format="NHWC"))
    for model in models[1:]:
        model.set_state_dict(models[0].state_dict())
    return models


def _pair():
    """Two tiny ResNets with the same weights on bf16 kernels: with and without bf16 activations."""
    models = _models(2, bf16_kernels=2)
    counts = [kernel_counts(m) for m in models]
    models[1].bf16_activations = False  # the float32 forward: bf16 convolutions on float32 tensors
    return models, counts


def _batch(size=64):
    rng = np.random.default_rng(0)
    return (paddle.to_tensor(rng.standard_normal((8, size, size, 3)).astype("float32")),
            paddle.to_tensor(rng.integers(0, 6, 8)))


def _step(model, x, labels):
    model.train()
    loss = paddle.nn.functional.cross_entropy(model(x), labels)
    loss.backward()
    return float(loss), [p.grad.numpy() for p in model.parameters() if p.grad is not None]


def _relative_errors(grads, reference):
    return [float(np.linalg.norm(g - r) / np.linalg.norm(r)) for g, r in zip(grads, reference)]


def test_the_float32_wiring_of_the_block_ops_equals_paddles_kernels():
    """The same ops and wiring in float32 (conv -> batch norm + ReLU -> ... -> add + ReLU): what is
    computed, and every gradient, equals Paddle's float32 training of the model."""
    ours, reference = _models(2, bf16_kernels=1)  # ours: every conv through the oneDNN op, the pool too
    ours.train()

    def features(self, x):
        x = cpu_bf16_activations.conv_norm(self.stem, x, bf16=False)
        x = self.pool(x)
        for stage in self.stages:
            for block in stage:
                x = cpu_bf16_activations.bottleneck(block, x, bf16=False)
        return x
    ours.forward_features = types.MethodType(features, ours)
    x, labels = _batch()
    loss, grads = _step(ours, x, labels)
    ref_loss, ref_grads = _step(reference, x, labels)
    assert len(grads) == len(ref_grads) > 20
    assert abs(loss - ref_loss) < 1e-5 * ref_loss
    assert max(_relative_errors(grads, ref_grads)) < 1e-3


def test_bf16_activations_train_like_bf16_convolutions_on_float32_tensors():
    """Against float32 (Paddle's kernels), the gradients of a step with bf16 activations are about as
    far off as those of bf16 convolutions on float32 tensors: bf16 rounds every activation once more,
    nothing else changes. (One step of a freshly initialised tiny ResNet whose batch norms see few
    values: bf16's 8-bit mantissa moves its gradients by 20-35 % in norm either way.)"""
    (fast, plain), counts = _pair()
    (reference,) = _models(1)
    assert counts[0]["bf16_activation_blocks"] == 4 and cpu_bf16_activations.applies(fast)
    x, labels = _batch()
    loss, grads = _step(fast, x, labels)
    plain_loss, plain_grads = _step(plain, x, labels)
    ref_loss, ref_grads = _step(reference, x, labels)
    assert abs(loss - ref_loss) < 0.02 * ref_loss and abs(plain_loss - ref_loss) < 0.02 * ref_loss
    assert all(p.grad.dtype == paddle.float32 for p in fast.parameters() if p.grad is not None)
    fast_errors, plain_errors = _relative_errors(grads, ref_grads), _relative_errors(plain_grads, ref_grads)
    assert len(fast_errors) == len(plain_errors) > 20
    assert 1e-3 < np.median(fast_errors) < min(0.5, 1.5 * np.median(plain_errors)), (fast_errors, plain_errors)
    for fast_bn, ref_bn in zip(fast.sublayers(), reference.sublayers()):  # running statistics updated alike
        if isinstance(fast_bn, paddle.nn.BatchNorm2D):
            np.testing.assert_allclose(fast_bn._mean.numpy(), ref_bn._mean.numpy(), rtol=0.05, atol=0.02)


def test_activations_between_the_layers_are_bf16():
    (fast, _), _ = _pair()
    fast.train()
    x = paddle.randn([2, 32, 32, 3])
    stem = cpu_bf16_activations.conv_norm(fast.stem, x)
    block = cpu_bf16_activations.bottleneck(fast.stages[0][0], stem)
    assert stem.dtype == block.dtype == paddle.bfloat16
    assert fast.forward_features(x).dtype == paddle.float32  # the head and loss see float32


@pytest.mark.parametrize("how", ["eval", "frozen batch norm"])
def test_evaluation_and_fixed_statistics_take_the_float32_forward(how):
    (fast, _), _ = _pair()
    fast.train()
    if how == "eval":
        fast.eval()
    else:
        fast.stages[1][0].conv2.bn._use_global_stats = True
    x = paddle.randn([2, 32, 32, 3])
    with paddle.no_grad():
        before = [bn._mean.numpy().copy() for bn in fast.sublayers() if isinstance(bn, paddle.nn.BatchNorm2D)]
        ours, reference = fast.forward_features(x), ResNet.forward_features_float32(fast, x)
    assert ours.dtype == paddle.float32 and float((ours - reference).abs().max()) == 0.0
    if how == "eval":
        after = [bn._mean.numpy() for bn in fast.sublayers() if isinstance(bn, paddle.nn.BatchNorm2D)]
        assert all(np.array_equal(a, b) for a, b in zip(before, after))  # eval updates no statistics


def test_other_models_keep_float32_tensors():
    paddle.seed(0)
    with layer_config(cpu_kernels=True, bf16=True):
        model = build_model("gpunet_0", num_classes=4, data_format="NHWC")
    assert kernel_counts(model)["bf16_activation_blocks"] == 0
    assert not cpu_bf16_activations.applies(model)
