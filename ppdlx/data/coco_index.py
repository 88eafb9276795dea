"""COCO-json annotations, read with the pycocotools COCO API and validated once, up front.

An annotation with a zero/negative-size or malformed box, a box outside the image (by more than
1 px; up to 1 px is clipped) or an unknown category id, an image whose file is missing, and an
image whose ``width``/``height`` disagree with its file, an image whose ``file_name`` leaves the image folder
(absolute, or through '..') and an annotation whose ``area`` is not a number, is reported with the json file,
annotation id and image (``data.coco.invalid: skip``: logged and left out; ``error``:
``DataError``); so is an annotation whose ``image_id`` no image has (counted in one line). Two
images with one id stop whatever the switch says: their annotations cannot be assigned. When no
image is left, the error counts the images left out per reason. Each image's size is read from its
file header (PIL opens lazily: the header only), once: boxes are checked against the real image, and
an image the json gives no size fills it in from the file. A json size that disagrees (swapped, or
another image's) means the boxes were drawn for some other picture, so that image is not trained on
(PaddleDetection's reader clips boxes to the json size and its decoder then warns per sample, every
epoch). Category ids map to contiguous 0-based class indices in ascending id order (``cat_ids[label]``
maps back). Both loaders (paddle.io and DALI) read a
split through one ``CocoIndex``.
"""
from __future__ import annotations

import contextlib
import io
import logging
import math
import os

import numpy as np

from ppdlx.data.image_file import open_image
from ppdlx.data.image_folder import quoted
from ppdlx.errors import DataError, quote

log = logging.getLogger("ppdlx.data")

BOX_TOLERANCE = 1.0  # px a box may extend beyond the image before it counts as invalid (it is clipped)
MAX_REPORTED = 20    # invalid annotations listed one per line; the rest are counted


def load_coco_api(json_path: str):
    """pycocotools ``COCO`` for a file, quietly; one-line ``DataError`` if missing or malformed."""
    from pycocotools.coco import COCO  # optional (ppdlx[coco]): only COCO data need it
    if not os.path.isfile(json_path):
        raise DataError(f"{json_path}: annotation file not found (set data.root / data.coco.*_json, or run "
                        f"tools/make_synthetic_coco.py for the demo data)")
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return COCO(json_path)
    except (ValueError, KeyError, TypeError, AssertionError) as err:
        raise DataError(f"{json_path}: not a COCO annotation file ({type(err).__name__}: {err})") from None


def coco_from_dict(dataset: dict):
    from pycocotools.coco import COCO  # optional (ppdlx[coco]): only COCO data need it
    coco = COCO()
    coco.dataset = dataset
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


def _check_box(bbox, width, height):
    """Problem with a COCO ``[x, y, w, h]`` box, or None."""
    if not isinstance(bbox, (list, tuple)) or len(bbox) != 4:
        return f"malformed bbox {bbox!r} (expected [x, y, w, h])"
    try:
        x, y, w, h = (float(v) for v in bbox)
    except (TypeError, ValueError):
        return f"malformed bbox {bbox!r}"
    if not all(math.isfinite(v) for v in (x, y, w, h)):
        return f"non-finite bbox {bbox!r}"
    if w <= 0 or h <= 0:
        return f"zero or negative size bbox {bbox!r}"
    t = BOX_TOLERANCE
    if x < -t or y < -t or x + w > width + t or y + h > height + t:
        return f"bbox {bbox!r} outside the {width}x{height} image"
    return None


def _check_area(ann: dict):
    """Problem with an annotation's ``area`` (COCO's evaluation sorts boxes into small/medium/large by it), or None
    when it is a number or absent."""
    area = ann.get("area")
    if area is None or (isinstance(area, (int, float)) and not isinstance(area, bool) and math.isfinite(area)
                        and area >= 0):
        return None
    return f"malformed area {quote(area)} (expected the object's area in pixels, a number, or no 'area' key)"


def _outside_folder(name: str, image_dir: str):
    """Why a ``file_name`` points outside ``image_dir`` (an absolute path, or one climbing out with '..'), or None.
    Such an entry reads a file the data set does not hold: with an absolute path to a val image, training would
    learn the val split."""
    if not isinstance(name, str):
        return f"file_name {quote(name)} is not a path"
    if not name:
        return None
    if os.path.isabs(name):
        return f"file_name {quote(name)} is an absolute path, outside the image folder {image_dir}"
    if os.path.normpath(name).split(os.sep)[0] == os.pardir:
        return f"file_name {quote(name)} leaves the image folder {image_dir} (through '..')"
    return None


