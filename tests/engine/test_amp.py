"""ppdlx.engine.amp.check_image_dtype: float16 training batches (``data.dali.output_dtype``) are
accepted only where a float16 AMP forward takes them; everywhere else one line says what to set."""
import os
import subprocess
import sys

import pytest

from ppdlx.config import load_config
from ppdlx.engine.amp import AmpPlan, check_image_dtype
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
