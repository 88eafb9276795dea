"""check_data on the synthetic COCO shapes set with planted faults: a corrupt val image, a val image that is a
copy of a training image, a box reaching 0.5 px past the border, a box 6 px outside (invalid), a crowd box,
a category without training boxes, categories that differ between the splits."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from ppdlx.analysis import check_data
from ppdlx.config import load_config
from ppdlx.data.synthetic_coco import make_synthetic_coco

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "demo", "efficientdet_demo.yaml")


def cfg_for(root, *extra):
    from ppdlx.tasks.preprocess import resolve_preprocessing  # the nulls: the model's default_cfg
    return resolve_preprocessing(load_config(CONFIG, [f"data.root={root}", "data.workers=0", "data.batch_size=4",
                                                      *extra]))


def load_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def save_json(path, data):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f)


@pytest.fixture
def shapes(tmp_path):
    root = str(tmp_path / "shapes")
    paths = make_synthetic_coco(root, num_train=24, num_val=8)
    train = load_json(paths["train"])
    size = {im["id"]: (im["width"], im["height"]) for im in train["images"]}
    a0, a1, a2 = train["annotations"][:3]
    w0, _ = size[a0["image_id"]]
    a0["bbox"][2] = w0 - a0["bbox"][0] + 0.5        # 0.5 px past the right edge: clipped by the loader
    w1, _ = size[a1["image_id"]]
    a1["bbox"][0] = w1 - a1["bbox"][2] + 6.0        # 6 px past: invalid, left out
    a2["iscrowd"] = 1
    for a in (a0, a1):
        a["area"] = a["bbox"][2] * a["bbox"][3]
    save_json(paths["train"], train)
    val = load_json(paths["val"])
    corrupt = os.path.join(root, "val", val["images"][2]["file_name"])
    with open(corrupt, "wb") as f:
        f.write(b"\xff\xd8 broken jpeg")
    copy = os.path.join(root, "val", val["images"][1]["file_name"])
    source = os.path.join(root, "train", train["images"][0]["file_name"])
    shutil.copyfile(source, copy)
    # a duplicate as it happens: the same picture with its own size in the json (one of another size than the json
    # says is an invalid image, left out: test_size_that_disagrees_with_the_json_is_an_invalid_image)
    val["images"][1]["width"], val["images"][1]["height"] = train["images"][0]["width"], train["images"][0]["height"]
    save_json(paths["val"], val)
    return {"root": root, "json": paths, "corrupt": corrupt, "copy": copy, "source": source,
            "invalid_id": a1["id"], "leaving_id": a0["id"]}


def expected_stats(json_path, drop_ids=()):
    """The counts check_data should find, computed here from the json with COCO's definitions."""
    data = load_json(json_path)
    size = {im["id"]: (im["width"], im["height"]) for im in data["images"]}
    anns = [a for a in data["annotations"] if a["id"] not in drop_ids]
    cats = sorted(c["id"] for c in data["categories"])
    per_image = [sum(a["image_id"] == im["id"] for a in anns) for im in sorted(data["images"], key=lambda i: i["id"])]
    out = {"boxes": len(anns), "per_image": per_image,
           "per_category": [sum(a["category_id"] == c for a in anns) for c in cats],
           "images_per_category": [len({a["image_id"] for a in anns if a["category_id"] == c}) for c in cats],
           "small": sum(a["area"] < 32 ** 2 for a in anns),
           "medium": sum(32 ** 2 <= a["area"] < 96 ** 2 for a in anns),
           "large": sum(a["area"] >= 96 ** 2 for a in anns),
           "crowd": sum(a.get("iscrowd", 0) for a in anns), "leaving": 0, "touching": 0}
    for a in anns:
        x, y, w, h = a["bbox"]
        width, height = size[a["image_id"]]
        if x < 0 or y < 0 or x + w > width or y + h > height:
            out["leaving"] += 1
        elif x == 0 or y == 0 or x + w == width or y + h == height:
            out["touching"] += 1
    return out


def test_coco_counts_and_planted_faults(shapes):
    report = check_data(cfg_for(shapes["root"]))
    train, val = report.splits["train"], report.splits["val"]
    want = expected_stats(shapes["json"]["train"], drop_ids={shapes["invalid_id"]})
    assert train.classes == ["circle", "square", "triangle"] and train.cat_ids == [1, 3, 7]
    assert train.boxes == want["boxes"]
    assert [len(b) for b in train.image_boxes] == want["per_image"]
    assert train.class_counts == want["per_category"]
    assert train.category_images == want["images_per_category"]
    assert train.areas == {"small": want["small"], "medium": want["medium"], "large": want["large"]}
    assert train.crowd == want["crowd"] == 1
    assert train.leaving == want["leaving"] == 1
    assert train.touching == want["touching"] and train.touching > 0
    assert [i[0] for i in train.invalid] == [shapes["invalid_id"]]
    assert "outside the" in train.invalid[0][3]
    assert val.unreadable == [(shapes["corrupt"], "cannot be decoded (PIL: cannot identify image file)")]
    assert report.duplicates == [(shapes["copy"], shapes["source"])]
    json_size = next((im["width"], im["height"]) for im in load_json(shapes["json"]["val"])["images"]
                     if im["file_name"] == os.path.basename(shapes["copy"]))
    with Image.open(shapes["source"]) as img:
        file_size = img.size
    assert (json_size != file_size) == bool(val.size_mismatch)
    assert report.problems == []
    assert any(w.startswith(f"{shapes['json']['train']}: 1 invalid annotation/image (first: annotation id "
                            f"{shapes['invalid_id']}") for w in report.warnings)


