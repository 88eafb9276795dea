"""The model's ``default_cfg`` is the one source of a family's pre-processing defaults: null keys of the
config resolve from it (``ppdlx.tasks.preprocess``), values the config gives win, and every shipped
config resolves to exactly the transforms it had when the schema held the defaults (commit 001894d)."""
import glob
import os

import numpy as np
import paddle
import pytest
import yaml

from ppdlx.config import load_config
from ppdlx.errors import ConfigError
from ppdlx.tasks.preprocess import resolve_preprocessing, resolve_with_record

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

IMAGENET = ([123.675, 116.28, 103.53], [58.395, 57.12, 57.375])
DIGITS = ([0.0, 0.0, 0.0], [255.0, 255.0, 255.0])
LITE = ([127.0, 127.0, 127.0], [128.0, 128.0, 128.0])


def _cls(crop, resize, interpolation, norm):
    return {"crop_size": crop, "resize_short": resize, "interpolation": interpolation, "mean": norm[0], "std": norm[1]}


def _det(size, interpolation, norm):
    return {"image_size": size, "interpolation": interpolation, "mean": norm[0], "std": norm[1]}


# What every shipped config's pipelines read at 001894d (the schema's 224/256/bilinear/ImageNet defaults
# filled in), printed by loading each YAML with that commit's ppdlx.
AT_001894D = {
    "base/gpunet_imagenet.yaml": _cls(224, 256, "bicubic", IMAGENET),
    "base/rn50_imagenet.yaml": _cls(224, 256, "bilinear", IMAGENET),
    "demo/efficientdet_demo.yaml": _det(64, "bilinear", IMAGENET),
    "demo/efficientdet_fruit_overfit.yaml": _det(128, "bilinear", IMAGENET),
    "demo/gpunet_demo.yaml": _cls(32, 32, "bicubic", DIGITS),
    "demo/gpunet_distill_demo.yaml": _cls(32, 32, "bicubic", DIGITS),
    "demo/rn50_asp_demo.yaml": _cls(32, 32, "bilinear", DIGITS),
    "demo/rn50_demo.yaml": _cls(32, 32, "bilinear", DIGITS),
    "efficientdet_d0.yaml": _det(512, "bilinear", IMAGENET),
    "efficientnet_lite0.yaml": _cls(224, 256, "bicubic", LITE),
    "gpunet/gpunet_0.yaml": _cls(320, 320, "bicubic", IMAGENET),
    "gpunet/gpunet_1.yaml": _cls(288, 288, "bicubic", IMAGENET),
    "gpunet/gpunet_2.yaml": _cls(384, 384, "bicubic", IMAGENET),
    "gpunet/gpunet_d1.yaml": _cls(456, 456, "bicubic", IMAGENET),
    "gpunet/gpunet_d2.yaml": _cls(528, 528, "bicubic", IMAGENET),
    "gpunet/gpunet_p0.yaml": _cls(224, 256, "bicubic", IMAGENET),
    "gpunet/gpunet_p1.yaml": _cls(224, 256, "bicubic", IMAGENET),
    "rn50_amp.yaml": _cls(224, 256, "bilinear", IMAGENET),
    "rn50_asp.yaml": _cls(224, 256, "bilinear", IMAGENET),
    "rn50_tf32.yaml": _cls(224, 256, "bilinear", IMAGENET),
}


def _shipped():
    configs = os.path.join(ROOT, "configs")
    return sorted(os.path.relpath(p, configs) for p in glob.glob(os.path.join(configs, "**", "*.yaml"), recursive=True))


def _read(cfg, keys):
    t, out = cfg.data.transforms, {}
    for key in keys:
        value = cfg.data.coco.image_size if key == "image_size" else getattr(t, key)
        out[key] = list(value) if isinstance(value, (list, tuple)) else value
    return out


# configs added since, each fine-tuning the model of the config named: its pre-processing is that one's
FINE_TUNES = {
    "demo/efficientdet_qat_demo.yaml": "demo/efficientdet_demo.yaml",
    "demo/gpunet_qat_demo.yaml": "demo/gpunet_demo.yaml",
    "demo/rn50_qat_demo.yaml": "demo/rn50_demo.yaml",
    "rn50_qat.yaml": "rn50_amp.yaml",
}
EXPECTED = {**AT_001894D, **{name: AT_001894D[start] for name, start in FINE_TUNES.items()}}


