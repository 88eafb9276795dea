"""Detection accuracy targets of issue 7, through the real CLIs (tools/make_synthetic_coco.py,
tools/paddlelabel_to_coco.py, tools/train.py, tools/infer.py):

* overfitting the 4 labelled paddlelabel fruit photos reaches AP50 >= 0.8 (~2 min, in CI);
* the demo config on the synthetic shapes set reaches COCO AP >= 0.5 on its val split (measured
  0.596; ~17 min on 2 quiet cores, so opt in with PPDLX_ACCURACY_TESTS=1 to keep CI short).
"""
import json
import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(args, timeout=7200):
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    return proc


@pytest.mark.skipif(os.environ.get("PPDLX_ACCURACY_TESTS") != "1",
                    reason="~17 min CPU training run: set PPDLX_ACCURACY_TESTS=1")
def test_synthetic_demo_reaches_ap_05(tmp_path):
    data = tmp_path / "shapes"
    _run([os.path.join("tools", "make_synthetic_coco.py"), "--output", str(data)])
    start = time.perf_counter()
    _run([os.path.join("tools", "train.py"), "-c", os.path.join("configs", "demo", "efficientdet_demo.yaml"),
          "--report", str(tmp_path / "report.json"), "-o", f"data.root={data}",
          f"global.output_dir={tmp_path / 'out'}"])
    report = json.loads((tmp_path / "report.json").read_text())
    print(f"synthetic demo: AP {report['AP']:.4f} AP50 {report['AP50']:.4f} in "
          f"{(time.perf_counter() - start) / 60:.1f} min")
    assert report["images"] == 32
    assert report["AP"] >= 0.5, report


def test_fruit_photos_overfit_to_ap50_08(fruit_run, tmp_path):
    report = fruit_run["report"]
    print(f"fruit overfit: AP {report['AP']:.4f} AP50 {report['AP50']:.4f} in {fruit_run['seconds'] / 60:.1f} min")
    assert report["images"] == 4
    assert report["AP50"] >= 0.8, report
    # the infer tool draws the boxes of the trained model on a photo
    png = tmp_path / "det.png"
    data = fruit_run["data"]
    proc = _run([os.path.join("tools", "infer.py"), "-c", fruit_run["config"], "-o", f"data.root={data}",
                 f"model.weights={fruit_run['run'] / 'best'}", "--image", str(data / "images" / "4.jpeg"),
                 "--output", str(png)], timeout=600)
    assert png.stat().st_size > 10000 and "pear" in proc.stdout
