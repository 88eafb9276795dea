"""ppdlx.engine.amp.check_image_dtype: float16 training batches (``data.dali.output_dtype``) are
accepted only where a float16 AMP forward takes them; everywhere else one line says what to set.
A resume's loss scaler: the checkpoint's progress, the config's settings."""
import os
import subprocess
import sys

import numpy as np
import pytest

from ppdlx.config import load_config
from ppdlx.engine.amp import AmpPlan, check_image_dtype, check_numpy_for_loss_scaler
from ppdlx.errors import ConfigError, UnsupportedError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "tools", "train.py")
FP16_O1 = AmpPlan(True, "float16", "O1", True)
FP32 = AmpPlan(False, "float32", "O0", False)


def _data(*overrides):
    return load_config(None, ["data.backend=dali", *overrides]).data


def test_float16_images_feed_a_float16_autocast_forward_only():
    check_image_dtype(_data("data.dali.output_dtype=float16"), FP16_O1, "dynamic")
    check_image_dtype(_data("data.dali.output_dtype=float16"), AmpPlan(True, "float16", "O2", True), "to_static")
    check_image_dtype(_data("data.dali.output_dtype=float32"), FP32, "static")
    check_image_dtype(_data("data.backend=paddle", "data.dali.output_dtype=float16"), FP32, "dynamic")  # not DALI
    with pytest.raises(ConfigError) as err:
        check_image_dtype(_data("data.dali.output_dtype=float16"), FP32, "dynamic")
    assert str(err.value) == ("data.dali.output_dtype=float16: this run's forward is float32, and float16 images "
                              "would meet its weights in the first convolution; set amp.enabled=true "
                              "amp.dtype=float16 (GPU) or data.dali.output_dtype=float32")
    with pytest.raises(ConfigError, match="forward is bfloat16 autocast, "):
        check_image_dtype(_data("data.dali.output_dtype=float16"), AmpPlan(True, "bfloat16", "O1", False), "dynamic")
    with pytest.raises(ConfigError, match="forward is float32 with bfloat16 convolutions, "):
        check_image_dtype(_data("data.dali.output_dtype=float16"),
                          AmpPlan(False, "bfloat16", "O1", False, cpu_bf16_convs=True), "dynamic")
    with pytest.raises(UnsupportedError, match="train.graph=static: the static program's images input is float32"):
        check_image_dtype(_data("data.dali.output_dtype=float16"), FP16_O1, "static")
    with pytest.raises(ConfigError, match="the coco DALI pipeline yields float32 images"):
        check_image_dtype(_data("data.dataset=coco", "data.dali.output_dtype=float16"), FP16_O1, "dynamic")


def test_training_with_float16_images_on_cpu_stops_in_one_line_before_any_step(tiny_tree, tmp_path):
    pytest.importorskip("nvidia.dali")
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, TRAIN, "-c", os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml"),
                           "-o", f"data.root={tiny_tree}", "model.name=resnet18_bottleneck_tiny", "model.num_classes=4",
                           "amp.enabled=false", "data.dali.output_dtype=float16", f"global.output_dir={out}"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: data.dali.output_dtype=float16: this run's forward is float32, and float16 images would meet its "
        "weights in the first convolution; set amp.enabled=true amp.dtype=float16 (GPU) or "
        "data.dali.output_dtype=float32")
    assert "Traceback" not in proc.stderr
    assert not any(name.endswith((".pdparams", ".pdopt")) for _, _, files in os.walk(out) for name in files)


def test_the_loss_scalers_overflow_message_works_with_the_installed_numpy():
    """Paddle's GradScaler._update prints float(self._scale) when it lowers the scale after an overflow
    step; the scale is paddle.to_tensor(np.array([init]).astype(np.float32)), a 1-element 1-d tensor, and
    NumPy 2.4 refuses float() of it (TypeError), so every fp16 run stopped at its first overflow. The
    scaler enables itself on GPU places only, so its expression is run here on the same tensor."""
    import numpy as np
    import paddle
    scale = paddle.to_tensor(np.array([1024.0]).astype(np.float32))
    assert float(scale) == 1024.0
    check_numpy_for_loss_scaler(np.__version__)
    with pytest.raises(UnsupportedError) as err:
        check_numpy_for_loss_scaler("2.4.6")
    assert str(err.value) == (f"amp: numpy 2.4.6 makes Paddle {paddle.__version__}'s loss scaler fail at the first "
                              f"overflow step (float() of its 1-element scale); pip install 'numpy<2.4'")
    check_numpy_for_loss_scaler("2.3.5")


