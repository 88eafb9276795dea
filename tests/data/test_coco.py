"""COCO dataset: box transforms agree with the pixels, invalid annotations, crowd, batch contract."""
import json
import logging
import os

import numpy as np
import pytest
from PIL import Image

from ppdlx.data.coco import CocoDetection, CocoIndex, eval_size, shared_index, sharing_indexes, train_window
from ppdlx.errors import DataError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MEAN, STD = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)  # identity normalisation: pixels stay readable
PIXELS = {"mean": MEAN, "std": STD, "interpolation": "bilinear"}


def write_coco(root, images, annotations, categories=({"id": 4, "name": "thing"}, {"id": 9, "name": "other"})):
    """``images``: [(id, file, w, h, [(x0, y0, x1, y1, colour)...])] drawn as solid rectangles."""
    os.makedirs(os.path.join(root, "img"), exist_ok=True)
    infos = []
    for image_id, name, w, h, rects in images:
        arr = np.full((h, w, 3), 40, np.uint8)
        for x0, y0, x1, y1, colour in rects:
            arr[y0:y1, x0:x1] = colour
        if name:
            Image.fromarray(arr).save(os.path.join(root, "img", name))  # PNG: exact pixels
        infos.append({"id": image_id, "file_name": name or f"missing_{image_id}.png", "width": w, "height": h})
    path = os.path.join(root, "ann.json")
    with open(path, "w") as f:
        json.dump({"images": infos, "annotations": annotations, "categories": list(categories)}, f)
    return path


def ann(aid, image_id, bbox, cat=4, crowd=0):
    return {"id": aid, "image_id": image_id, "category_id": cat, "bbox": bbox, "iscrowd": crowd,
            "area": float(bbox[2] * bbox[3])}


@pytest.fixture
def one_box(tmp_path):
    """A 100x50 image with a white box at x 10..40, y 5..25 (COCO bbox [10, 5, 30, 20])."""
    path = write_coco(str(tmp_path), [(1, "a.png", 100, 50, [(10, 5, 40, 25, (255, 255, 255))])],
                      [ann(1, 1, [10, 5, 30, 20])])
    return path, os.path.join(str(tmp_path), "img")


def _white_extent(img_chw):
    """(x1, y1, x2, y2) pixel-edge extent of the pixels brighter than 200 (channel 0)."""
    ys, xs = np.nonzero(img_chw[0] > 200)
    return xs.min(), ys.min(), xs.max() + 1, ys.max() + 1


def test_eval_transform_scales_box_and_pads_bottom_right(one_box):
    ds = CocoDetection(*one_box, image_size=64, training=False, **PIXELS)
    img, boxes, classes, image_id, scale, _ = ds[0]
    assert img.shape == (3, 64, 64) and img.dtype == np.float32
    # longer side 100 -> 64: factor 0.64, content 64 x 32, padding rows 32..63 are 0
    assert scale == pytest.approx(1 / 0.64)
    np.testing.assert_allclose(boxes[0], [5 * .64, 10 * .64, 25 * .64, 40 * .64], atol=1e-5)  # yxyx
    assert classes[0] == 0 and (classes[1:] == -1).all() and boxes.shape == (100, 4)
    assert image_id == 1
    assert np.all(img[:, 32:, :] == 0) and img[:, :32, :].min() >= 39
    x1, y1, x2, y2 = _white_extent(img)
    assert abs(x1 - 6.4) <= 1 and abs(x2 - 25.6) <= 1 and abs(y1 - 3.2) <= 1 and abs(y2 - 16) <= 1


def test_flip_mirrors_box_and_pixels(one_box):
    ds = CocoDetection(*one_box, image_size=64, training=True, **PIXELS, hflip=1.0,
                       scale_range=(1.0, 1.0))
    img, boxes, *_ = ds[0]
    # mirrored in the 100 px original: x 60..90 -> x0.64 = 38.4..57.6
    np.testing.assert_allclose(boxes[0], [3.2, 38.4, 16.0, 57.6], atol=1e-5)
    x1, y1, x2, y2 = _white_extent(img)
    assert abs(x1 - 38.4) <= 1 and abs(x2 - 57.6) <= 1 and abs(y1 - 3.2) <= 1 and abs(y2 - 16) <= 1


