"""The deploy package's detection pre-processing gives the network the inputs ppdlx's own COCO eval
transform gives it (what ``--verify`` compares): the resized size truncated as
``coco_geometry.eval_size`` does (not rounded), the padding in normalised units (0 = the mean
colour, as ``CocoDetection`` pads), the same ``image_scale``; ``color: BGR`` reverses the channels."""
import numpy as np
import pytest

from benchmarks.infer import load_deploy_module
from ppdlx.config import load_config
from ppdlx.data.coco import build_coco_dataset
from ppdlx.data.synthetic_coco import make_synthetic_coco
from ppdlx.export import detection_export_spec

D = load_deploy_module()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    make_synthetic_coco(str(root), num_train=2, num_val=24, size_range=(61, 97))
    from ppdlx.tasks.preprocess import resolve_preprocessing  # the nulls: the model's default_cfg
    cfg = resolve_preprocessing(load_config(None, [
        "data.dataset=coco", f"data.root={root}", "data.coco.image_size=64",
        "data.coco.train_json=annotations/instances_train.json", "data.coco.val_json=annotations/instances_val.json",
        "data.coco.train_images=train", "data.coco.val_images=val", "model.num_classes=3"]))
    return cfg, build_coco_dataset(cfg, "val")


def _meta(cfg, color="RGB"):
    spec = detection_export_spec(cfg.data.transforms, 64, 3, {})
    return {"model": {"family": "detection", "data_format": "NCHW"},
            "inputs": [{"name": "image", "shape": [-1, 3, 64, 64], "layout": "NCHW", "role": "image"},
                       {"name": "image_scale", "shape": [-1], "role": "scale"}],
            "preprocess": {**spec["preprocess"], "color": color}}


def test_deploy_detection_inputs_are_ppdlx_eval_inputs(dataset):
    cfg, ds = dataset
    prep = D.Preprocessor(_meta(cfg))
    truncated = 0
    for i, rec in enumerate(ds.records):
        image, _, _, _, scale, _ = ds[i]
        got, got_scale = prep(D.load_image(rec["path"]))
        w, h = rec["width"], rec["height"]
        ratio = min(64 / w, 64 / h)
        truncated += int(round(w * ratio)) != int(w * ratio + 1e-4) or int(round(h * ratio)) != int(h * ratio + 1e-4)
        assert got.shape == image.shape and float(np.max(np.abs(got - image))) <= 1e-5, rec["path"]
        assert got_scale == pytest.approx(float(scale), rel=1e-6)
    assert truncated > 0  # some sizes where rounding would have resized differently


def test_bgr_reverses_the_channels(dataset):
    cfg, ds = dataset
    img = D.load_image(ds.records[0]["path"])
    rgb, _ = D.Preprocessor(_meta(cfg))(img)
    bgr, _ = D.Preprocessor(_meta(cfg, "BGR"))(img)
    mean, std = np.asarray(cfg.data.transforms.mean), np.asarray(cfg.data.transforms.std)
    h = int(ds.records[0]["height"] * min(64 / ds.records[0]["width"], 64 / ds.records[0]["height"]) + 1e-4)
    pixels = rgb[:, :h] * std[:, None, None] + mean[:, None, None]
    np.testing.assert_allclose(bgr[:, :h], (pixels[::-1] - mean[:, None, None]) / std[:, None, None], atol=1e-4)
    with pytest.raises(D.DeployError, match="preprocess.color 'GBR'"):
        D.Preprocessor(_meta(cfg, "GBR"))
