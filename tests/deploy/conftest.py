"""Every deploy test keeps the measured decisions (``--backend auto``, ``--precision auto``) in its own
folder, never in the user's ``~/.cache/ppdlx_deploy``: a decision cached by one test (or by a user) must
not answer another's question. ``exports``: a tiny ResNet exported for the plan and backend tests."""
import pytest

from ppdlx.config import load_config
from ppdlx.export import export_model


@pytest.fixture(autouse=True)
def own_decision_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("PPDLX_DEPLOY_CACHE", str(tmp_path_factory.mktemp("ppdlx_deploy_cache")))


@pytest.fixture(scope="session")
def exports(tmp_path_factory):
    """A tiny ResNet (random weights, seed 7) exported twice with ONNX: legacy (.pdmodel) and PIR (.json)."""
    base = tmp_path_factory.mktemp("tiny_exports")
    dirs = {}
    for fmt in ("program", "pir"):
        cfg = load_config(None, ["model.name=resnet18_bottleneck_tiny", "model.num_classes=3",
                                 "data.transforms.crop_size=32", "data.transforms.resize_short=36",
                                 "data.root=/nonexistent", "global.seed=7"])
        dirs[fmt] = str(base / fmt)
        export_model(cfg, output_dir=dirs[fmt], onnx=True, fmt=fmt, check_batch_sizes=(1,))
    return dirs