def test_scale_jitter_and_crop_keep_boxes_on_the_pixels(tmp_path):
    rects = [(10, 10, 70, 50, (255, 255, 255)), (120, 60, 150, 110, (255, 255, 255))]
    path = write_coco(str(tmp_path), [(1, "b.png", 160, 120, rects)],
                      [ann(1, 1, [10, 10, 60, 40]), ann(2, 1, [120, 60, 30, 50], cat=9)])
    ds = CocoDetection(path, os.path.join(str(tmp_path), "img"), image_size=64, training=True, **PIXELS,
                       hflip=0.5, scale_range=(0.3, 2.0))
    seen_crop = False
    for epoch in range(12):
        ds.set_epoch(epoch)
        img, boxes, classes, *_ = ds[0]
        valid = classes >= 0
        assert valid.sum() >= 1
        assert (boxes[valid] >= 0).all() and (boxes[valid] <= 64).all()
        assert (boxes[valid][:, 2] > boxes[valid][:, 0]).all() and (boxes[valid][:, 3] > boxes[valid][:, 1]).all()
        mask = img[0] > 200
        for (y1, x1, y2, x2) in boxes[valid]:
            inner = mask[int(np.ceil(y1)) + 1:int(y2) - 1, int(np.ceil(x1)) + 1:int(x2) - 1]
            if inner.size:
                assert inner.mean() > 0.95  # the box sits on white pixels
        # every white pixel lies inside some box (1 px slack for resampling)
        ys, xs = np.nonzero(mask)
        inside = np.zeros(len(ys), bool)
        for (y1, x1, y2, x2) in boxes[valid]:
            inside |= (ys >= y1 - 1) & (ys < y2 + 1) & (xs >= x1 - 1) & (xs < x2 + 1)
        assert inside.all()
        seen_crop |= bool(valid.sum() < 2)
    assert seen_crop  # large scales crop one of the boxes away at least once


def test_window_and_eval_size_follow_the_reference():
    rng = np.random.default_rng(0)
    for _ in range(50):
        w, h = (int(v) for v in rng.integers(20, 900, 2))
        sw, sh, ox, oy = train_window(w, h, 512, (0.1, 2.0), rng)
        assert 0 <= ox <= max(0, sw - 512) and 0 <= oy <= max(0, sh - 512)
        assert max(sw, sh) <= int(2.0 * 512) and abs(sw / w - sh / h) < 2.0 / min(w, h) + 1e-6
        ew, eh, inv = eval_size(w, h, 512)
        assert max(ew, eh) == 512 and inv == pytest.approx(max(w, h) / 512)


def test_invalid_annotations_reported_with_file_and_id_then_skipped(tmp_path, ppdlx_caplog):
    anns = [ann(1, 1, [10, 5, 30, 20]),
            ann(2, 1, [10, 5, -3, 20]),          # negative width
            ann(3, 1, [10, 5, 0, 20]),           # zero width
            ann(4, 1, [90, 5, 30, 20]),          # 120 > 100: outside the image
            ann(5, 1, [10, 5, 30, 20], cat=77),  # unknown category id
            ann(6, 2, [1, 1, 5, 5])]             # on an image whose file is missing
    path = write_coco(str(tmp_path), [(1, "a.png", 100, 50, []), (2, None, 20, 20, [])], anns)
    index = CocoIndex(path, os.path.join(str(tmp_path), "img"), invalid="skip")
    assert [r["id"] for r in index.records] == [1]
    assert index.records[0]["ann_ids"] == [1]
    reported = {a for _, a, _, _, _ in index.invalid}
    assert reported == {2, 3, 4, 5, None}  # None: the missing image (reported by image id)
    text = ppdlx_caplog.text
    for aid in (2, 3, 4, 5):
        assert f"{path}: annotation id {aid} (image id 1, a.png)" in text
    assert "negative size" in text and "outside the 100.0x50.0 image" in text and "unknown category id 77" in text
    assert "image id 2 (missing_2.png): image file" in text and "not found" in text
    # the evaluation ground truth holds only what was kept
    assert [a["id"] for a in index.gt_dataset["annotations"]] == [1]