def test_unreadable_images_are_the_ones_the_coco_loader_skips(shapes):
    from ppdlx.data.coco import build_coco_loader
    cfg = cfg_for(shapes["root"])
    loader = build_coco_loader(cfg, "val")
    for _ in loader:
        pass
    report = check_data(cfg, hash_files=False)
    assert [p for p, _ in report.splits["val"].unreadable] == loader.skipped_files == [shapes["corrupt"]]


def test_category_without_training_boxes_and_mismatch_stop(shapes):
    train_json = shapes["json"]["train"]
    data = load_json(train_json)
    data["annotations"] = [a for a in data["annotations"] if a["category_id"] != 7]
    save_json(train_json, data)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "check_data.py"), "-c", CONFIG, "--samples",
                           "5", "--out", os.path.join(shapes["root"], "report"), "-o", f"data.root={shapes['root']}"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: {train_json}: 1 category without boxes ('triangle'); add boxes of it to the json or remove it from "
        f"'categories' in every split's json (class indices follow the sorted category ids)")
    row = next(r for r in proc.stdout.splitlines() if r.startswith("triangle "))
    assert row.split()[:4] == ["triangle", "0", "0", str(expected_stats(shapes["json"]["val"])["per_category"][2])]
    pytest.importorskip("matplotlib")
    with Image.open(os.path.join(shapes["root"], "report", "data_samples.png")) as img:
        assert img.size == (4 * 240, 50 + 2 * 240)  # 5 images: 4 columns, 2 rows of 240 px, 50 px title
        assert np.asarray(img.convert("L"), np.float32).var() > 100.0

    data["categories"] = data["categories"][:2]
    save_json(train_json, data)
    report = check_data(cfg_for(shapes["root"], "model.num_classes=2"), decode=False, hash_files=False)
    assert report.problems == [f"category ids differ between {train_json} [1, 3] and {shapes['json']['val']} "
                               f"[1, 3, 7]; both splits must list the same categories"]


def test_size_that_disagrees_with_the_json_is_an_invalid_image(shapes):
    # Before: not seen by the start-of-training check (it decodes nothing); the image trained with boxes checked
    # against the json's size.
    val_json = shapes["json"]["val"]
    val = load_json(val_json)
    image = val["images"][4]
    width, height = image["width"], image["height"]
    image["width"], image["height"] = height, width
    save_json(val_json, val)
    reason = (f"the json says {height}x{width} but the file is {width}x{height} (width and height swapped: an "
              f"EXIF-rotated photo?), so its boxes do not fit the picture: correct width/height (and the boxes) for "
              f"this image in the json")
    report = check_data(cfg_for(shapes["root"]), decode=False, hash_files=False)
    assert report.splits["val"].invalid == [(None, image["id"], image["file_name"], reason)]
    assert f"{val_json}: 1 invalid annotation/image (first: image id {image['id']}: {reason}); left out " \
           f"(data.coco.invalid=skip)" in report.warnings
    stop = check_data(cfg_for(shapes["root"], "data.coco.invalid=error"), decode=False, hash_files=False)
    assert f"{val_json}: 1 invalid annotation/image (first: image id {image['id']}: {reason}); data.coco.invalid=error " \
           f"stops on them: fix them in the json, or set data.coco.invalid=skip to train without them" \
           in stop.problems


def test_a_training_json_without_any_box_is_one_line_with_the_fix(shapes):
    # Before: "3 categories without boxes ('circle', 'square', 'triangle')", which names no fix and hides that
    # nothing at all is left to train on.
    train_json = shapes["json"]["train"]
    data = load_json(train_json)
    images = len(data["images"])
    data["annotations"] = []
    save_json(train_json, data)
    report = check_data(cfg_for(shapes["root"]), decode=False, hash_files=False)
    assert report.problems == [f"{train_json}: no box to train on ({images} usable images, 0 valid annotations); a "
                               f"detector needs boxes: add annotations to the json"]
    # every box invalid: the line says so, with the first reason
    data["annotations"] = [{"id": k + 1, "image_id": im["id"], "category_id": data["categories"][0]["id"],
                            "bbox": [0, 0, 0, 0], "area": 0.0, "iscrowd": 0} for k, im in enumerate(data["images"])]
    save_json(train_json, data)
    report = check_data(cfg_for(shapes["root"]), decode=False, hash_files=False)
    assert report.problems == [
        f"{train_json}: no box to train on ({images} usable images, 0 valid annotations, {images} invalid "
        f"annotations/images left out (first: zero or negative size bbox [0, 0, 0, 0])); a detector needs boxes: add "
        f"annotations to the json or fix the invalid ones"]


def test_images_without_a_size_in_the_json_are_said_by_the_start_of_training_check(shapes):
    # Before: CocoIndex logged it while the check built the shared index with its lines muted, and every later reader
    # reused that index: training never said it (fault battery case coco_no_width_height: SILENT).
    train_json = shapes["json"]["train"]
    train = load_json(train_json)
    for image in train["images"][:3]:
        image.pop("width"), image.pop("height")
    save_json(train_json, train)
    report = check_data(cfg_for(shapes["root"]), decode=False, hash_files=False)
    assert report.splits["train"].sized_from_file == 3
    assert f"{train_json}: 3 images without a width/height in the json: their sizes were read from the image files" \
        in report.warnings
