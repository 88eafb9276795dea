"""Two-process collective data parallel on CPU (gloo) through paddle.distributed.launch."""
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import make_digits_tree

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def odd_tree(tmp_path_factory):
    # 3 classes x 23 digits -> 15 val images: an odd count exposes padded duplicates
    return make_digits_tree(tmp_path_factory.mktemp("odd") / "digits", per_class=23, classes=3)


def test_two_ranks_train_in_sync_and_count_every_val_image_once(odd_tree, tmp_path):
    out, report = tmp_path / "out", tmp_path / "report.json"
    common = [f"data.root={odd_tree}", "model.name=resnet18_bottleneck_tiny", "model.num_classes=3",
              "data.workers=0", "global.device=cpu"]
    proc = subprocess.run(
        [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir",
         str(tmp_path / "log"), os.path.join(ROOT, "tools", "train.py"), "-c",
         os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml"), "--report", str(report), "-o", *common,
         f"global.output_dir={out}", "data.batch_size=4", "train.epochs=2", "lr.base_lr=0.05",
         "lr.scale_with_batch=false"],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    logs = "".join(open(tmp_path / "log" / f).read() for f in os.listdir(tmp_path / "log")
                   if f.startswith("workerlog"))
    assert proc.returncode == 0, logs[-3000:]
    dist = json.loads(report.read_text())
    assert dist["images"] == 15
    assert "global (" in logs and "/device x 2)" in logs
    # The merged sharded evaluation equals a single-process evaluation of the saved weights.
    single = tmp_path / "single.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "eval.py"), "-c",
                           os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml"), "--report", str(single),
                           "-o", *common, f"model.weights={out}/latest"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    single_report = json.loads(single.read_text())
    assert single_report["images"] == 15
    assert abs(single_report["top1"] - dist["top1"]) < 1e-9
    assert abs(single_report["top5"] - dist["top5"]) < 1e-9