def test_the_check_the_loader_and_the_evaluator_share_one_index_and_one_report(tmp_path, ppdlx_caplog):
    # Before: the start-of-training check and each loader built their own index: the json was parsed,
    # every image header read and every invalid entry logged once per reader.
    path = write_coco(str(tmp_path), [(1, "a.png", 100, 50, []), (2, None, 20, 20, [])],
                      [ann(1, 1, [10, 5, 30, 20]), ann(2, 2, [1, 1, 5, 5])])
    img_dir = os.path.join(str(tmp_path), "img")
    with sharing_indexes():
        first = shared_index(path, img_dir, "skip")
        assert shared_index(path, img_dir, "skip", cat_ids=[4, 9]) is first
        assert CocoDetection(path, img_dir, image_size=64, **PIXELS).index is first
        assert len([r for r in ppdlx_caplog.records if "missing_2.png" in r.getMessage()]) == 1
        # invalid=error still stops on the entry the shared index left out; other categories still raise
        with pytest.raises(DataError, match="missing_2.png.*not found"):
            shared_index(path, img_dir, "error")
        with pytest.raises(DataError, match="category ids differ"):
            shared_index(path, img_dir, "skip", cat_ids=[4, 7, 9])
    # outside the span every reader reads the files again: a json fixed in between is seen
    assert shared_index(path, img_dir, "skip") is not first
    write_coco(str(tmp_path), [(1, "a.png", 100, 50, [])], [ann(1, 1, [10, 5, 30, 20])])
    with sharing_indexes():
        fixed = shared_index(path, img_dir, "error")
        assert [r["id"] for r in fixed.records] == [1] and not fixed.invalid
        assert shared_index(path, img_dir, "skip") is fixed


def test_invalid_annotation_rejected_with_error_switch(tmp_path):
    path = write_coco(str(tmp_path), [(1, "a.png", 100, 50, [])], [ann(1, 1, [10, 5, 30, 20]), ann(7, 1, [0, 0, 0, 9])])
    with pytest.raises(DataError) as err:
        CocoIndex(path, os.path.join(str(tmp_path), "img"), invalid="error")
    msg = str(err.value)
    assert path in msg and "annotation id 7" in msg and "data.coco.invalid=skip" in msg and "\n" not in msg
    path2 = write_coco(str(tmp_path / "m"), [(1, None, 10, 10, [])], [])
    with pytest.raises(DataError, match="missing_1.png.*not found"):
        CocoIndex(path2, str(tmp_path / "m" / "img"), invalid="error")


def test_crowd_skipped_in_training_kept_for_eval_and_ids_mapped(tmp_path):
    path = write_coco(str(tmp_path), [(1, "a.png", 64, 64, [])],
                      [ann(1, 1, [2, 2, 20, 20], cat=9), ann(2, 1, [30, 30, 20, 20], cat=4, crowd=1)])
    img_dir = os.path.join(str(tmp_path), "img")
    train = CocoDetection(path, img_dir, image_size=64, training=True, **PIXELS, hflip=0.0,
                          scale_range=(1.0, 1.0))
    _, boxes, classes, *_ = train[0]
    assert classes.tolist()[:2] == [1, -1]  # category 9 -> class 1 (ids sorted: 4, 9); crowd dropped
    ev = CocoDetection(path, img_dir, image_size=64, training=False, **PIXELS)
    assert sorted(ev[0][2].tolist()[:2]) == [0, 1]
    assert ev.cat_ids == [4, 9] and ev.classes == ["thing", "other"]
    assert len(ev.coco_gt.getAnnIds(iscrowd=True)) == 1


