"""COCO-json detection dataset for paddle.io (``data.dataset: coco``, ``data.backend: paddle``).

Annotations are read with the pycocotools COCO API and validated once, up front: an
annotation with a zero/negative-size or malformed box, a box outside the image (by more
than 1 px; up to 1 px is clipped) or an unknown category id, and an image whose file is
missing, is reported with the json file, annotation id and image (``invalid: skip``: logged
and left out; ``invalid: error``: ``DataError``). Category ids map to contiguous 0-based
class indices in ascending id order (``cat_ids[label]`` maps back).

Transforms (numpy/PIL; randomness from ``(seed, epoch, index)`` as the classification path):

* train (``data.transforms.random``): horizontal flip with probability ``hflip``; scale
  jitter as the reference (automl ``InputProcessor``): ``r ~ U(scale_range)``, the image is
  resized to fit ``r * S`` (``image_scale = min(rS/h, rS/w)``), a random ``S x S`` window of
  it is taken (offset uniform over the part larger than S) and the rest padded bottom/right;
  boxes are scaled, shifted, clipped to the window and dropped when empty. Crowd boxes are
  left out (``skip_crowd``), at most ``max_instances`` boxes are kept.
* eval (and train with ``random: false``): resize so the longer side is S, keep the aspect
  ratio, pad bottom/right; ``image_scale = original / resized`` (what post-processing wants).

Images are normalised once here ((x - mean) / std with ``data.transforms.mean/std``, 0..255
scale); padding is 0 after normalisation (the mean colour). The model does not normalise again.

A sample is ``(image [3,S,S] float32, gt_boxes [max_instances,4] float32 yxyx in network-input
pixels, gt_classes [max_instances] int64 (-1 padding), image_id, image_scale)``.
"""
from __future__ import annotations

import contextlib
import io
import logging
import math
import os

import numpy as np
import paddle
from PIL import Image

from ppdlx.data.image_folder import sample_rng
from ppdlx.data.samplers import EvalBatchSampler, TrainBatchSampler
from ppdlx.errors import ConfigError, DataError
from ppdlx.registry import DATASETS

log = logging.getLogger("ppdlx.data")

_INTERP = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}
BOX_TOLERANCE = 1.0  # px a box may extend beyond the image before it counts as invalid (it is clipped)
MAX_REPORTED = 20    # invalid annotations listed one per line; the rest are counted


def load_coco_api(json_path: str):
    """pycocotools ``COCO`` for a file, quietly; one-line ``DataError`` if missing or malformed."""
    from pycocotools.coco import COCO
    if not os.path.isfile(json_path):
        raise DataError(f"{json_path}: annotation file not found (set data.root / data.coco.*_json, or run "
                        f"tools/make_synthetic_coco.py for the demo data)")
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return COCO(json_path)
    except (ValueError, KeyError, TypeError, AssertionError) as err:
        raise DataError(f"{json_path}: not a COCO annotation file ({type(err).__name__}: {err})") from None


def coco_from_dict(dataset: dict):
    from pycocotools.coco import COCO
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
            raise DataError(f"{json_path}: category ids {self.cat_ids[:10]} differ from the training split's "
                            f"{list(cat_ids)[:10]}; both splits must list the same categories")
        label_of = {cid: i for i, cid in enumerate(self.cat_ids)}
        self.invalid: list = []  # (json, annotation id or None, image id, file name, reason)
        self.records = []        # dicts: id, file, path, width, height, boxes xyxy, labels, crowd, ann_ids
        kept_anns = []
        for image_id in sorted(coco.imgs):
            info = coco.imgs[image_id]
            name = info.get("file_name", "")
            path = os.path.join(image_dir, name)
            if not name or not os.path.isfile(path):
                self._report(invalid, None, image_id, name, f"image file {path} not found")
                continue
            width, height = float(info.get("width", 0)), float(info.get("height", 0))
            boxes, labels, crowd, ann_ids = [], [], [], []
            for ann in coco.imgToAnns.get(image_id, []):
                cid = ann.get("category_id")
                reason = None
                if cid not in label_of:
                    reason = f"unknown category id {cid!r} (categories: {self.cat_ids[:10]})"
                else:
                    reason = _check_box(ann.get("bbox"), width, height)
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
        if not self.records:
            raise DataError(f"{json_path}: no usable images (image files under {image_dir})")
        kept_ids = {r["id"] for r in self.records}
        self.gt_dataset = {
            "info": coco.dataset.get("info", {}), "categories": cats,
            "images": [coco.imgs[i] for i in sorted(kept_ids)],
            "annotations": kept_anns,
        }
        self._coco_gt = None

    def _report(self, mode, ann_id, image_id, name, reason):
        what = f"annotation id {ann_id} (image id {image_id}, {name})" if ann_id is not None else \
            f"image id {image_id} ({name or 'no file_name'})"
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


