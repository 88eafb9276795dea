"""bf16 CPU training through ppdlx's oneDNN convolutions (ppdlx/models/cpu_bf16.py): the op computes
in bf16 where the CPU has bf16 hardware, a bf16 training's loss tracks float32's, evaluation stays
float32, and the plan says in one line why bf16 is or is not used."""
import json
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest

from ppdlx.config import load_config
from ppdlx.cpu_features import cpu_features, has_bf16
from ppdlx.engine.run import build_training
from ppdlx.errors import UnsupportedError
from ppdlx.layers import layer_config
from ppdlx.layers.cpu_kernels import kernel_counts
from ppdlx.models import build_model
from ppdlx.models.cpu_bf16 import MIN_GAIN, choose, plan_cpu_bf16

from tests.engine.test_training import tiny_overrides

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
needs_bf16 = pytest.mark.skipif(not has_bf16(cpu_features()), reason=(
    "this CPU has neither avx512_bf16 nor amx_bf16: bf16 convolutions would be emulated, and ppdlx trains in "
    "float32 there"))

BF16_PROBE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import paddle
from ppdlx.ops import onednn
paddle.seed(0)
x = paddle.randn([4, 12, 12, 32])  # NHWC
x.stop_gradient = False
w = paddle.randn([48, 32, 3, 3]) * 0.1
w.stop_gradient = False
ref = paddle.nn.functional.conv2d(x, w, padding=1, data_format="NHWC")
probe = paddle.randn(ref.shape)
ref_grads = paddle.grad(ref, [x, w], probe)
out = onednn.conv2d(x, w, 1, [1] * 4, 1, 1, True, True)
grads = paddle.grad(out, [x, w], probe)
rel = lambda a, b: float((a - b).abs().max() / b.abs().max())
print("RESULT " + json.dumps({"dtypes": [str(t.dtype) for t in (out, *grads)], "out": rel(out, ref),
                              "dx": rel(grads[0], ref_grads[0]), "dw": rel(grads[1], ref_grads[1])}))
"""


@needs_bf16
def test_bf16_convolution_runs_bf16_kernels_and_rounds_like_bf16():
    env = dict(os.environ, ONEDNN_VERBOSE="1")
    proc = subprocess.run([sys.executable, "-c", BF16_PROBE, ROOT], capture_output=True, text=True, timeout=600,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    convs = [line for line in proc.stdout.splitlines()
             if line.startswith("onednn_verbose") and ",exec,cpu,convolution," in line]
    assert len(convs) == 3, convs  # forward, backward data, backward weights
    assert all("bf16" in line.split(",")[6] for line in convs), convs  # oneDNN's bf16 kernels ran
    result = json.loads([line for line in proc.stdout.splitlines() if line.startswith("RESULT ")][-1][7:])
    assert result["dtypes"] == ["paddle.float32"] * 3  # float32 in and out: masters and other ops untouched
    for key in ("out", "dx", "dw"):  # bf16's 8-bit mantissa: visibly rounded, and no worse than that
        assert 1e-4 < result[key] < 2e-2, result


@needs_bf16
def test_a_bf16_trained_model_evaluates_in_float32():
    paddle.seed(3)
    plain = build_model("resnet18_bottleneck_tiny", num_classes=4, data_format="NHWC")  # Paddle's kernels
    with layer_config(cpu_kernels=True, bf16=True):
        bf16 = build_model("resnet18_bottleneck_tiny", num_classes=4, data_format="NHWC")
    bf16.set_state_dict(plain.state_dict())
    counts = kernel_counts(bf16)
    assert counts["bf16"] is True and counts["matmul"] == 0 and counts["paddle"] == 0 and counts["onednn"] > 0
    x = paddle.randn([2, 32, 32, 3])
    plain.eval()
    reference = plain(x)
    scale = float(reference.abs().max())
    bf16.eval()  # evaluation: float32 convolutions, equal to Paddle's up to float32 rounding
    assert float((bf16(x) - reference).abs().max()) < 1e-5 * scale
    bf16.train()
    for layer in bf16.sublayers():  # training-mode convolutions, evaluation-mode batch norms
        if isinstance(layer, paddle.nn.BatchNorm2D):
            layer.eval()
    assert float((bf16(x) - reference).abs().max()) > 1e-3 * scale  # training: bf16


def _fixed_batch_losses(root, out, steps, *extra):
    """The losses of ``steps`` optimizer steps of the tiny ResNet on one fixed batch (no data order,
    no augmentation: what differs between two runs is the arithmetic), and the run's plan."""
    cfg = load_config(None, tiny_overrides(root, out, "data.backend=synthetic", "model.num_classes=10",
                                           "lr.base_lr=0.05", "lr.warmup_epochs=0", "ema.enabled=false", *extra))
    paddle.seed(0)
    trainer = build_training(cfg)
    rng = np.random.default_rng(0)
    images = rng.standard_normal((8, 3, 32, 32)).astype("float32")
    if trainer.plan.data_format == "NHWC":
        images = images.transpose(0, 2, 3, 1)
    batch = (paddle.to_tensor(images), paddle.to_tensor(rng.integers(0, 10, 8)))
    losses = []
    for _ in range(steps):  # one optimizer step each, then the after-step hooks (the LR schedule)
        trainer.result = trainer.step.run(batch, True)
        losses.append(float(trainer.result.loss))
        trainer.global_step += 1
        trainer.call_hooks("after_step")
    return np.array(losses), trainer.plan


