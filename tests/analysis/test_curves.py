"""curves.png and tools/plot.py from the metrics.jsonl of two real (tiny) training runs that differ in lr."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from ppdlx.analysis import plot_curves, read_metrics, write_run_figures
from ppdlx.analysis.curves import fractional_epochs, run_labels

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml")
PLOT = os.path.join(ROOT, "tools", "plot.py")


def train_tiny(tree, out, lr):
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "train.py"), "-c", CONFIG, "-o", f"data.root={tree}",
         f"global.output_dir={out}", "global.device=cpu", "global.log_interval=1", "global.cpu_fast_kernels=false",
         "model.name=resnet18_bottleneck_tiny", "model.num_classes=4", "data.batch_size=8", "data.workers=0",
         "data.backend=paddle", "train.epochs=2", "train.steps_per_epoch=2", f"lr.base_lr={lr}",
         "amp.enabled=false"], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return str(out)


@pytest.fixture(scope="module")
def runs(tiny_tree, tmp_path_factory):
    base = tmp_path_factory.mktemp("runs")
    return train_tiny(tiny_tree, base / "lr_high", 0.1), train_tiny(tiny_tree, base / "lr_low", 0.05)


def test_metrics_are_read_per_step_and_epoch(runs, tmp_path):
    metrics = read_metrics(os.path.join(runs[0], "metrics.jsonl"))
    train, evals = metrics["train"], metrics["eval"]
    assert [(r["epoch"], r["step"]) for r in train] == [(1, 1), (1, 2), (2, 3), (2, 4)]
    np.testing.assert_allclose(fractional_epochs(train), [0.5, 1.0, 1.5, 2.0])
    assert [r["epoch"] for r in evals] == [1, 2]
    assert all(0.0 <= r["top1"] <= 1.0 and r["top5"] >= r["top1"] for r in evals)
    # a resumed run appends: the later line for a step wins; a torn last line is ignored
    copy = tmp_path / "resumed"
    copy.mkdir()
    shutil.copyfile(os.path.join(runs[0], "metrics.jsonl"), copy / "metrics.jsonl")
    again = dict(train[-1], loss=123.0)
    with open(copy / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(again) + "\n" + '{"kind": "train", "step": 5, "epo')
    resumed = read_metrics(str(copy / "metrics.jsonl"))["train"]
    assert [r["step"] for r in resumed] == [1, 2, 3, 4] and resumed[-1]["loss"] == 123.0


def test_two_runs_overlay_with_config_legend(runs, tmp_path):
    pytest.importorskip("matplotlib")
    assert run_labels(runs) == ["lr_high: lr.base_lr=0.1", "lr_low: lr.base_lr=0.05"]
    result = plot_curves(runs, str(tmp_path / "curves.png"))
    assert list(result["panels"]) == ["train loss", "val loss", "learning rate", "val top1", "val top5",
                                      "throughput (img/s, all devices)"]
    for title, labels in result["panels"].items():
        assert labels == ["lr_high: lr.base_lr=0.1", "lr_low: lr.base_lr=0.05"], title
    with Image.open(tmp_path / "curves.png") as img:
        assert img.size == (1500, 900)
        assert np.asarray(img.convert("L"), np.float32).var() > 100.0


def test_plot_tool_and_run_end_figure(runs, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "both.png"
    proc = subprocess.run([sys.executable, PLOT, *runs, "--out", str(out)], capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[:6] == ["train loss: 2 curves", "val loss: 2 curves", "learning rate: 2 curves",
                                            "val top1: 2 curves", "val top5: 2 curves",
                                            "throughput (img/s, all devices): 2 curves"]
    with Image.open(out) as img:
        assert img.size == (1500, 900)
    assert write_run_figures(runs[1]) == [os.path.join(runs[1], "curves.png")]
    with Image.open(os.path.join(runs[1], "curves.png")) as img:
        assert img.size == (1500, 900) and np.asarray(img.convert("L"), np.float32).var() > 100.0
    proc = subprocess.run([sys.executable, PLOT, str(tmp_path)], capture_output=True, text=True, timeout=600,
                          cwd=ROOT)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: {tmp_path}: no metrics.jsonl")


@pytest.mark.parametrize("content, described", [(b"", "empty"), (bytes(range(256)) * 4, "1024 bytes, binary"),
                                                (b'{"kind": "train"}\nnot json\n', "27 bytes")])
def test_plot_of_a_metrics_file_without_records_is_one_line(tmp_path, content, described):
    # Before: an empty file ended in "ValueError: number sections must be larger than 0" (matplotlib's legend), a
    # binary one in a UnicodeDecodeError traceback.
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_bytes(content)
    proc = subprocess.run([sys.executable, PLOT, str(run)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: {run / 'metrics.jsonl'}: no metrics record in it ({described}, no line a JSON object with a 'step'); "
        f"give a run directory whose training logged a step")
