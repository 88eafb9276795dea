"""tools/quantize.py refuses an output directory it cannot create in one line, before exporting or calibrating."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("option", ["--output-dir", "--fp32-dir"])
def test_unwritable_output_is_one_line_before_the_export(tmp_path, option):
    calib = tmp_path / "calib"
    calib.mkdir()
    (calib / "a.jpg").write_bytes(b"not decoded before the output check")
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a directory\n")
    outputs = {"--output-dir": str(tmp_path / "int8"), "--fp32-dir": str(tmp_path / "fp32")}
    outputs[option] = str(blocker / "out")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "quantize.py"), "-c",
                           os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml"), "-o",
                           "model.name=resnet18_bottleneck_tiny", "model.weights=/nonexistent/never_read",
                           "--calib-images", str(calib), "--output-dir", outputs["--output-dir"], "--fp32-dir",
                           outputs["--fp32-dir"]], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: {option} {blocker}/out: cannot create it (Not a directory: {blocker}/out); choose a directory that "
        f"can be written")