def train_window(width, height, size, scale_range, rng):
    """The reference's random scale + crop: ``(scaled_w, scaled_h, offset_x, offset_y)`` (ints)."""
    r = rng.uniform(scale_range[0], scale_range[1])
    target = int(r * size)
    scale = min(target / height, target / width)
    sw, sh = max(1, int(width * scale)), max(1, int(height * scale))
    ox = int(max(0, sw - size) * rng.uniform(0.0, 1.0))
    oy = int(max(0, sh - size) * rng.uniform(0.0, 1.0))
    return sw, sh, ox, oy


def eval_size(width, height, size):
    """Longer side -> ``size`` keeping the aspect ratio: ``(scaled_w, scaled_h, image_scale)`` with
    ``image_scale = original / resized`` (the factor post-processing multiplies boxes by)."""
    scale = min(size / height, size / width)
    sw, sh = max(1, int(width * scale + 1e-4)), max(1, int(height * scale + 1e-4))
    return sw, sh, 1.0 / scale


def transform_boxes(boxes_xyxy, fx, fy, ox, oy, size):
    """Scale by (fx, fy), shift by (-ox, -oy), clip to [0, size], drop empty boxes.
    Returns ``(boxes xyxy, keep mask)``."""
    b = boxes_xyxy.astype(np.float32) * np.asarray([fx, fy, fx, fy], np.float32)
    b = b - np.asarray([ox, oy, ox, oy], np.float32)
    b = np.clip(b, 0.0, float(size))
    keep = ((b[:, 2] - b[:, 0]) > 0) & ((b[:, 3] - b[:, 1]) > 0)
    return b, keep


def pad_targets(boxes_xyxy, labels, max_instances):
    """xyxy boxes + labels -> fixed ``[max, 4]`` yxyx and ``[max]`` int64 with -1 padding."""
    out_b = np.zeros((max_instances, 4), np.float32)
    out_c = np.full((max_instances,), -1, np.int64)
    n = min(len(labels), max_instances)
    if n:
        out_b[:n] = boxes_xyxy[:n][:, [1, 0, 3, 2]]
        out_c[:n] = labels[:n]
    return out_b, out_c


