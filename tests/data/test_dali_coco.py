"""DALI COCO pipeline: same boxes as the paddle.io pipeline with augmentation off, sane with it on."""
import os
import re

import numpy as np
import pytest

pytest.importorskip("nvidia.dali")

import paddle  # noqa: E402

from ppdlx.config import load_config  # noqa: E402
from ppdlx.data.coco import build_coco_loader  # noqa: E402
from ppdlx.data.synthetic_coco import make_synthetic_coco  # noqa: E402
from ppdlx.tasks.detection import detection_targets  # noqa: E402
from ppdlx.models.detection.target_assigner import assign_targets  # noqa: E402
from ppdlx.errors import DataError, UnsupportedError  # noqa: E402


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("dali_coco"))
    make_synthetic_coco(root, num_train=12, num_val=7, seed=3, size_range=(60, 140))
    return root


def _cfg(root, *extra):
    from ppdlx.tasks.preprocess import resolve_preprocessing  # the nulls: the model's default_cfg
    return resolve_preprocessing(load_config(None, ["data.dataset=coco", f"data.root={root}", "data.coco.train_json=annotations/instances_train.json",
                              "data.coco.val_json=annotations/instances_val.json", "data.coco.train_images=train",
                              "data.coco.val_images=val", "data.coco.image_size=96", "data.batch_size=4",
                              "data.workers=0", "model.num_classes=3", *extra]))


@pytest.mark.parametrize("split", ["val", "train"])
def test_dali_matches_paddle_io_without_augmentation(shapes, split):
    off = ["data.transforms.random=false"]
    ref = list(build_coco_loader(_cfg(shapes, *off), split))
    got = list(build_coco_loader(_cfg(shapes, *off, "data.backend=dali"), split))
    assert len(ref) == len(got) == (2 if split == "val" else 3)
    n_boxes = 0
    for (im1, b1, c1, i1, s1), (im2, b2, c2, i2, s2) in zip(ref, got):
        assert im1.shape == im2.shape and b1.shape == b2.shape == [im1.shape[0], 100, 4]
        assert i1.numpy().tolist() == i2.numpy().tolist()
        assert (c1.numpy() == c2.numpy()).all()
        np.testing.assert_allclose(b2.numpy(), b1.numpy(), atol=1e-3)
        np.testing.assert_allclose(s2.numpy(), s1.numpy(), rtol=1e-5)
        # same pixels up to JPEG decoder / resampler differences; padding identical (0)
        diff = np.abs(im1.numpy() - im2.numpy())
        assert diff.mean() < 0.02 and diff.max() < 0.5
        n_boxes += int((c1.numpy() >= 0).sum())
    assert n_boxes >= 7
    if split == "val":  # 7 images over batches of 4: the last batch holds 3
        assert sum(int(b[0].shape[0]) for b in got) == 7


def test_dali_train_augmentation_keeps_boxes_valid(shapes):
    loader = build_coco_loader(_cfg(shapes, "data.backend=dali", "data.coco.scale_range=[0.5,2.0]"), "train")
    flipped_or_scaled = False
    for epoch in range(2):
        loader.set_epoch(epoch)
        for images, boxes, classes, ids, scales in loader:
            assert images.shape == [4, 3, 96, 96]
            valid = classes.numpy() >= 0
            b = boxes.numpy()[valid]
            assert (b >= 0).all() and (b <= 96).all() and (b[:, 2] > b[:, 0]).all() and (b[:, 3] > b[:, 1]).all()
            flipped_or_scaled |= bool(np.abs(scales.numpy() - 1).max() > 0)
    assert flipped_or_scaled