def test_o2_clips_by_a_float32_global_norm():
    """O2 gradients are fp16 and Paddle's GPU squared_l2_norm keeps the input dtype, so a clip's sum of
    squares overflowed above a gradient norm of 256 and zeroed the update; decorate_o2 turns on Paddle's
    float32 norm (CPU has no fp16 squared_l2_norm kernel, so the arithmetic itself cannot run here)."""
    import paddle
    from paddle.nn import clip
    from ppdlx.engine.amp import decorate_o2
    before = clip._clip_by_global_norm_using_mp_type(False)
    try:
        model = paddle.nn.Linear(4, 3)
        opt = paddle.optimizer.Momentum(parameters=model.parameters(), grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0))
        decorate_o2(FP16_O1, model, opt)
        assert clip._clip_by_global_norm_using_mp_type() is False
        decorate_o2(AmpPlan(True, "float16", "O2", True), model, opt)
        assert clip._clip_by_global_norm_using_mp_type() is True
    finally:
        clip._clip_by_global_norm_using_mp_type(before)



def test_amp_on_a_gpu_too_old_for_its_dtype_is_refused():
    """Paddle's auto_cast and decorate warn and leave the model float32 below compute capability 7.0
    (float16) and 8.0 or CUDA 11 (bfloat16), while the run's plan, log and plan.yaml said AMP."""
    from ppdlx.engine.amp import check_gpu_amp
    check_gpu_amp("float16", "Tesla V100-SXM2-16GB", (7, 0), "12.6")
    check_gpu_amp("bfloat16", "NVIDIA A100-SXM4-80GB", (8, 0), "12.6")
    check_gpu_amp("bfloat16", "NVIDIA A10", (8, 6), "11.8")
    refusals = {}
    for dtype, name, capability, cuda in [("bfloat16", "Tesla V100-SXM2-16GB", (7, 0), "12.6"),
                                          ("float16", "Tesla P100-PCIE-16GB", (6, 0), "12.6"),
                                          ("bfloat16", "NVIDIA A100-SXM4-80GB", (8, 0), "False")]:
        with pytest.raises(UnsupportedError) as err:
            check_gpu_amp(dtype, name, capability, cuda)
        refusals[name, cuda] = str(err.value)
    assert refusals["Tesla V100-SXM2-16GB", "12.6"] == (
        "amp.dtype=bfloat16 needs an NVIDIA GPU of compute capability 8.0 or newer and CUDA 11 or newer, and Paddle "
        "trains in float32 on the others: Tesla V100-SXM2-16GB is 7.0 (CUDA 12.6); use amp.dtype=float16")
    assert refusals["Tesla P100-PCIE-16GB", "12.6"].endswith("Tesla P100-PCIE-16GB is 6.0 (CUDA 12.6); "
                                                             "use amp.enabled=false")
    assert "(CUDA False); use amp.dtype=float16" in refusals["NVIDIA A100-SXM4-80GB", "False"]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_autocast_runs_every_convolution_of_efficientdet_in_low_precision(dtype):
    """Paddle's O1 lists (float16 and bfloat16) name conv2d but not depthwise_conv2d, which 48 of
    EfficientDet-D0's 150 convolutions trace (groups == channels): with their float32 filters they ran in
    float32 under O1."""
    import paddle

    from ppdlx.engine.amp import autocast
    from ppdlx.models.efficientdet import efficientdet_d0
    model = efficientdet_d0(num_classes=3, image_size=128)
    traced = [layer._op_type for layer in model.sublayers() if isinstance(layer, paddle.nn.Conv2D)]
    assert (len(traced), traced.count("depthwise_conv2d")) == (150, 48)
    for level in ("O1", "O2"):
        with autocast(AmpPlan(True, dtype, level, dtype == "float16")):  # the tracer's lists are set on CPU too
            white, _ = paddle.base.framework._dygraph_tracer()._get_amp_op_list()
        assert set(traced) <= set(white), (level, sorted(set(traced) - set(white)))


def test_a_resume_takes_the_loss_scalers_progress_and_keeps_the_configs_settings():
    """Paddle's GradScaler.load_state_dict takes every setting from the checkpoint, so a resumed dynamic
    run ignored a changed amp.incr_every_n_steps (the static program keeps the config's)."""
    from ppdlx.engine.amp import resumed_scaler_state
    config = {"scale": np.array([65536.0]), "incr_ratio": 2.0, "decr_ratio": 0.5, "incr_every_n_steps": 1000,
              "decr_every_n_nan_or_inf": 2, "incr_count": 0, "decr_count": 0, "use_dynamic_loss_scaling": True}
    saved = {"scale": np.array([512.0]), "incr_ratio": 2.0, "decr_ratio": 0.5, "incr_every_n_steps": 2000,
             "decr_every_n_nan_or_inf": 1, "incr_count": 17, "decr_count": 1, "use_dynamic_loss_scaling": False}
    state = resumed_scaler_state(config, saved)
    assert float(state["scale"][0]) == 512.0 and (state["incr_count"], state["decr_count"]) == (17, 1)
    assert (state["incr_every_n_steps"], state["decr_every_n_nan_or_inf"], state["use_dynamic_loss_scaling"]) == \
        (1000, 2, True)