def test_every_shipped_config_has_its_001894d_transforms():
    assert _shipped() == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_shipped_config_resolves_to_the_transforms_it_had(name):
    from ppdlx.export.meta import classification_preprocess, detection_preprocess
    expected = EXPECTED[name]
    cfg = resolve_preprocessing(load_config(os.path.join(ROOT, "configs", name)))
    assert _read(cfg, expected) == expected
    # and inference.yml describes the same pre-processing
    t = cfg.data.transforms
    if "image_size" in expected:
        section = detection_preprocess(t, cfg.data.coco.image_size)
        assert section == {"type": "resize_long_pad", "size": expected["image_size"], "pad_value": 0.0,
                           "color": "RGB", **{k: expected[k] for k in ("interpolation", "mean", "std")}}
    else:
        assert classification_preprocess(t) == {"type": "resize_short_center_crop", "color": "RGB", **expected}
    # the other transform keys (augmentation) are the loaded config's, untouched
    loaded = load_config(os.path.join(ROOT, "configs", name)).data.transforms
    for key in ("scale", "ratio", "hflip", "random", "randaugment", "random_erasing", "random_erasing_mode"):
        assert getattr(t, key) == getattr(loaded, key), key


def test_null_keys_take_the_models_default_cfg():
    t = load_config(None).data.transforms
    assert (t.crop_size, t.resize_short, t.interpolation, t.mean, t.std) == (None,) * 5
    assert load_config(None).data.coco.image_size is None
    gpunet = resolve_preprocessing(load_config(None, ["model.name=gpunet_0"])).data.transforms
    assert (gpunet.crop_size, gpunet.resize_short, gpunet.interpolation) == (320, 320, "bicubic")
    # a config's crop size with the model's crop_pct: timm's resize floor(32 / 0.875)
    lite = resolve_preprocessing(load_config(None, ["model.name=efficientnet_lite0", "data.transforms.crop_size=32"]))
    assert _read(lite, ["crop_size", "resize_short", "interpolation", "mean", "std"]) == \
        _cls(32, 36, "bicubic", LITE)
    det = resolve_preprocessing(load_config(None, ["data.dataset=coco", "model.name=efficientdet_d0",
                                                   "model.args.image_size=256"]))
    assert _read(det, ["image_size", "interpolation", "mean", "std"]) == _det(256, "bilinear", IMAGENET)


def test_values_the_config_gives_win():
    given = ["model.name=gpunet_0", "data.transforms.crop_size=64", "data.transforms.resize_short=80",
             "data.transforms.interpolation=bilinear", "data.transforms.mean=[1,2,3]", "data.transforms.std=[4,5,6]"]
    cfg = load_config(None, given)
    assert resolve_preprocessing(cfg) is cfg  # nothing null: nothing changes, resolving again neither
    pct = resolve_preprocessing(load_config(None, ["model.name=gpunet_0", "data.transforms.crop_pct=0.5"]))
    assert (pct.data.transforms.crop_size, pct.data.transforms.resize_short) == (320, 640)
    resolved = resolve_preprocessing(load_config(None, ["model.name=resnet50", "data.transforms.resize_short=40",
                                                        "data.transforms.crop_size=32"]))
    assert (resolved.data.transforms.resize_short, resolved.data.transforms.crop_pct) == (40, None)
    assert resolve_preprocessing(resolved) is resolved


def test_record_says_where_each_value_came_from():
    cfg = load_config(None, ["model.name=efficientnet_lite0", "data.transforms.crop_size=32",
                             "data.transforms.mean=[0,0,0]"])
    _, record = resolve_with_record(cfg)
    assert record == {
        "data.transforms.crop_size": {"value": 32, "source": "config"},
        "data.transforms.resize_short": {"value": 36, "source": "default_cfg"},
        "data.transforms.interpolation": {"value": "bicubic", "source": "default_cfg"},
        "data.transforms.mean": {"value": [0.0, 0.0, 0.0], "source": "config"},
        "data.transforms.std": {"value": [128.0, 128.0, 128.0], "source": "default_cfg"}}
    _, det = resolve_with_record(load_config(None, ["data.dataset=coco", "model.name=efficientdet_d0"]))
    assert det["data.coco.image_size"] == {"value": 512, "source": "default_cfg"}
    assert "data.transforms.crop_size" not in det


