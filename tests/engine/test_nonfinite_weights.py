"""Weights that turn NaN/inf stop the run with one line and are never checkpointed, whatever the loss says
(with the fast CPU kernels the loss stayed finite over NaN weights), in every graph mode and for the EMA."""
import glob
import os
import re
import subprocess
import sys

import numpy as np
import paddle
import pytest

from ppdlx.config import load_config
from ppdlx.engine.hooks import Checkpoint
from ppdlx.engine.run import build_training
from ppdlx.engine.step import NonFiniteWeightsError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "tools", "train.py")
MESSAGE = re.compile(r"^error: weights became NaN/inf at epoch 1 step \d+: first non-finite is '[\w.]+' "
                     r"\(\d+ of \d+ tensors\); no checkpoint was written from them; lower lr\.base_lr or check "
                     r"the data$")


def overrides(tree, out, *extra):
    return [f"data.root={tree}", f"global.output_dir={out}", "model.name=resnet18_bottleneck_tiny",
            "model.num_classes=4", "data.batch_size=8", "data.workers=0", "train.epochs=2", *extra]


def nonfinite_files(out):
    """Every written model file (a checkpoint's ``model.pdparams``) holding a NaN/inf value."""
    return [path for path in glob.glob(os.path.join(out, "*", "model.pdparams"))
            if not all(np.isfinite(np.asarray(v)).all() for v in paddle.load(path, return_numpy=True).values())]


@pytest.mark.parametrize("graph", ["dynamic", "static"])
def test_exploding_lr_stops_with_one_line_and_saves_no_nan(tiny_tree, tmp_path, graph):
    out = tmp_path / graph
    # default fast CPU kernels (dynamic); the static program skips updates with a NaN loss, and its weights
    # still went NaN in epoch 1 while the loss was finite
    proc = subprocess.run([sys.executable, TRAIN, "-c", os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml"),
                           "-o", *overrides(tiny_tree, out, "lr.base_lr=1e6", f"train.graph={graph}")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 4, proc.stderr[-2000:]
    assert MESSAGE.match(last), last
    assert nonfinite_files(str(out)) == []
    assert not os.path.lexists(out / "best") and not os.path.lexists(out / "latest")


@pytest.mark.parametrize("graph", ["dynamic", "static"])
def test_a_nan_ema_shadow_is_never_saved(tiny_tree, tmp_path, graph):
    out = tmp_path / graph
    cfg = load_config(os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml"),
                      overrides(tiny_tree, out, "ema.enabled=true", "train.steps_per_epoch=1",
                                "data.backend=paddle", f"train.graph={graph}"))
    trainer = build_training(cfg)
    trainer.train_one_epoch()
    trainer.epoch = 1
    weights = trainer.step.weights()
    name = list(weights.model.state_dict())[3]
    shadow = weights.copies(name)["ema"]()  # shares the shadow's memory (a scope variable under static)
    paddle.assign(paddle.full_like(shadow, float("inf")), shadow)
    with pytest.raises(NonFiniteWeightsError) as err:
        trainer.find_hook(Checkpoint).save(improved=True)
    assert str(err.value).startswith(f"weights became NaN/inf at epoch 1 step 1: first non-finite is "
                                     f"'{name} (EMA shadow)' (1 of ")
    assert glob.glob(str(out / "*.pd*")) == []