@pytest.mark.parametrize("hflip", [0.0, 1.0])
def test_dali_augmented_boxes_sit_on_their_shapes(shapes, hflip):
    """The boxes come from the host and the pixels from DALI: after DALI's flip, scale and crop, the centre
    of every box kept must be its shape's colour (circle red, square green, triangle blue), not the light
    background, over several epochs of one reused pipeline, also after an epoch left early."""
    cfg = _cfg(shapes, "data.backend=dali", f"data.transforms.hflip={hflip}", "data.coco.scale_range=[0.8,1.6]",
               "data.transforms.mean=[0,0,0]", "data.transforms.std=[1,1,1]")
    loader = build_coco_loader(cfg, "train")
    checked, pipes = 0, set()
    for epoch in range(4):
        loader.set_epoch(epoch)
        seen = []
        for step, (images, boxes, classes, ids, _) in enumerate(loader):
            if epoch == 1 and step == 1:
                break
            seen += ids.numpy().tolist()
            x = images.numpy()
            for img, bs, cs in zip(x, boxes.numpy(), classes.numpy()):
                for (y1, x1, y2, x2), c in zip(bs, cs):
                    if c < 0 or min(y2 - y1, x2 - x1) < 6:
                        continue
                    rgb = img[:, int((y1 + y2) / 2), int((x1 + x2) / 2)]
                    assert int(np.argmax(rgb)) == c and rgb.max() - rgb.min() > 60, (epoch, rgb, c)
                    checked += 1
        if epoch != 1:  # the sampler's order of the epoch, nothing left over from the one left early
            assert seen == [loader.index.records[i]["id"] for i in loader._order()]
        pipes.add(id(loader._pipe))
    assert checked >= 20 and len(pipes) == 1


def test_a_resumed_loader_draws_the_flips_and_scales_of_the_run_it_resumes(shapes):
    cfg = _cfg(shapes, "data.backend=dali", "data.transforms.hflip=0.5", "data.coco.scale_range=[0.5,2.0]")
    first = build_coco_loader(cfg, "train")
    first.set_epoch(0)
    list(first)
    state = first.state_dict()
    first.set_epoch(1)
    expected = [(b.numpy(), s.numpy()) for _, b, _, _, s in first]
    resumed = build_coco_loader(cfg, "train")
    resumed.set_state_dict(state)
    resumed.set_epoch(1)
    got = [(b.numpy(), s.numpy()) for _, b, _, _, s in resumed]
    assert len(got) == len(expected) == 3
    for (b1, s1), (b2, s2) in zip(expected, got):
        np.testing.assert_array_equal(b1, b2)
        np.testing.assert_array_equal(s1, s2)
    fresh = build_coco_loader(cfg, "train")  # without the state: the same order, other draws
    fresh.set_epoch(1)
    assert any(not np.array_equal(b1, b.numpy()) for (b1, _), (_, b, _, _, _) in zip(expected, fresh))


def test_an_unreadable_image_is_skipped_by_name_or_refused(tmp_path, ppdlx_caplog):
    root = str(tmp_path)
    make_synthetic_coco(root, num_train=12, num_val=7, seed=3, size_range=(60, 140))
    bad = os.path.join(root, "train", sorted(os.listdir(os.path.join(root, "train")))[5])
    with open(bad, "wb") as f:
        f.write(b"\xff\xd8\xff\xe0 not a jpeg" * 20)
    loader = build_coco_loader(_cfg(root, "data.backend=dali"), "train")
    seen = [int(i) for _, _, _, ids, _ in loader for i in ids.numpy()]
    assert len(seen) == 12 and loader.skipped_files == [bad]  # 3 full batches, the shortfall topped up
    assert os.path.basename(bad) in ppdlx_caplog.text
    refusing = build_coco_loader(_cfg(root, "data.backend=dali", "data.dali.corrupt_files=error"), "train")
    with pytest.raises(DataError, match=re.escape(bad) + ".*corrupt_files=skip"):
        list(refusing)


def test_gpu_on_a_cpu_build_is_one_line(shapes):
    import paddle
    if paddle.is_compiled_with_cuda():
        pytest.skip("CUDA build")
    with pytest.raises(UnsupportedError) as err:
        build_coco_loader(_cfg(shapes, "data.backend=dali", "data.dali.device=gpu"), "val")
    assert "data.dali.device=cpu" in str(err.value) and "\n" not in str(err.value)


def test_images_hand_over_like_classification(shapes):
    """Detection images go through the classification loader's hand-over, which takes the DenseTensor that
    DALI's paddle plugin yields on GPU (nvidia/dali/plugin/paddle.py:348-353) and gives a tensor layers accept."""
    import paddle

    from ppdlx.data import dali, dali_coco
    from ppdlx.layers import ConvNormAct as ConvBNAct
    loader = build_coco_loader(_cfg(shapes, "data.backend=dali"), "val")
    loader._feed.start(loader._order())
    images = loader._build(0).run()[0]
    dense = paddle.framework.core.from_dlpack(images.as_tensor().__dlpack__())
    assert dali_coco.to_paddle is dali.to_paddle
    x = dali_coco.to_paddle(dense, loader.device)
    assert isinstance(x, paddle.Tensor) and x.shape == [4, 3, 96, 96] and x.place.is_cpu_place()
    np.testing.assert_array_equal(x.numpy(), images.as_array())
    assert ConvBNAct(3, 8, 3, stride=2)(x[:3]).shape == [3, 8, 48, 48]