def test_resolving_leaves_the_runs_random_numbers_and_parameter_names_alone():
    from ppdlx.models.from_config import build_model
    cfg = load_config(None, ["model.name=resnet18_bottleneck_tiny", "model.num_classes=4"])

    def built(resolve_first):
        with paddle.utils.unique_name.guard():
            paddle.seed(7)
            if resolve_first:
                resolve_preprocessing(cfg)
            model = build_model(cfg)
            return {p.name: p.numpy() for p in model.parameters()}, paddle.rand([3]).numpy()

    (plain, plain_draw), (after, after_draw) = built(False), built(True)
    assert list(after) == list(plain)
    assert all(np.array_equal(after[k], plain[k]) for k in plain) and np.array_equal(after_draw, plain_draw)


def test_data_and_export_refuse_an_unresolved_null(tmp_path):
    from ppdlx.data.coco import build_coco_dataset
    from ppdlx.data.loader import build_classification_loader
    from ppdlx.export.meta import classification_preprocess
    cfg = load_config(None, [f"data.root={tmp_path}", "data.transforms.crop_size=32"])
    with pytest.raises(ConfigError, match=r"^data.transforms.resize_short is null \(= the model's default_cfg\) "
                                          r"and was not resolved"):
        build_classification_loader(cfg, "train")
    with pytest.raises(ConfigError, match=r"^data.transforms.resize_short is null"):
        classification_preprocess(cfg.data.transforms)
    with pytest.raises(ConfigError, match=r"^data.coco.image_size is null"):
        build_coco_dataset(load_config(None, ["data.dataset=coco", f"data.root={tmp_path}"]), "val")


def test_plan_records_the_resolved_preprocessing_and_config_yaml_keeps_the_nulls(tmp_path):
    from ppdlx.engine.run import build_training
    cfg = load_config(None, [
        f"global.output_dir={tmp_path}", "global.device=cpu", "global.cpu_fast_kernels=false",
        "model.name=resnet18_bottleneck_tiny", "model.num_classes=4", "data.backend=synthetic",
        "data.synthetic.num_images=8", "data.batch_size=4", "data.transforms.crop_size=32", "train.epochs=1"])
    trainer = build_training(cfg)
    assert trainer.plan.preprocess["data.transforms.resize_short"] == {"value": 36, "source": "default_cfg"}
    plan = yaml.safe_load((tmp_path / "plan.yaml").read_text())
    assert plan["preprocess"]["data.transforms.crop_size"] == {"value": 32, "source": "config"}
    assert plan["preprocess"]["data.transforms.mean"] == {"value": IMAGENET[0], "source": "default_cfg"}
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())["data"]["transforms"]
    assert (saved["crop_size"], saved["resize_short"], saved["mean"]) == (32, None, None)


def test_a_teachers_nulls_resolve_from_the_teachers_model(tmp_path):
    from ppdlx.tasks.distill import load_teacher_config, teacher_resolution
    teacher = tmp_path / "teacher.yaml"
    teacher.write_text("model:\n  name: gpunet_0\n  num_classes: 10\n")
    cfg = load_config(None, ["distill.enabled=true", f"distill.teacher_config={teacher}"])
    assert teacher_resolution(cfg) == 320
    assert load_teacher_config(cfg).data.transforms.interpolation == "bicubic"


class TinyNet(paddle.nn.Layer):
    def __init__(self, num_classes=3):
        super().__init__()
        self.body = paddle.nn.Sequential(paddle.nn.Conv2D(3, 4, 3, stride=4), paddle.nn.AdaptiveAvgPool2D(1),
                                         paddle.nn.Flatten(), paddle.nn.Linear(4, num_classes))

    def forward(self, x):
        return self.body(x)


def test_export_writes_the_preprocessing_of_the_configs_model(tmp_path):
    from ppdlx.export import export_model
    paddle.seed(0)
    cfg = load_config(None, ["model.name=efficientnet_lite0", "model.num_classes=3", "data.root=/nonexistent"])
    report = export_model(cfg, output_dir=str(tmp_path), model=TinyNet(), labels=["a", "b", "c"],
                          check_batch_sizes=(1,))
    meta = yaml.safe_load(open(report["meta_file"], encoding="utf-8"))
    assert meta["preprocess"] == {"type": "resize_short_center_crop", "resize_short": 256, "crop_size": 224,
                                  "interpolation": "bicubic", "mean": LITE[0], "std": LITE[1], "color": "RGB"}
    assert meta["inputs"][0]["shape"] == [-1, 3, 224, 224]