def _positive_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def header_size(path: str):
    """``(width, height)`` from the image file's header (PIL decodes no pixels for it), None if unreadable."""
    try:
        with open_image(path) as img:
            return img.size
    except (OSError, ValueError, SyntaxError):
        return None  # the loaders report an undecodable file by name when they reach it


# Why an image is left out (counted for the line that says why none is left, if none is).
_NO_FILE = "no file"
_UNSIZED = "no width/height in the json and an unreadable file header"
_MISSIZED = "json width/height that disagree with the file"
_OUTSIDE = "a file_name outside the image folder"


def _checked_size(info: dict, path: str):
    """``(width, height)`` of an image: the json's when it has them (checked against the file header), else the
    file's; ``(_UNSIZED | _MISSIZED, what is wrong)`` when the two disagree or neither is known."""
    json_w, json_h = info.get("width"), info.get("height")
    file_size = header_size(path)
    if not (_positive_number(json_w) and _positive_number(json_h)):
        if file_size is None:
            return _UNSIZED, (f"no valid width/height in the json ({json_w!r} x {json_h!r}) and the file's header "
                              f"cannot be read")
        return float(file_size[0]), float(file_size[1])
    if file_size is not None and (round(json_w), round(json_h)) != tuple(file_size):
        swapped = (round(json_h), round(json_w)) == tuple(file_size)
        return _MISSIZED, (f"the json says {json_w}x{json_h} but the file is {file_size[0]}x{file_size[1]}"
                           f"{' (width and height swapped: an EXIF-rotated photo?)' if swapped else ''}, so its "
                           f"boxes do not fit the picture: correct width/height (and the boxes) for this image in "
                           f"the json")
    return float(json_w), float(json_h)