def test_max_instances_and_loader_batch_contract(tmp_path):
    anns = [ann(i + 1, 1, [i % 10 * 6, i // 10 * 6, 5, 5]) for i in range(60)]
    path = write_coco(str(tmp_path), [(1, "a.png", 64, 64, []), (2, "b.png", 80, 40, []), (3, "c.png", 30, 60, [])],
                      anns + [ann(100, 2, [1, 1, 10, 10])])
    from ppdlx.data.coco import CocoLoader
    from ppdlx.data.samplers import EvalBatchSampler
    ds = CocoDetection(path, os.path.join(str(tmp_path), "img"), image_size=32, max_instances=50, **PIXELS)
    batches = list(CocoLoader(ds, EvalBatchSampler(len(ds), 2), workers=0))
    images, boxes, classes, ids, scales = batches[0]
    assert images.shape == [2, 3, 32, 32] and str(images.dtype) == "paddle.float32"
    assert boxes.shape == [2, 50, 4] and classes.shape == [2, 50] and str(classes.dtype) == "paddle.int64"
    assert int((classes[0] >= 0).sum()) == 50 and int((classes[1] >= 0).sum()) == 1  # truncated to 50
    assert ids.numpy().tolist() == [1, 2] and batches[1][3].numpy().tolist() == [3]
    np.testing.assert_allclose(scales.numpy(), [2.0, 2.5], rtol=1e-6)



def _edit_images(path, **by_id):
    """Rewrite image entries of the json: ``by_id["<id>"] = {key: value, or None to remove the key}``."""
    with open(path) as f:
        data = json.load(f)
    for info in data["images"]:
        for key, value in by_id.get(str(info["id"]), {}).items():
            if value is None:
                info.pop(key, None)
            else:
                info[key] = value
    with open(path, "w") as f:
        json.dump(data, f)


def _three_images(tmp_path):
    """Three 100x50 PNGs with one box each; the boxes reach x 90 (inside a 100-wide image)."""
    path = write_coco(str(tmp_path), [(k, f"{k}.png", 100, 50, []) for k in (1, 2, 3)],
                      [ann(k, k, [60, 5, 30, 20]) for k in (1, 2, 3)])
    return path, os.path.join(str(tmp_path), "img")


SWAPPED = ("the json says 50x100 but the file is 100x50 (width and height swapped: an EXIF-rotated photo?), so its "
           "boxes do not fit the picture: correct width/height (and the boxes) for this image in the json")


def test_json_size_that_disagrees_with_the_file_is_named_and_left_out(tmp_path, ppdlx_caplog):
    path, img_dir = _three_images(tmp_path)
    _edit_images(path, **{"1": {"width": 50, "height": 100}, "2": {"width": 64, "height": 64}})
    # Before: images 1 and 2 were kept and their boxes checked against, and clipped to, the json's wrong sizes
    # (image 1's box reaching x 90 was dropped as outside a 50-wide image, image 2 trained as 64x64).
    index = CocoIndex(path, img_dir, invalid="skip")
    assert [r["id"] for r in index.records] == [3]
    assert [(i[2], i[4]) for i in index.invalid] == [
        (1, SWAPPED),
        (2, "the json says 64x64 but the file is 100x50, so its boxes do not fit the picture: correct width/height "
            "(and the boxes) for this image in the json")]
    assert f"{path}: image id 1 (1.png): {SWAPPED} (skipped)" in ppdlx_caplog.text
    assert [a["id"] for a in index.gt_dataset["annotations"]] == [3]
    with pytest.raises(DataError) as err:
        CocoIndex(path, img_dir, invalid="error")
    assert str(err.value) == (f"{path}: image id 1 (1.png): {SWAPPED}; fix the annotation file or set "
                              f"data.coco.invalid=skip to leave such entries out")


def test_image_without_size_in_the_json_takes_the_file_size(tmp_path, ppdlx_caplog):
    path, img_dir = _three_images(tmp_path)
    _edit_images(path, **{"2": {"width": None, "height": None}, "3": {"width": 0}})
    # Before: width/height 0, so every box of images 2 and 3 was rejected as outside a 0x0 image.
    index = CocoIndex(path, img_dir, invalid="error")
    assert [(r["id"], r["width"], r["height"], len(r["boxes"])) for r in index.records] == [
        (1, 100.0, 50.0, 1), (2, 100.0, 50.0, 1), (3, 100.0, 50.0, 1)]
    assert [(i["width"], i["height"]) for i in index.gt_dataset["images"]] == [(100, 50)] * 3
    assert (f"{path}: 2 image(s) without a width/height in the json: their sizes were read from the image files"
            in ppdlx_caplog.text)
    # a box outside the real image is still named, with its annotation id
    path2, img_dir2 = _three_images(tmp_path / "outside")
    _edit_images(path2, **{"2": {"width": None, "height": None}})
    with open(path2) as f:
        data = json.load(f)
    data["annotations"][1]["bbox"] = [80, 5, 30, 20]  # x 80..110 in a 100-wide image
    with open(path2, "w") as f:
        json.dump(data, f)
    with pytest.raises(DataError, match=r"annotation id 2 \(image id 2, 2\.png\): bbox \[80, 5, 30, 20\] outside the "
                                        r"100\.0x50\.0 image"):
        CocoIndex(path2, img_dir2, invalid="error")


def test_val_categories_that_differ_from_train_are_named(tmp_path):
    path, img_dir = _three_images(tmp_path)  # categories 4 and 9
    # Before: "category ids [4, 9] differ from the training split's [4, 7, 9]" (up to ten of each listed).
    with pytest.raises(DataError) as err:
        CocoIndex(path, img_dir, cat_ids=[4, 7, 9])
    assert str(err.value) == (f"{path}: category ids differ from the training split's (missing 7); both splits must "
                              f"list the same categories")


def test_duplicate_image_ids_are_an_error_naming_both_files(tmp_path):
    # Before: pycocotools' createIndex kept the last image of the id and gave it the boxes of both, silently.
    path = write_coco(str(tmp_path), [(1, "a.png", 100, 50, []), (1, "b.png", 100, 50, []), (2, "c.png", 100, 50, [])],
                      [ann(1, 1, [10, 5, 30, 20]), ann(2, 2, [10, 5, 30, 20])])
    refused_whatever_invalid_says(path, os.path.join(str(tmp_path), "img"), (
        f"{path}: duplicate image id 1: images 'a.png' and 'b.png'; their annotations cannot be assigned to one of "
        f"them: give every image its own id and point each annotation's image_id at its image"))


def refused_whatever_invalid_says(path, img_dir, message):
    """``CocoIndex`` raises ``message`` under data.coco.invalid=skip and =error alike."""
    for invalid in ("skip", "error"):
        with pytest.raises(DataError) as err:
            CocoIndex(path, img_dir, invalid=invalid)
        assert str(err.value) == message


def test_annotations_of_absent_images_are_counted_in_one_line(tmp_path, ppdlx_caplog):
    # Before: pycocotools filed them under their image id, nothing read them, and nothing said so.
    anns = [ann(1, 1, [10, 5, 30, 20]), ann(10, 999, [10, 5, 30, 20]), ann(11, 998, [1, 1, 5, 5])]
    path = write_coco(str(tmp_path), [(1, "a.png", 100, 50, [])], anns)
    img_dir = os.path.join(str(tmp_path), "img")
    index = CocoIndex(path, img_dir, invalid="skip")
    assert [(r["id"], r["ann_ids"]) for r in index.records] == [(1, [1])]
    reason = "no image in the json's 'images' has this id"
    assert [i[1:] for i in index.invalid] == [(10, 999, "", reason), (11, 998, "", reason)]
    lines = [r.getMessage() for r in ppdlx_caplog.records if "no image has" in r.getMessage()]
    assert lines == [f"{path}: 2 annotation(s) of an image id that no image has (first: annotation id 10, image id "
                     f"999); left out"]
    with pytest.raises(DataError) as err:
        CocoIndex(path, img_dir, invalid="error")
    assert str(err.value) == (f"{path}: annotation id 10 (image id 999): {reason}; fix the annotation file or set "
                              f"data.coco.invalid=skip to leave such entries out")


def test_no_usable_image_says_how_many_went_for_which_reason(tmp_path):
    # Before: "no usable images (image files under ...)", whatever the reason.
    path, img_dir = _three_images(tmp_path)
    _edit_images(path, **{"1": {"width": 50, "height": 25}, "2": {"width": 50, "height": 25}})
    os.remove(os.path.join(img_dir, "3.png"))
    with pytest.raises(DataError) as err:
        CocoIndex(path, img_dir, invalid="skip")
    assert str(err.value) == (
        f"{path}: no usable images: all 3 images were left out (2 with json width/height that disagree with the "
        f"file, 1 whose file is not under {img_dir}; first: image id 1 (1.png): the json says 50x25 but the file is "
        f"100x50, so its boxes do not fit the picture: correct width/height (and the boxes) for this image in the "
        f"json); fix the json's images (file_name, width, height) or the image files, then run tools/check_data.py")
    empty = write_coco(str(tmp_path / "empty"), [], [])
    with pytest.raises(DataError) as err:
        CocoIndex(empty, img_dir)
    assert str(err.value) == (f"{empty}: no usable images: its 'images' list is empty; add the images (file_name, "
                              f"width, height)")


def test_a_file_name_outside_the_image_folder_is_named_and_left_out(tmp_path, ppdlx_caplog):
    # Before: "../outside.png" and an absolute path (e.g. a val image: a train/val leak) were read and trained on,
    # with no word.
    path = write_coco(str(tmp_path), [(1, "a.png", 100, 50, []), (2, "b.png", 100, 50, [])],
                      [ann(1, 1, [10, 5, 30, 20]), ann(2, 2, [10, 5, 30, 20]), ann(3, 3, [1, 1, 5, 5]),
                       ann(4, 4, [1, 1, 5, 5])])
    img_dir = os.path.join(str(tmp_path), "img")
    Image.new("RGB", (100, 50)).save(tmp_path / "outside.png")
    _edit_images(path, **{"2": {"file_name": "../outside.png"}})
    with open(path) as f:
        doc = json.load(f)
    doc["images"].append({"id": 3, "file_name": str(tmp_path / "outside.png"), "width": 100, "height": 50})
    doc["images"].append({"id": 4, "file_name": "./a.png", "width": 100, "height": 50})  # stays inside
    with open(path, "w") as f:
        json.dump(doc, f)
    index = CocoIndex(path, img_dir, invalid="skip")
    assert [r["id"] for r in index.records] == [1, 4]
    assert [i[2:] for i in index.invalid] == [
        (2, "../outside.png", f"file_name '../outside.png' leaves the image folder {img_dir} (through '..')"),
        (3, str(tmp_path / "outside.png"), f"file_name '{tmp_path / 'outside.png'}' is an absolute path, outside "
                                           f"the image folder {img_dir}")]
    assert f"{path}: image id 2 (../outside.png): file_name '../outside.png' leaves the image folder" in \
        ppdlx_caplog.text
    with pytest.raises(DataError) as err:
        CocoIndex(path, img_dir, invalid="error")
    assert str(err.value) == (f"{path}: image id 2 (../outside.png): file_name '../outside.png' leaves the image "
                              f"folder {img_dir} (through '..'); fix the annotation file or set data.coco.invalid=skip "
                              f"to leave such entries out")


def test_duplicate_annotation_ids_are_an_error_naming_the_ids(tmp_path):
    # Before: accepted; pycocotools keys annotations by id, so evaluation scored against the wrong boxes (the same
    # model: AP 0.0011 instead of 0.0013).
    path = write_coco(str(tmp_path), [(1, "a.png", 100, 50, []), (2, "b.png", 100, 50, [])],
                      [ann(1, 1, [10, 5, 30, 20]), ann(1, 2, [50, 5, 30, 20]), ann(2, 2, [10, 5, 30, 20]),
                       ann(7, 1, [1, 1, 5, 5]), ann(7, 2, [1, 1, 5, 5]), ann(7, 2, [2, 2, 5, 5])])
    refused_whatever_invalid_says(path, os.path.join(str(tmp_path), "img"), (
        f"{path}: 2 duplicate annotation id(s): 1, 7 (id 1 is given 2 times, on image ids 1, 2); COCO evaluation keys "
        f"annotations by id and would score against the wrong boxes: give every annotation its own id"))


def test_an_area_that_is_not_a_number_is_named_and_left_out(tmp_path, ppdlx_caplog):
    # Before: tools/check_data.py ended in a ValueError traceback (float('big')), evaluation in a TypeError.
    anns = [ann(1, 1, [10, 5, 30, 20]), dict(ann(2, 1, [50, 5, 30, 20]), area="big"), ann(3, 1, [1, 1, 5, 5])]
    del anns[2]["area"]  # no area at all is fine: COCO's evaluation then has none to sort by, as pycocotools allows
    path = write_coco(str(tmp_path), [(1, "a.png", 100, 50, [])], anns)
    index = CocoIndex(path, os.path.join(str(tmp_path), "img"), invalid="skip")
    assert index.records[0]["ann_ids"] == [1, 3]
    assert [i[1:] for i in index.invalid] == [(2, 1, "a.png", "malformed area 'big' (expected the object's area in "
                                                              "pixels, a number, or no 'area' key)")]


@pytest.mark.parametrize("backend", ["paddle", "dali"])
def test_training_says_when_max_instances_caps_an_images_boxes(tmp_path, ppdlx_caplog, backend):
    # Before: the boxes past data.coco.max_instances were dropped from every sample without a word.
    if backend == "dali":
        pytest.importorskip("nvidia.dali")
    from ppdlx.config import load_config
    from ppdlx.data.coco import build_coco_loader
    from ppdlx.tasks.preprocess import resolve_preprocessing
    anns = [ann(i + 1, 1, [i % 10 * 6, i // 10 * 6, 5, 5]) for i in range(60)]
    anns += [ann(200 + i, 2, [i, 1, 5, 5], crowd=int(i >= 40)) for i in range(45)]  # 40 once crowd is left out
    root = str(tmp_path)
    write_coco(root, [(1, "a.png", 64, 64, []), (2, "b.png", 80, 40, []), (3, "c.png", 30, 60, [])],
               anns + [ann(100, 3, [1, 1, 10, 10])])
    cfg = resolve_preprocessing(load_config(os.path.join(ROOT, "configs", "demo", "efficientdet_demo.yaml"), [
        f"data.root={root}", "data.coco.train_json=ann.json", "data.coco.val_json=ann.json",
        "data.coco.train_images=img", "data.coco.val_images=img", "data.coco.max_instances=40", "data.batch_size=1",
        f"data.backend={backend}", "data.workers=0"]))
    with ppdlx_caplog.at_level(logging.WARNING, logger="ppdlx.data"):
        build_coco_loader(cfg, "train")
        build_coco_loader(cfg, "val")  # evaluation scores against the json, not the padded boxes: nothing to say
    lines = [r.getMessage() for r in ppdlx_caplog.records if "max_instances" in r.getMessage()]
    assert lines == [f"{root}/ann.json: 1 training image(s) hold more than data.coco.max_instances=40 boxes (up to "
                     f"60, in image id 1 (a.png)); a sample carries at most 40: raise data.coco.max_instances to "
                     f"train on all"]
