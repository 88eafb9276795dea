"""tools/infer.py on a detector: boxes printed and drawn on the image even when the model predicts them
far outside it, and an unreadable image is one line."""
import os
import subprocess
import sys

import pytest
from PIL import Image

from tests.analysis.test_wiring import save_far_box_detector

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INFER = os.path.join(ROOT, "tools", "infer.py")
DET_DEMO = os.path.join(ROOT, "configs", "demo", "efficientdet_demo.yaml")


@pytest.fixture(scope="module")
def far_box_detector(tmp_path_factory):
    return save_far_box_detector(tmp_path_factory.mktemp("infer_far_boxes"))


def run_infer(det, *args):
    return subprocess.run([sys.executable, INFER, "-c", DET_DEMO, "-o", *det["base"], f"model.weights={det['weights']}",
                           *map(str, args)], capture_output=True, text=True, timeout=900, cwd=ROOT)


def test_far_boxes_are_printed_and_drawn_on_the_image(far_box_detector, tmp_path):
    """The model's boxes (~1e12 px across) come out clipped to the image: the post-processing clips to the
    64 px input (its padding included) and the detector to the image itself."""
    image = os.path.join(far_box_detector["root"], "val", "val_00001.jpg")  # 59 x 67
    with Image.open(image) as im:
        width, height = im.size
    assert width != height  # the padding lies beyond the shorter side
    out = tmp_path / "boxes.png"
    proc = run_infer(far_box_detector, "--image", image, "--output", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    count = int(lines[-1].split()[0])
    assert count >= 1 and lines[-1] == f"{count} boxes with score >= 0.3 -> {out}"
    # boxes of the anchors' other shapes and levels overlap too little for NMS: each is the whole image now
    assert [line.split() for line in lines[-1 - count:-1]] == [
        ["circle", "0.953", "0.0", "0.0", f"{width:.1f}", f"{height:.1f}"]] * count
    with Image.open(out) as drawn:
        assert drawn.size == (width, height)


def test_an_unreadable_image_is_one_line(far_box_detector, tmp_path):
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"this is not a JPEG\n")
    proc = run_infer(far_box_detector, "--image", bad)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (f"error: {bad}: cannot read image (cannot identify image file "
                                                    f"'{bad}')")