class CocoIndex:
    """The validated content of one COCO json: images (with files), boxes, labels, categories."""

    def __init__(self, json_path: str, image_dir: str, invalid: str = "skip", cat_ids=None):
        self.json_path, self.image_dir = json_path, image_dir
        coco = load_coco_api(json_path)
        cats = sorted(coco.dataset.get("categories", []), key=lambda c: c["id"])
        if not cats:
            raise DataError(f"{json_path}: no 'categories' in the annotation file")
        self.cat_ids = [int(c["id"]) for c in cats]
        self.class_names = [str(c.get("name", c["id"])) for c in cats]
        self.categories = cats
        if cat_ids is not None and list(cat_ids) != self.cat_ids:
            missing = [c for c in cat_ids if c not in self.cat_ids]
            extra = [c for c in self.cat_ids if c not in cat_ids]
            diff = "; ".join(f"{what} {quoted(ids)}" for what, ids in (("missing", missing), ("extra", extra)) if ids)
            raise DataError(f"{json_path}: category ids differ from the training split's ({diff}); both splits must "
                            f"list the same categories")
        _refuse_duplicate_image_ids(json_path, coco.dataset.get("images") or [])
        _refuse_duplicate_annotation_ids(json_path, coco.dataset.get("annotations") or [])
        label_of = {cid: i for i, cid in enumerate(self.cat_ids)}
        self.invalid: list = []  # (json, annotation id or None, image id, file name, reason)
        left_out_images = {}     # why an image was left out -> [count, first (image id, file name, reason)]
        self.records = []        # dicts: id, file, path, width, height, boxes xyxy, labels, crowd, ann_ids
        kept_anns = []
        sized_from_file = 0
        for image_id in sorted(coco.imgs):
            info = coco.imgs[image_id]
            name = info.get("file_name", "")
            path = os.path.join(image_dir, name)
            outside = _outside_folder(name, image_dir)
            if outside:
                self._leave_out(left_out_images, _OUTSIDE, invalid, image_id, name, outside)
                continue
            if not name or not os.path.isfile(path):
                self._leave_out(left_out_images, _NO_FILE, invalid, image_id, name, f"image file {path} not found")
                continue
            size = _checked_size(info, path)
            if isinstance(size[0], str):
                self._leave_out(left_out_images, size[0], invalid, image_id, name, size[1])
                continue
            width, height = size
            if not _positive_number(info.get("width")) or not _positive_number(info.get("height")):
                sized_from_file += 1
            boxes, labels, crowd, ann_ids = [], [], [], []
            for ann in coco.imgToAnns.get(image_id, []):
                cid = ann.get("category_id")
                reason = None
                if cid not in label_of:
                    reason = f"unknown category id {cid!r} (categories: {self.cat_ids[:10]})"
                else:
                    reason = _check_box(ann.get("bbox"), width, height) or _check_area(ann)
                if reason:
                    self._report(invalid, ann.get("id"), image_id, name, reason)
                    continue
                x, y, w, h = (float(v) for v in ann["bbox"])
                x1, y1 = min(max(x, 0.0), width), min(max(y, 0.0), height)
                x2, y2 = min(max(x + w, 0.0), width), min(max(y + h, 0.0), height)
                boxes.append((x1, y1, x2, y2))
                labels.append(label_of[cid])
                crowd.append(bool(ann.get("iscrowd", 0)))
                ann_ids.append(ann.get("id"))
                kept_anns.append(ann)
            self.records.append(dict(
                id=int(image_id), file=name, path=path, width=width, height=height,
                boxes=np.asarray(boxes, np.float32).reshape(-1, 4), labels=np.asarray(labels, np.int64),
                crowd=np.asarray(crowd, bool), ann_ids=ann_ids))
        if len(self.invalid) > MAX_REPORTED:
            log.warning("%s: %d invalid annotations/images skipped in total (first %d listed above)",
                        json_path, len(self.invalid), MAX_REPORTED)
        self._leave_out_orphans(coco, invalid)
        self.sized_from_file = sized_from_file
        if sized_from_file:
            log.warning("%s: %d image(s) without a width/height in the json: their sizes were read from the image "
                        "files", json_path, sized_from_file)
        if not self.records:
            raise DataError(_no_usable_images(json_path, image_dir, len(coco.imgs), left_out_images))
        self.gt_dataset = {
            "info": coco.dataset.get("info", {}), "categories": cats,
            "images": [dict(coco.imgs[r["id"]], width=int(r["width"]), height=int(r["height"]))
                       for r in self.records],
            "annotations": kept_anns,
        }
        self._coco_gt = None

    def _leave_out(self, left_out: dict, why: str, mode, image_id, name, reason) -> None:
        """An image not trained on: reported as any invalid entry, and counted by ``why`` for the line that says
        why no image is left, if none is."""
        self._report(mode, None, image_id, name, reason)
        tally = left_out.setdefault(why, [0, (image_id, name, reason)])
        tally[0] += 1

    def _leave_out_orphans(self, coco, mode) -> None:
        """Annotations whose ``image_id`` no image has (pycocotools' ``createIndex`` files them under that id and
        nothing reads them): one line with their count and the first; ``data.coco.invalid=error`` stops."""
        orphans = [a for a in coco.dataset.get("annotations") or [] if a.get("image_id") not in coco.imgs]
        if not orphans:
            return
        reason = "no image in the json's 'images' has this id"
        first = orphans[0]
        if mode == "error":
            self._report(mode, first.get("id"), first.get("image_id"), "", reason)
        self.invalid += [(self.json_path, a.get("id"), a.get("image_id"), "", reason) for a in orphans]
        log.warning("%s: %d annotation(s) of an image id that no image has (first: annotation id %s, image id %s); "
                    "left out", self.json_path, len(orphans), first.get("id"), first.get("image_id"))

    def _report(self, mode, ann_id, image_id, name, reason):
        what = f"annotation id {ann_id} (image id {image_id}{', ' + name if name else ''})" if ann_id is not None \
            else f"image id {image_id} ({name or 'no file_name'})"
        if mode == "error":
            raise DataError(f"{self.json_path}: {what}: {reason}; fix the annotation file or set "
                            f"data.coco.invalid=skip to leave such entries out")
        self.invalid.append((self.json_path, ann_id, image_id, name, reason))
        if len(self.invalid) <= MAX_REPORTED:
            log.warning("%s: %s: %s (skipped)", self.json_path, what, reason)

    @property
    def coco_gt(self):
        """pycocotools ``COCO`` of the kept images and valid annotations (crowd included)."""
        if self._coco_gt is None:
            self._coco_gt = coco_from_dict(self.gt_dataset)
        return self._coco_gt

    @property
    def image_ids(self):
        return [r["id"] for r in self.records]


_SHARED = None  # while sharing_indexes() is active: (json file and its stat, image dir) -> CocoIndex


@contextlib.contextmanager
def sharing_indexes():
    """Within: :func:`shared_index` builds one ``CocoIndex`` per json, so the start-of-training data check, the
    loaders and the evaluator of one run parse a large json, read its image headers and report its invalid
    entries once. Only for the span of building a run: outside it every call reads the files again (a json or
    image fixed in between is seen)."""
    global _SHARED
    outer = _SHARED
    _SHARED = {} if outer is None else outer
    try:
        yield
    finally:
        _SHARED = outer