@DATASETS.register("coco")
class CocoDetection:
    """Map-style dataset; ``dataset[i]`` -> ``(image, gt_boxes, gt_classes, image_id, image_scale, i)``
    (image None when the file cannot be decoded: the loader reports and drops it)."""

    def __init__(self, json_path, image_dir, image_size=512, training=False, mean=(123.675, 116.28, 103.53),
                 std=(58.395, 57.12, 57.375), hflip=0.5, scale_range=(0.1, 2.0), max_instances=100,
                 skip_crowd=True, invalid="skip", random=True, interpolation="bilinear", data_format="NCHW",
                 seed=0, cat_ids=None, index: CocoIndex | None = None):
        self.index = index or CocoIndex(json_path, image_dir, invalid, cat_ids)
        self.size = int(image_size)
        self.training, self.random = training, random
        self.mean = np.asarray(mean, np.float32)
        self.std = np.asarray(std, np.float32)
        self.hflip, self.scale_range = hflip, tuple(scale_range)
        self.max_instances, self.skip_crowd = max_instances, skip_crowd
        self.interp = _INTERP[interpolation]
        self.data_format = data_format
        self.seed, self.epoch = seed, 0

    # metadata
    @property
    def records(self):
        return self.index.records

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

    def __len__(self):
        return len(self.index.records)

    def __getitem__(self, index):
        rec = self.index.records[index]
        try:
            with Image.open(rec["path"]) as img:
                img = img.convert("RGB")
        except (OSError, ValueError, SyntaxError):
            return None, None, None, rec["id"], 1.0, index
        image, boxes, labels, image_scale = self.transform(img, rec, sample_rng(self.seed, self.epoch, index))
        gt_boxes, gt_classes = pad_targets(boxes, labels, self.max_instances)
        return image, gt_boxes, gt_classes, rec["id"], np.float32(image_scale), index

    def transform(self, img, rec, rng):
        """PIL image + record -> (normalised padded image, boxes xyxy, labels, image_scale)."""
        boxes, labels = rec["boxes"], rec["labels"]
        if self.training and self.skip_crowd:
            boxes, labels = boxes[~rec["crowd"]], labels[~rec["crowd"]]
        width, height = img.size
        size = self.size
        if self.training and self.random:
            if self.hflip > 0 and rng.uniform() < self.hflip:
                img = img.transpose(Image.FLIP_LEFT_RIGHT)
                boxes = np.stack([width - boxes[:, 2], boxes[:, 1], width - boxes[:, 0], boxes[:, 3]], 1) \
                    if len(boxes) else boxes
            sw, sh, ox, oy = train_window(width, height, size, self.scale_range, rng)
            image_scale = width / sw  # approximately; only eval uses it
        else:
            sw, sh, image_scale = eval_size(width, height, size)
            ox = oy = 0
        fx, fy = sw / width, sh / height
        cw, ch = min(size, sw - ox), min(size, sh - oy)
        # Resize only the window that survives the crop (same pixels as resize-then-crop).
        region = (ox / fx, oy / fy, (ox + cw) / fx, (oy + ch) / fy)
        crop = img.resize((cw, ch), self.interp, box=region)
        arr = (np.asarray(crop, np.float32) - self.mean) / self.std
        out = np.zeros((size, size, 3), np.float32)
        out[:ch, :cw] = arr
        if self.data_format == "NCHW":
            out = out.transpose(2, 0, 1)
        boxes, keep = transform_boxes(boxes.reshape(-1, 4), fx, fy, ox, oy, size)
        return np.ascontiguousarray(out), boxes[keep], labels[keep], image_scale


class _PaddleDataset(paddle.io.Dataset):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, index):
        return self.inner[index]


def _collate(batch):
    good = [s for s in batch if s[0] is not None]
    skipped = np.asarray([s[5] if s[0] is None else -1 for s in batch], dtype=np.int64)
    if not good:
        return (np.zeros((1,), np.float32), np.zeros((1, 1, 4), np.float32), np.full((1, 1), -1, np.int64),
                np.full((1,), -1, np.int64), np.ones((1,), np.float32), skipped)
    return (np.stack([s[0] for s in good]), np.stack([s[1] for s in good]), np.stack([s[2] for s in good]),
            np.asarray([s[3] for s in good], np.int64), np.asarray([s[4] for s in good], np.float32), skipped)