def test_an_exif_rotated_photo_keeps_its_boxes_on_its_pixels(tmp_path):
    """Before: DALI turned a photo by its EXIF orientation tag (its decoders' and peek_image_shape's
    default) while the boxes stay in the stored frame, as paddle.io, pycocotools and the json's
    width/height see it: the box no longer covered the object. A red square, stored frame 120x80,
    orientation 6 (shown turned by 90 degrees)."""
    import json
    from PIL import Image
    root = str(tmp_path)
    pixels = np.full((80, 120, 3), 200, np.uint8)
    pixels[20:50, 10:40] = (220, 40, 40)
    exif = Image.Exif()
    exif[0x0112] = 6
    annotations = {"images": [{"id": 1, "file_name": "a.jpg", "width": 120, "height": 80}],
                   "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [10, 20, 30, 30], "area": 900,
                                    "iscrowd": 0}],
                   "categories": [{"id": 1, "name": "square"}]}
    os.makedirs(os.path.join(root, "annotations"))
    for split in ("train", "val"):
        os.makedirs(os.path.join(root, split))
        Image.fromarray(pixels).save(os.path.join(root, split, "a.jpg"), quality=98, exif=exif.tobytes())
        with open(os.path.join(root, "annotations", f"instances_{split}.json"), "w") as f:
            json.dump(annotations, f)
    extra = ["data.batch_size=1", "model.num_classes=1", "data.transforms.mean=[0,0,0]", "data.transforms.std=[1,1,1]"]
    for backend in ("paddle", "dali"):
        images, boxes, classes, _, _ = next(iter(build_coco_loader(_cfg(root, f"data.backend={backend}", *extra),
                                                                  "val")))
        x = images.numpy()[0]
        rows, cols = np.nonzero((x[0] > 180) & (x[1] < 100))
        red = [rows.min(), cols.min(), rows.max() + 1, cols.max() + 1]  # y1 x1 y2 x2, as the boxes
        box = boxes.numpy()[0, 0]
        assert int(classes.numpy()[0, 0]) >= 0
        assert np.abs(np.asarray(red, np.float32) - box).max() <= 1.5, (backend, red, box.tolist())



@pytest.mark.parametrize("backend", ["paddle", "dali"])
def test_training_batches_carry_the_anchor_targets_assigned_on_the_host(shapes, backend, monkeypatch):
    """EfficientDet's targets come with the batch (no per-image ``nonzero`` on the device), equal to the loss's
    own assignment of the batch's boxes; DALI's host arrays reach paddle in one copy per batch."""
    cfg = _cfg(shapes, f"data.backend={backend}", "model.name=efficientdet_d0")
    targets = detection_targets(cfg)
    loader = build_coco_loader(cfg, "train", targets=targets)
    uploads = []
    original = paddle.to_tensor
    monkeypatch.setattr(paddle, "to_tensor", lambda *a, **k: uploads.append(1) or original(*a, **k))
    batches = list(loader)
    monkeypatch.setattr(paddle, "to_tensor", original)
    assert len(batches) == 3 and all(len(b) == 8 for b in batches)
    if backend == "dali":
        assert len(uploads) == len(batches)
    positives = 0
    for _, boxes, classes, _, _, cls_t, box_t, num_pos in batches:
        want = assign_targets(paddle.to_tensor(targets.anchors), boxes, classes, backend="paddle")
        assert cls_t.dtype == paddle.int64 and box_t.shape == [4, len(targets.anchors), 4]
        np.testing.assert_array_equal(cls_t.numpy(), want[0].numpy())
        np.testing.assert_allclose(box_t.numpy(), want[1].numpy(), atol=1e-5)
        np.testing.assert_array_equal(num_pos.numpy(), want[2].numpy())
        positives += int(num_pos.numpy().sum())
    assert positives > 20
