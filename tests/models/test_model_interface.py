"""One interface for every model: ``forward_features`` / ``forward_head`` / ``reset_classifier`` /
``default_cfg`` (timm's names), and ``default_cfg`` agrees with the shipped training recipes."""
import os

import numpy as np
import paddle
import pytest

from ppdlx.config import load_config
from ppdlx.errors import ConfigError
from ppdlx.models import MODELS
from ppdlx.models.model_cfg import IMAGENET_MEAN, IMAGENET_STD
from ppdlx.tasks.preprocess import eval_transforms_changes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAMES = sorted(set(MODELS.names()) - {"gpunet_json"})

# name: (task, input size, crop_pct, interpolation, classifier layer); mean/std are ImageNet's unless in MEAN_STD
DEFAULT_CFG = {
    "resnet50": ("classification", 224, 0.875, "bilinear", "fc"),
    "resnet18_bottleneck_tiny": ("classification", 224, 0.875, "bilinear", "fc"),
    "efficientnet_b0": ("classification", 224, 0.875, "bicubic", "fc"),
    "efficientnet_lite0": ("classification", 224, 0.875, "bicubic", "fc"),
    "gpunet_0": ("classification", 320, 1.0, "bicubic", "network.14.net.6"),
    "gpunet_1": ("classification", 288, 1.0, "bicubic", "network.16.net.6"),
    "gpunet_2": ("classification", 384, 1.0, "bicubic", "network.34.net.6"),
    "gpunet_p0": ("classification", 224, 0.875, "bicubic", "network.16.net.6"),
    "gpunet_p1": ("classification", 224, 0.875, "bicubic", "network.17.net.6"),
    "gpunet_d1": ("classification", 456, 1.0, "bicubic", "network.24.net.8"),
    "gpunet_d2": ("classification", 528, 1.0, "bicubic", "network.27.net.8"),
    "efficientdet_d0": ("detection", 512, 1.0, "bilinear", "class_net.predict.pointwise"),
}
# TF's EfficientNet-Lite weights are trained on (pixel - 127) / 128
MEAN_STD = {"efficientnet_lite0": ((127.0, 127.0, 127.0), (128.0, 128.0, 128.0))}
# The recipe each model's default_cfg must agree with (configs/base/rn50_imagenet.yaml is resnet50's).
RECIPES = {"resnet50": "configs/base/rn50_imagenet.yaml", "efficientdet_d0": "configs/efficientdet_d0.yaml",
           **{name: f"configs/gpunet/{name}.yaml" for name in NAMES if name.startswith("gpunet_")}}


def _build(name, **kwargs):
    if name == "efficientdet_d0":
        kwargs.setdefault("image_size", 64)
    paddle.seed(0)
    return MODELS.build(name, **kwargs)


def _outputs(out):
    return [out] if isinstance(out, paddle.Tensor) else [t for part in out for t in part]


def test_every_model_has_an_expected_default_cfg():
    assert sorted(DEFAULT_CFG) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_default_cfg(name):
    task, size, crop_pct, interpolation, classifier = DEFAULT_CFG[name]
    cfg = MODELS.build(name).default_cfg
    assert cfg["task"] == task and cfg["input_size"] == (3, size, size)
    assert cfg["crop_pct"] == crop_pct and cfg["interpolation"] == interpolation
    assert IMAGENET_MEAN == (123.675, 116.28, 103.53) and IMAGENET_STD == (58.395, 57.12, 57.375)
    assert (cfg["mean"], cfg["std"]) == MEAN_STD.get(name, (IMAGENET_MEAN, IMAGENET_STD))
    assert cfg["classifier"] == classifier
    if task == "detection":
        assert (cfg["preprocess"], cfg["pad_value"]) == ("resize_long_pad", 0.0)
        assert MODELS.build(name, image_size=256).default_cfg["input_size"] == (3, 256, 256)
    else:
        assert cfg["preprocess"] == "resize_short_center_crop"


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_default_cfg_is_what_the_training_recipe_uses(name):
    from ppdlx.tasks.preprocess import resolve_preprocessing
    cfg = resolve_preprocessing(load_config(os.path.join(ROOT, RECIPES[name])))  # what training reads
    assert cfg.model.name == name
    default, t = MODELS.build(name).default_cfg, cfg.data.transforms
    size = cfg.data.coco.image_size if default["task"] == "detection" else t.crop_size
    assert default["input_size"] == (3, size, size)
    assert tuple(t.mean) == default["mean"] and tuple(t.std) == default["std"]
    assert t.interpolation == default["interpolation"]
    if default["task"] == "classification":
        assert t.resize_short == int(np.floor(t.crop_size / default["crop_pct"] + 1e-6))


@pytest.mark.parametrize("name", ["efficientnet_lite0", "gpunet_0"])
def test_eval_transforms_from_default_cfg(name):
    default = MODELS.build(name).default_cfg
    t = load_config(None).replace(eval_transforms_changes(default)).data.transforms
    size = default["input_size"][1]
    assert (t.crop_size, t.interpolation, tuple(t.mean), tuple(t.std)) == (size, "bicubic", default["mean"],
                                                                          default["std"])
    assert t.resize_short == {"efficientnet_lite0": 256, "gpunet_0": 320}[name]


def test_eval_transforms_refuse_a_detection_model():
    with pytest.raises(ConfigError, match="a detection model's pre-processing is resize_long_pad"):
        eval_transforms_changes(MODELS.build("efficientdet_d0", image_size=64).default_cfg)


@pytest.mark.parametrize("name", NAMES)
def test_forward_is_forward_head_of_forward_features(name):
    model = _build(name)
    model.eval()
    x = paddle.randn([1, 3, 64, 64])
    with paddle.no_grad():
        whole = _outputs(model(x))
        features = model.forward_features(x)
        split = _outputs(model.forward_head(features))
    assert len(whole) == len(split) and all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(whole, split))
    if name == "efficientdet_d0":  # the BiFPN's P3..P7
        assert [f.shape[1:] for f in features] == [[64, s, s] for s in (8, 4, 2, 1, 1)]
    else:
        assert features.shape[1] == model.num_features


@pytest.mark.parametrize("name", NAMES)
def test_reset_classifier_changes_only_the_classifier(name):
    model = _build(name)
    before = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    prefix = model.default_cfg["classifier"] + "."
    model.reset_classifier(7)
    after = model.state_dict()
    assert model.num_classes == 7
    assert list(after) == list(before)
    head = [k for k in after if k.startswith(prefix)]
    assert head and all(after[k].shape != list(before[k].shape) for k in head if k.endswith("weight"))
    for key in after:
        if not key.startswith(prefix):
            assert np.array_equal(after[key].numpy(), before[key]), key
    fresh = _build(name, num_classes=7)
    assert [(k, v.shape) for k, v in after.items()] == [(k, v.shape) for k, v in fresh.state_dict().items()]
    model.eval()
    with paddle.no_grad():
        out = _outputs(model(paddle.randn([2, 3, 64, 64])))
    if name == "efficientdet_d0":  # class logits per level: anchors x classes channels
        assert all(o.shape[1] == 9 * 7 for o in out[:5]) and all(o.shape[1] == 9 * 4 for o in out[5:])
    else:
        assert out[0].shape == [2, 7]
    with pytest.raises(ConfigError, match="num_classes must be a positive integer, got 0"):
        model.reset_classifier(0)
