"""Static-graph data parallel on CPU: two ranks through paddle.distributed.launch (gloo).

Gradients are all-reduced inside the PIR program (fleet.init(is_collective=True) + all_reduce
ops); the result must be the dynamic trainer's DataParallel result.
"""
import json
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest

from tests.conftest import make_digits_tree

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml")


@pytest.fixture(scope="module")
def odd_tree(tmp_path_factory):
    return make_digits_tree(tmp_path_factory.mktemp("odd_static") / "digits", per_class=23, classes=3)


def launch(tree, tmp_path, graph):
    out = tmp_path / graph
    proc = subprocess.run(
        [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir",
         str(out / "log"), os.path.join(ROOT, "tools", "train.py"), "-c", DEMO, "--report", str(out / "report.json"),
         "-o", f"data.root={tree}", "model.name=resnet18_bottleneck_tiny", "model.num_classes=3", "data.workers=0",
         "global.device=cpu", "amp.enabled=false", f"global.output_dir={out}", "data.batch_size=4",
         "train.epochs=2", "lr.base_lr=0.05", "lr.scale_with_batch=false", f"train.graph={graph}",
         "global.cpu_fast_kernels=false"],  # same CPU kernels in both graph modes
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    logs = "".join(open(out / "log" / f).read() for f in os.listdir(out / "log") if f.startswith("workerlog"))
    assert proc.returncode == 0, logs[-3000:]
    return out, logs


def test_two_static_ranks_match_dynamic_data_parallel(odd_tree, tmp_path):
    static_out, logs = launch(odd_tree, tmp_path, "static")
    assert "graph static (PIR)" in logs and "/device x 2)" in logs
    dynamic_out, _ = launch(odd_tree, tmp_path, "dynamic")
    a = paddle.load(str(static_out / "latest" / "model.pdparams"))
    b = paddle.load(str(dynamic_out / "latest" / "model.pdparams"))
    assert a.keys() == b.keys()
    assert max(float(np.abs(np.asarray(a[k]) - np.asarray(b[k])).max()) for k in a) < 1e-5
    rs, rd = (json.loads((o / "report.json").read_text()) for o in (static_out, dynamic_out))
    assert rs["images"] == rd["images"] == 15 and rs["top1"] == rd["top1"]


def test_static_ranks_name_a_parameter_that_differs(odd_tree, tmp_path):
    """The end-of-epoch agreement check was a no-op for the static step."""
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir", str(tmp_path / "log"),
         os.path.join(ROOT, "tests", "engine", "static_sync_worker.py"), str(out), DEMO, "-o", f"data.root={odd_tree}",
         "model.name=resnet18_bottleneck_tiny", "model.num_classes=3", "data.workers=0", "global.device=cpu",
         "amp.enabled=false", f"global.output_dir={tmp_path / 'run'}", "data.batch_size=4", "train.graph=static",
         "global.cpu_fast_kernels=false"],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    logs = "".join(open(tmp_path / "log" / f).read() for f in os.listdir(tmp_path / "log") if f.startswith("workerlog"))
    assert proc.returncode == 0, logs[-3000:]
    said = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for rank in said:
        assert rank["start"] == "agree"
        assert rank["moved"].startswith(f"data-parallel ranks hold different weights after one rank moved (e.g. "
                                        f"parameter '{rank['parameter']}', 1 of ")
