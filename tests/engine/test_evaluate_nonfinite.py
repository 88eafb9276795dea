"""tools/eval.py (ppdlx.engine.run.evaluate) refuses weights holding NaN or inf with export's one line and exit code,
instead of scoring the NaN predictions as an accuracy (it reported top-1 0.1 with exit 0)."""
import os
import subprocess
import sys

import paddle
import pytest

from ppdlx.config import load_config
from ppdlx.models.from_config import build_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EVAL = os.path.join(ROOT, "tools", "eval.py")
MODEL = ["model.name=resnet18_bottleneck_tiny", "model.num_classes=4"]
BAD_TENSOR = "stages.1.0.conv2.conv.weight"


@pytest.mark.parametrize("value,kind", [(float("nan"), "NaN"), (float("inf"), "inf")])
def test_eval_of_nonfinite_weights_is_one_line_and_exit_4(tiny_tree, tmp_path, value, kind):
    paddle.seed(3)
    state = build_model(load_config(None, MODEL)).state_dict()
    state[BAD_TENSOR] = paddle.full_like(state[BAD_TENSOR], value)
    prefix = str(tmp_path / "diverged")
    paddle.save(state, prefix + ".pdparams")
    proc = subprocess.run([sys.executable, EVAL, "-c", os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml"),
                           "-o", *MODEL, f"data.root={tiny_tree}", "data.workers=0", f"model.weights={prefix}",
                           f"global.output_dir={tmp_path / 'out'}"], capture_output=True, text=True, timeout=600,
                          cwd=ROOT)
    assert proc.returncode == 4, proc.stderr[-2000:]
    assert "eval:" not in proc.stdout  # no accuracy printed
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: model.weights={prefix}: '{BAD_TENSOR}' holds {kind} (non-finite tensors: 1 of 87); these weights "
        f"predict NaN/inf, so any accuracy measured from them is meaningless: evaluate a checkpoint saved before the "
        f"run diverged (an earlier epoch_N) or retrain with a lower lr.base_lr")
