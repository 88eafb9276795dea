"""One COCO split as the detection loaders see it: ``CocoIndex`` validates it (its invalid entries are the ones
training leaves out), the boxes it keeps are counted here (per image, per category, COCO area range, at the
image border), and the image files are decoded as the configured loader decodes them (``data_scan``)."""
from __future__ import annotations

import contextlib
import logging

import numpy as np

from ppdlx.analysis.data_scan import SplitReport, decode_split, file_digests
from ppdlx.data.coco import CocoDetection, shared_index
from ppdlx.errors import DataError


def area_thresholds():
    """(small/medium, medium/large) area limits, from pycocotools' own evaluation parameters."""
    from pycocotools.cocoeval import Params  # optional (ppdlx[coco]): only COCO data are scanned with it
    ranges = dict(zip(Params(iouType="bbox").areaRngLbl, Params(iouType="bbox").areaRng))
    return float(ranges["small"][1]), float(ranges["medium"][1])


def area_range(area: float, limits) -> str:
    """COCO's size name of a box area. pycocotools' ranges share their end points (an area of exactly
    32**2 is both small and medium there); here a box on a boundary goes to the larger range."""
    small, medium = limits
    return "small" if area < small else "medium" if area < medium else "large"


class _DecodeProbe(CocoDetection):
    """The detection dataset's own decode (``CocoDetection.__getitem__``); the transform returns the size, so
    the dataset's pre-processing settings are never used."""

    def __init__(self, image_dir, index):
        super().__init__(None, image_dir, index=index, image_size=1, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0),
                         interpolation="bilinear")

    def transform(self, img, rec, rng):
        return img.size, rec["boxes"][:0], rec["labels"][:0], 1.0


@contextlib.contextmanager
def _quiet_index_warnings():
    """``CocoIndex`` logs each invalid entry; the report lists them itself."""
    logger = logging.getLogger("ppdlx.data")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _border(x, y, w, h, width, height):
    """'leaving' when the box reaches past the image, 'touching' when an edge lies on the border."""
    if x < 0 or y < 0 or x + w > width or y + h > height:
        return "leaving"
    if x == 0 or y == 0 or x + w == width or y + h == height:
        return "touching"
    return None


def scan_coco_split(json_path: str, image_dir: str, name: str, backend: str, decode=True, hash_files=True):
    """A ``SplitReport`` of one COCO json + image directory."""
    report = SplitReport(name=name, source=json_path)
    try:
        with _quiet_index_warnings():
            index = shared_index(json_path, image_dir, invalid="skip")
    except DataError as err:
        report.error = str(err)
        return report
    report.classes, report.cat_ids = list(index.class_names), list(index.cat_ids)
    report.invalid = [(ann_id, image_id, file, reason) for _, ann_id, image_id, file, reason in index.invalid]
    report.sized_from_file = index.sized_from_file
    label_of = {cid: i for i, cid in enumerate(index.cat_ids)}
    k = len(index.cat_ids)
    report.class_counts, report.category_images = [0] * k, [0] * k
    limits = area_thresholds()
    report.areas = {"small": 0, "medium": 0, "large": 0}
    records = {r["id"]: r for r in index.records}
    boxes_of = {image_id: [] for image_id in records}
    for ann in index.gt_dataset["annotations"]:
        rec = records[int(ann["image_id"])]
        x, y, w, h = (float(v) for v in ann["bbox"])
        label = label_of[ann["category_id"]]
        boxes_of[rec["id"]].append((x, y, w, h, label))
        report.class_counts[label] += 1
        report.crowd += bool(ann.get("iscrowd", 0))
        report.areas[area_range(float(ann.get("area") or w * h), limits)] += 1
        border = _border(x, y, w, h, rec["width"], rec["height"])
        if border == "leaving":
            report.leaving += 1
        elif border == "touching":
            report.touching += 1
    for rec in index.records:
        report.paths.append(rec["path"])
        report.image_boxes.append(boxes_of[rec["id"]])
        for label in {b[4] for b in boxes_of[rec["id"]]}:
            report.category_images[label] += 1
    if decode:
        decode_split(report, backend, lambda: (_DecodeProbe(image_dir, index), report.paths))
        for rec in index.records:
            decoded = report.sizes.get(rec["path"])
            expected = (int(rec["width"]), int(rec["height"]))
            if decoded is not None and tuple(decoded) != expected:
                report.size_mismatch.append((rec["path"], expected, tuple(decoded)))
    else:
        report.sizes = {r["path"]: (int(r["width"]), int(r["height"])) for r in index.records}
    if hash_files:
        report.digests = file_digests(report.paths)
    return report


def boxes_per_image_summary(split: SplitReport) -> dict:
    counts = np.asarray([len(b) for b in split.image_boxes], np.int64)
    if not len(counts):
        return {"mean": 0.0, "max": 0, "without_boxes": 0}
    return {"mean": float(counts.mean()), "max": int(counts.max()), "without_boxes": int((counts == 0).sum())}
