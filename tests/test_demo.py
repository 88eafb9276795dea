"""The README's main job: ResNet50 on the embedded digits demo reaches >= 90 % val top-1."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_demo_training_reaches_90_percent_top1(demo_run):
    report = demo_run["report"]
    assert report["images"] == 359          # the fixed val split, every image counted once
    assert report["top1"] >= 0.90, report
    assert report["epochs"] == 7
    for name in ("latest", "best", "epoch_7"):
        assert os.path.isfile(os.path.join(demo_run["output_dir"], name, "model.pdparams"))
    assert os.path.isfile(os.path.join(demo_run["output_dir"], "config.yaml"))


def test_eval_tool_reproduces_the_demo_top1(demo_run, tmp_path):
    out = tmp_path / "eval.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "eval.py"), "-c", demo_run["config"],
                           "--report", str(out), "-o", f"model.weights={demo_run['output_dir']}/latest",
                           f"data.root={demo_run['data_root']}"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert set(report) == {"top1", "top5", "images", "seconds"}
    assert abs(report["top1"] - demo_run["report"]["top1"]) < 1e-9