class CocoLoader:
    """Yields ``(images, gt_boxes, gt_classes, image_ids, image_scales)`` paddle tensors:
    ``[N,3,S,S]`` float32, ``[N,max,4]`` yxyx float32, ``[N,max]`` int64 (-1 pad), ``[N]`` int64,
    ``[N]`` float32 (original / resized). Undecodable images are reported once and dropped."""

    def __init__(self, dataset: CocoDetection, batch_sampler, workers: int):
        self.dataset = dataset
        self.batch_sampler = batch_sampler
        self.skipped_files: list = []
        self._loader = paddle.io.DataLoader(_PaddleDataset(dataset), batch_sampler=batch_sampler,
                                            collate_fn=_collate, num_workers=workers, return_list=True,
                                            use_shared_memory=workers > 0)

    @property
    def num_images(self):
        return len(self.dataset)

    @property
    def classes(self):
        return self.dataset.classes

    @property
    def cat_ids(self):
        return self.dataset.cat_ids

    @property
    def coco_gt(self):
        return self.dataset.coco_gt

    @property
    def image_size(self):
        return self.dataset.size

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)
        self.batch_sampler.set_epoch(epoch)

    def __len__(self):
        return len(self.batch_sampler)

    def __iter__(self):
        it = iter(self._loader)
        try:
            yield from self._batches(it)
        finally:
            # A consumer that stops early (steps_per_epoch, precise BN) would otherwise leave the
            # worker processes of this pass alive until the iterator is garbage collected.
            shutdown = getattr(it, "_try_shutdown_all", None)
            if shutdown is not None:
                shutdown()

    def _batches(self, it):
        for images, boxes, classes, ids, scales, skipped in it:
            for index in [i for i in np.asarray(skipped).reshape(-1).tolist() if i >= 0]:
                path = self.dataset.records[index]["path"]
                if path not in self.skipped_files:
                    self.skipped_files.append(path)
                    log.warning("skipping unreadable image %s (%d skipped so far)", path, len(self.skipped_files))
            if images.ndim == 1:
                continue
            yield images, boxes, classes, ids, scales


def coco_paths(cfg, split: str):
    """(json path, image dir) of ``split`` ("train"/"val") from ``cfg.data``."""
    c, root = cfg.data.coco, cfg.data.root
    json_path = c.train_json if split == "train" else c.val_json
    image_dir = c.train_images if split == "train" else c.val_images
    return tuple(p if os.path.isabs(p) else os.path.join(root, p) for p in (json_path, image_dir))


def build_coco_dataset(cfg, split: str, cat_ids=None) -> CocoDetection:
    data, c, t = cfg.data, cfg.data.coco, cfg.data.transforms
    json_path, image_dir = coco_paths(cfg, split)
    return CocoDetection(json_path, image_dir, image_size=c.image_size, training=split == "train", mean=t.mean,
                         std=t.std, hflip=t.hflip, scale_range=c.scale_range, max_instances=c.max_instances,
                         skip_crowd=c.skip_crowd, invalid=c.invalid, random=t.random, interpolation=t.interpolation,
                         data_format=cfg.model.data_format, seed=cfg.global_.seed, cat_ids=cat_ids)


def build_coco_loader(cfg, split: str, rank: int = 0, world_size: int = 1, batch_size=None, cat_ids=None):
    """Detection loader for ``split`` ("train" or "val"): paddle.io, or DALI with ``data.backend: dali``.
    Training batches are full and shuffled per epoch; val shards are disjoint (every image once)."""
    data = cfg.data
    batch_size = batch_size or data.batch_size
    if data.backend == "dali":
        try:
            from ppdlx.data import dali_coco
        except ImportError as err:
            raise ConfigError(f"data.backend=dali: NVIDIA DALI is not installed ({err}); "
                              f"pip install 'ppdlx[dali]' or set data.backend=paddle") from None
        return dali_coco.build_dali_coco_loader(cfg, split, rank, world_size, batch_size=batch_size, cat_ids=cat_ids)
    if data.backend != "paddle":
        raise ConfigError(f"data.backend={data.backend}: detection (data.dataset=coco) supports paddle or dali; "
                          f"for synthetic detection data run tools/make_synthetic_coco.py")
    dataset = build_coco_dataset(cfg, split, cat_ids)
    if split == "train":
        sampler = TrainBatchSampler(len(dataset), batch_size, rank, world_size, seed=cfg.global_.seed,
                                    shuffle=data.transforms.random)
        if len(sampler) == 0:
            raise ConfigError(f"data.batch_size={batch_size}: larger than the {len(dataset)} training images per "
                              f"rank ({dataset.index.json_path}); lower data.batch_size")
    else:
        sampler = EvalBatchSampler(len(dataset), batch_size, rank, world_size)
    return CocoLoader(dataset, sampler, data.workers)
