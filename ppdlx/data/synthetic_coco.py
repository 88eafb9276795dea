"""A small COCO-format detection set of coloured shapes with exact boxes (seeded, no download).

``make_synthetic_coco(out_dir)`` writes::

    out_dir/train/*.jpg, out_dir/val/*.jpg
    out_dir/annotations/instances_train.json, instances_val.json

Each image has a light noisy background and 1..``max_objects`` non-overlapping shapes; the
class is the shape (circle / square / triangle), each with its own colour family, so the task
is easy enough for a from-scratch CPU run. Category ids are deliberately not 0..K-1 (1, 3, 7):
the pipeline must map them to contiguous indices and back. A box is the pixel extent of the
drawn shape: a shape drawn on pixel columns ``x0 .. x1-1`` has ``bbox = [x0, y0, x1-x0, y1-y0]``.
"""
from __future__ import annotations

import json
import os

import numpy as np
from PIL import Image, ImageDraw

CATEGORIES = [
    {"id": 1, "name": "circle", "supercategory": "shape"},
    {"id": 3, "name": "square", "supercategory": "shape"},
    {"id": 7, "name": "triangle", "supercategory": "shape"},
]
_COLOURS = {1: (220, 40, 40), 3: (40, 170, 40), 7: (40, 60, 220)}


def _draw(draw, cat_id, x0, y0, x1, y1, colour):
    if cat_id == 1:
        draw.ellipse((x0, y0, x1 - 1, y1 - 1), fill=colour)
    elif cat_id == 3:
        draw.rectangle((x0, y0, x1 - 1, y1 - 1), fill=colour)
    else:
        draw.polygon([(x0, y1 - 1), (x1 - 1, y1 - 1), ((x0 + x1 - 1) / 2.0, y0)], fill=colour)


def _overlaps(box, boxes, gap=2):
    x0, y0, x1, y1 = box
    return any(x0 < b[2] + gap and b[0] < x1 + gap and y0 < b[3] + gap and b[1] < y1 + gap for b in boxes)


def make_image(rng, size_range=(96, 160), object_range=(0.25, 0.6), max_objects=3):
    """One image and its objects ``[(cat_id, x0, y0, x1, y1)]`` (pixel-edge coordinates)."""
    w, h = (int(v) for v in rng.integers(size_range[0], size_range[1] + 1, 2))
    base = rng.integers(170, 245, 3)
    pixels = np.clip(base + rng.normal(0, 8, (h, w, 3)), 0, 255).astype(np.uint8)
    img = Image.fromarray(pixels)
    draw = ImageDraw.Draw(img)
    objects = []
    want = int(rng.integers(1, max_objects + 1))
    for _ in range(want * 20):
        if len(objects) == want:
            break
        side = min(w, h)
        bw = int(rng.uniform(*object_range) * side)
        bh = int(np.clip(bw * rng.uniform(0.75, 1.33), 8, h - 2))
        bw = max(8, min(bw, w - 2))
        x0, y0 = int(rng.integers(0, w - bw + 1)), int(rng.integers(0, h - bh + 1))
        box = (x0, y0, x0 + bw, y0 + bh)
        if _overlaps(box, [o[1:] for o in objects]):
            continue
        cat_id = int(rng.choice([c["id"] for c in CATEGORIES]))
        colour = tuple(int(np.clip(c + rng.integers(-25, 26), 0, 255)) for c in _COLOURS[cat_id])
        _draw(draw, cat_id, *box, colour)
        objects.append((cat_id,) + box)
    return img, objects


def make_split(out_dir, split, num_images, seed, size_range=(96, 160), object_range=(0.25, 0.6),
               max_objects=3, quality=92):
    """Write ``out_dir/<split>/*.jpg`` and ``out_dir/annotations/instances_<split>.json``; returns the json path."""
    rng = np.random.default_rng(seed)
    img_dir = os.path.join(out_dir, split)
    os.makedirs(img_dir, exist_ok=True)
    images, annotations = [], []
    for i in range(num_images):
        img, objects = make_image(rng, size_range, object_range, max_objects)
        name = f"{split}_{i:05d}.jpg"
        img.save(os.path.join(img_dir, name), quality=quality)
        image_id = i + 1
        images.append({"id": image_id, "file_name": name, "width": img.width, "height": img.height})
        for cat_id, x0, y0, x1, y1 in objects:
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": cat_id,
                                "bbox": [x0, y0, x1 - x0, y1 - y0], "area": float((x1 - x0) * (y1 - y0)),
                                "iscrowd": 0})
    os.makedirs(os.path.join(out_dir, "annotations"), exist_ok=True)
    path = os.path.join(out_dir, "annotations", f"instances_{split}.json")
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"images": images, "annotations": annotations, "categories": CATEGORIES}, f)
    os.replace(tmp, path)
    return path


def make_synthetic_coco(out_dir, num_train=256, num_val=32, seed=5, size_range=(64, 96),
                        object_range=(0.35, 0.7), max_objects=2):
    """Train and val splits (different seeds); returns ``{"train": json, "val": json}``."""
    return {split: make_split(out_dir, split, n, seed * 2 + k, size_range, object_range, max_objects)
            for k, (split, n) in enumerate((("train", num_train), ("val", num_val)))}
