"""Foreign checkpoints through ``model.weights`` (``ppdlx.checkpoint.load_weights``): a PyTorch-format
file imported in memory into a model with another class count (``model.reset_head=auto``), and a converted
prefix refused as ``train.resume``."""
import os
import subprocess
import sys

import numpy as np

from ppdlx.checkpoint import convert_weights
from ppdlx.config import load_config
from ppdlx.weights import convert_state
from tests.engine.test_training import tiny_overrides
from tests.weights.test_convert import tiny_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml")


def train_cli(*overrides):
    return subprocess.run([sys.executable, os.path.join(ROOT, "tools", "train.py"), "-c", DEMO, "-o", *overrides],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)


def test_a_torchvision_file_loads_into_another_class_count_with_a_fresh_head(tiny_tree, tmp_path, ppdlx_caplog):
    from ppdlx.engine.run import build_training
    path, _ = tiny_file(tmp_path, num_classes=10)
    converted, _ = convert_state("torchvision", path, "resnet18_bottleneck_tiny")
    spec = f"torchvision:{path}"
    trainer = build_training(load_config(DEMO, tiny_overrides(tiny_tree, tmp_path / "run", f"model.weights={spec}")))
    state = {k: np.asarray(v) for k, v in trainer.step.model_state().items()}
    assert list(state["fc.weight"].shape) == [512, 4] and list(state["fc.bias"].shape) == [4]
    body = [k for k in converted if not k.startswith("fc.")]
    assert len(body) == len(state) - 2
    for key in body:
        np.testing.assert_array_equal(state[key], converted[key], err_msg=key)
    assert (f"model.weights={spec}: classifier re-initialised (fc.weight [512, 10] -> [512, 4], "
            f"fc.bias [10] -> [4]; model.reset_head=auto)") in ppdlx_caplog.messages
    assert f"loaded weights {spec} (2 parameters not in the file)" in ppdlx_caplog.messages

    # the CLI trains from the file as it is (layout detected), and model.reset_head=false keeps the error
    run = train_cli(*tiny_overrides(tiny_tree, tmp_path / "cli", "train.epochs=1", f"model.weights={path}"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "classifier re-initialised (fc.weight [512, 10] -> [512, 4]" in run.stdout
    refused = train_cli(*tiny_overrides(tiny_tree, tmp_path / "strict", "train.epochs=1", f"model.weights={path}",
                                        "model.reset_head=false"))
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1] == (
        f"error: model.weights={path}: parameter 'fc.weight' has shape [512, 10] in the file but [512, 4] in the "
        f"model (different model.name/num_classes?)")


def test_resuming_from_converted_weights_is_refused_in_one_line(tiny_tree, tmp_path):
    path, _ = tiny_file(tmp_path, num_classes=4)
    prefix = str(tmp_path / "converted" / "tv")
    convert_weights("torchvision", path, "resnet18_bottleneck_tiny", prefix)
    run = train_cli(*tiny_overrides(tiny_tree, tmp_path / "out", "train.epochs=1", f"train.resume={prefix}"))
    assert run.returncode == 2, run.stdout[-2000:]
    assert run.stderr.strip().splitlines()[-1] == (
        f"error: train.resume={prefix}: {prefix} holds weights converted from torchvision ({path}), not a training "
        f"checkpoint (no epoch, optimizer or RNG state); start from them with -o model.weights={prefix} and no "
        f"train.resume")
    assert not os.path.lexists(tmp_path / "out" / "latest")