def shared_index(json_path: str, image_dir: str, invalid: str = "skip", cat_ids=None) -> CocoIndex:
    """``CocoIndex(json_path, image_dir, invalid, cat_ids)``, or the one built for the same files within
    :func:`sharing_indexes`: a shared index serves any ``invalid`` mode when it left nothing out, and any
    ``cat_ids`` equal to its own; otherwise a new index is built (and raises where it must)."""
    if _SHARED is None or not os.path.isfile(json_path):
        return CocoIndex(json_path, image_dir, invalid, cat_ids)
    stat = os.stat(json_path)
    key = (os.path.realpath(json_path), stat.st_mtime_ns, stat.st_size, os.path.realpath(image_dir))
    index = _SHARED.get(key)
    if index is not None and (invalid == "skip" or not index.invalid) and \
            (cat_ids is None or list(cat_ids) == index.cat_ids):
        return index
    index = CocoIndex(json_path, image_dir, invalid, cat_ids)
    if invalid == "skip" or not index.invalid:
        _SHARED[key] = index
    return index


def _refuse_duplicate_image_ids(json_path: str, images: list) -> None:
    """Two images with one id: their annotations cannot be told apart (pycocotools' ``createIndex`` keeps the last
    image of an id and gives it the boxes of both), so this stops whatever ``data.coco.invalid`` says."""
    first_of, duplicates = {}, []
    for image in images:
        image_id = image.get("id")
        if image_id in first_of:
            duplicates.append((image_id, first_of[image_id].get("file_name"), image.get("file_name")))
        else:
            first_of[image_id] = image
    if duplicates:
        image_id, first, second = duplicates[0]
        more = f" ({len(duplicates)} duplicate image ids in total)" if len(duplicates) > 1 else ""
        raise DataError(f"{json_path}: duplicate image id {image_id!r}: images {first!r} and {second!r}{more}; their "
                        f"annotations cannot be assigned to one of them: give every image its own id and point each "
                        f"annotation's image_id at its image")


def _refuse_duplicate_annotation_ids(json_path: str, annotations: list) -> None:
    """Two annotations with one id: pycocotools keys annotations by id, so its evaluation matches detections against
    the last box of an id in each image holding one (the wrong ground truth, a wrong AP); stops whatever
    ``data.coco.invalid`` says, in every split, before anything trains or is scored."""
    images_of = {}
    for ann in annotations:
        if isinstance(ann, dict) and ann.get("id") is not None:
            images_of.setdefault(ann["id"], []).append(ann.get("image_id"))
    duplicates = [(ann_id, images) for ann_id, images in images_of.items() if len(images) > 1]
    if duplicates:
        shown = ", ".join(quote(ann_id) for ann_id, _ in duplicates[:10]) + (", ..." if len(duplicates) > 10 else "")
        first, images = duplicates[0]
        raise DataError(f"{json_path}: {len(duplicates)} duplicate annotation id(s): {shown} (id {quote(first)} is "
                        f"given {len(images)} times, on image ids {', '.join(quote(i) for i in images[:5])}); COCO "
                        f"evaluation keys annotations by id and would score against the wrong boxes: give every "
                        f"annotation its own id")


def _no_usable_images(json_path: str, image_dir: str, listed: int, left_out: dict) -> str:
    """Why a json left no image to read: how many images went for each reason, the first, and the fix."""
    if not listed:
        return f"{json_path}: no usable images: its 'images' list is empty; add the images (file_name, width, height)"
    counts = ", ".join(f"{n} whose file is not under {image_dir}" if why == _NO_FILE else f"{n} with {why}"
                       for why, (n, _) in sorted(left_out.items(), key=lambda kv: -kv[1][0]))
    image_id, name, reason = max(left_out.values(), key=lambda tally: tally[0])[1]
    return (f"{json_path}: no usable images: all {listed} images were left out ({counts}; first: image id "
            f"{image_id} ({name or 'no file_name'}): {reason}); fix the json's images (file_name, width, height) or "
            f"the image files, then run tools/check_data.py")


def coco_paths(cfg, split: str):
    """(json path, image dir) of ``split`` ("train"/"val") from ``cfg.data``."""
    c, root = cfg.data.coco, cfg.data.root
    json_path = c.train_json if split == "train" else c.val_json
    image_dir = c.train_images if split == "train" else c.val_images
    return tuple(p if os.path.isabs(p) else os.path.join(root, p) for p in (json_path, image_dir))


class IndexedByCoco:
    """What the paddle.io and DALI COCO readers tell their callers about the annotations (``self.index``)."""

    @property
    def classes(self):
        return self.index.class_names

    @property
    def cat_ids(self):
        return self.index.cat_ids

    @property
    def coco_gt(self):
        return self.index.coco_gt

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