@needs_bf16
def test_bf16_training_loss_tracks_float32(tmp_path, ppdlx_caplog):
    """12 steps from the same weights on the same batch. Stated tolerance: every bf16 loss within 8 %
    of the float32 loss of the same step (measured: at most 5.6 % with bf16 activations between the
    tiny ResNet's layers, 4.2 % with bf16 convolutions only, while float32 through Paddle's kernels
    stays within 0.4 % of float32 through ppdlx's), and both fall below 40 % of the first."""
    with ppdlx_caplog.at_level("INFO", logger="ppdlx"):
        bf16, plan = _fixed_batch_losses(tmp_path, tmp_path / "bf16", 12, "amp.enabled=true",
                                         "amp.dtype=bfloat16", "amp.cpu_bf16=true")
    fp32, fp32_plan = _fixed_batch_losses(tmp_path, tmp_path / "fp32", 12, "amp.enabled=false")
    assert plan.amp.cpu_bf16_convs and plan.fast_cpu_kernels and not fp32_plan.amp.cpu_bf16_convs
    notes = [r.getMessage() for r in ppdlx_caplog.records if r.getMessage().startswith("amp: bfloat16 on CPU")]
    assert len(notes) == 1 and "amp.cpu_bf16=true" in notes[0]
    kernels = [r.getMessage() for r in ppdlx_caplog.records if "(bf16 while training)" in r.getMessage()]
    assert len(kernels) == 1 and kernels[0].endswith("; bf16 activations through 4 residual blocks"), kernels
    relative = np.abs(bf16 - fp32) / fp32
    assert relative[0] > 1e-4, relative  # bf16 arithmetic from the first step on
    assert relative.max() < 0.08, (bf16, fp32)
    for losses in (bf16, fp32):
        assert losses[-1] < 0.4 * losses[0], losses


def test_bf16_is_chosen_only_where_it_measured_clearly_faster():
    faster = choose({"float32": 100.0, "bfloat16": 100.0 / MIN_GAIN - 1, "measured": "then"})
    slower = choose({"float32": 100.0, "bfloat16": 95.0, "measured": "then"})
    assert faster[0] is True and "in bf16 vs 100.0 ms in float32" in faster[1]
    assert slower[0] is False and slower[1].endswith(f"less than {MIN_GAIN}x")


def test_where_bf16_cannot_run_the_plan_says_why_in_one_line():
    assert plan_cpu_bf16(False, 2, True) == (False, "amp.cpu_bf16=false")
    assert plan_cpu_bf16("auto", 2, False)[0] is False
    with pytest.raises(UnsupportedError) as err:
        plan_cpu_bf16(True, 2, False)
    assert str(err.value) == ("amp.cpu_bf16=true: global.cpu_fast_kernels is off (bf16 runs in its oneDNN "
                              "convolutions); set amp.cpu_bf16=auto or amp.enabled=false")
    if not has_bf16(cpu_features()):
        with pytest.raises(UnsupportedError, match="this CPU has neither avx512_bf16 nor amx_bf16"):
            plan_cpu_bf16(True, 2, True)
