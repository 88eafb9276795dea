"""COCO detection samples and batches through paddle.io (``data.dataset: coco``, ``data.backend: paddle``).

Transforms (numpy/PIL; randomness from ``(seed, epoch, index)`` as the classification path): on
top of the shared window geometry (``coco_geometry``), training flips horizontally with
probability ``hflip``, leaves crowd boxes out (``skip_crowd``) and keeps at most
``max_instances`` boxes. Images are normalised once here ((x - mean) / std with
``data.transforms.mean/std``, 0..255 scale); padding is 0 after normalisation (the mean colour).
The model does not normalise again.

A sample is ``(image [3,S,S] float32, gt_boxes [max_instances,4] float32 yxyx in network-input
pixels, gt_classes [max_instances] int64 (-1 padding), image_id, image_scale)``.
"""
from __future__ import annotations

import numpy as np
from PIL import Image

from ppdlx.config.preprocess import require_detection_resolved
from ppdlx.data.coco_geometry import eval_size, pad_targets, record_boxes, train_window, transform_boxes
from ppdlx.data.coco_index import CocoIndex, IndexedByCoco, coco_paths, shared_index
from ppdlx.data.image_file import open_rgb
from ppdlx.data.image_folder import sample_rng
from ppdlx.data.loader_common import PaddleIOLoader
from ppdlx.data.transforms import PIL_INTERPOLATION
from ppdlx.registry import DATASETS


@DATASETS.register("coco")
class CocoDetection(IndexedByCoco):
    """Map-style dataset; ``dataset[i]`` -> ``(image, gt_boxes, gt_classes, image_id, image_scale, i)``
    (image None when the file cannot be decoded: the loader reports and drops it)."""

    def __init__(self, json_path, image_dir, *, image_size, mean, std, interpolation, training=False, hflip=0.5,
                 scale_range=(0.1, 2.0), max_instances=100, skip_crowd=True, invalid="skip", random=True,
                 data_format="NCHW", seed=0, cat_ids=None, index: CocoIndex | None = None):
        self.index = index or shared_index(json_path, image_dir, invalid, cat_ids)
        self.size = int(image_size)
        self.training, self.random = training, random
        self.mean = np.asarray(mean, np.float32)
        self.std = np.asarray(std, np.float32)
        self.hflip, self.scale_range = hflip, tuple(scale_range)
        self.max_instances, self.skip_crowd = max_instances, skip_crowd
        self.interp = PIL_INTERPOLATION[interpolation]
        self.data_format = data_format
        self.seed, self.epoch = seed, 0

    @staticmethod
    def folders_outside_root(cfg) -> list:
        """``[(setting, folder)]`` read besides ``data.root``: the image folders, which may be given elsewhere."""
        return [(f"data.coco.{split}_images", coco_paths(cfg, split)[1]) for split in ("train", "val")]

    # metadata
    @property
    def records(self):
        return self.index.records

    def __len__(self):
        return len(self.index.records)

    def __getitem__(self, index):
        rec = self.index.records[index]
        try:
            img = open_rgb(rec["path"])
        except (OSError, ValueError, SyntaxError):
            return None, None, None, rec["id"], 1.0, index
        image, boxes, labels, image_scale = self.transform(img, rec, sample_rng(self.seed, self.epoch, index))
        gt_boxes, gt_classes = pad_targets(boxes, labels, self.max_instances)
        return image, gt_boxes, gt_classes, rec["id"], np.float32(image_scale), index

    def transform(self, img, rec, rng):
        """PIL image + record -> (normalised padded image, boxes xyxy, labels, image_scale)."""
        width, height = img.size
        size = self.size
        random = self.training and self.random
        flip = random and self.hflip > 0 and rng.uniform() < self.hflip
        boxes, labels = record_boxes(rec, self.training and self.skip_crowd, width if flip else None)
        if flip:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        if random:
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


def eval_image(cfg, image):
    """``(normalised padded image, image_scale)``: one PIL image without annotations through the COCO eval
    transform of the resolved ``cfg``, exactly as the evaluator's loader transforms it (``tools/infer.py``)."""
    require_detection_resolved(cfg)
    t = cfg.data.transforms
    dataset = CocoDetection.__new__(CocoDetection)  # the transform's settings only: there is no json to index
    dataset.size, dataset.training, dataset.random = int(cfg.data.coco.image_size), False, False
    dataset.mean, dataset.std = np.asarray(t.mean, np.float32), np.asarray(t.std, np.float32)
    dataset.interp, dataset.data_format, dataset.skip_crowd = PIL_INTERPOLATION[t.interpolation], \
        cfg.model.data_format, False
    no_boxes = {"boxes": np.zeros((0, 4), np.float32), "labels": np.zeros((0,), np.int64),
                "crowd": np.zeros((0,), bool)}
    array, _, _, image_scale = dataset.transform(image, no_boxes, None)
    return array, image_scale


class CocoCollate:
    """A batch of samples -> its arrays (the ``PaddleIOLoader`` contract); with ``targets`` (a task's host target
    assigner, e.g. ``ppdlx.models.detection.HostTargets``) the anchor targets follow the image scales, assigned
    here in the loader's workers."""

    def __init__(self, targets=None):
        self.targets = targets

    def __call__(self, batch):
        good = [s for s in batch if s[0] is not None]
        skipped = np.asarray([s[5] if s[0] is None else -1 for s in batch], dtype=np.int64)
        if not good:  # 1-D images: the loader drops the batch; the other arrays only keep their ranks
            empty = (np.zeros((1,), np.float32), np.zeros((1, 1, 4), np.float32), np.full((1, 1), -1, np.int64),
                     np.full((1,), -1, np.int64), np.ones((1,), np.float32))
            extra = (np.full((1, 1), -1, np.int64), np.zeros((1, 1, 4), np.float32), np.zeros((1,), np.float32))
            return empty + (extra if self.targets is not None else ()) + (skipped,)
        arrays = (np.stack([s[0] for s in good]), np.stack([s[1] for s in good]), np.stack([s[2] for s in good]),
                  np.asarray([s[3] for s in good], np.int64), np.asarray([s[4] for s in good], np.float32))
        if self.targets is not None:
            arrays += self.targets(arrays[1], arrays[2])
        return arrays + (skipped,)


class CocoLoader(PaddleIOLoader, IndexedByCoco):
    """Yields ``(images, gt_boxes, gt_classes, image_ids, image_scales)`` paddle tensors:
    ``[N,3,S,S]`` float32, ``[N,max,4]`` yxyx float32, ``[N,max]`` int64 (-1 pad), ``[N]`` int64,
    ``[N]`` float32 (original / resized), and with ``targets`` the anchor targets it returns (``CocoCollate``).
    Undecodable images are reported once and dropped."""

    def __init__(self, dataset: CocoDetection, batch_sampler, workers: int, targets=None):
        super().__init__(dataset, batch_sampler, workers, CocoCollate(targets))
        self.source = dataset.index.json_path
        self.index = dataset.index  # the split's CocoIndex, as the DALI loader's
        self.image_size = dataset.size

    def path_of(self, index: int) -> str:
        return self.dataset.records[index]["path"]


def build_coco_dataset(cfg, split: str, cat_ids=None) -> CocoDetection:
    c, t = cfg.data.coco, cfg.data.transforms
    require_detection_resolved(cfg)
    json_path, image_dir = coco_paths(cfg, split)
    return CocoDetection(json_path, image_dir, image_size=c.image_size, training=split == "train", mean=t.mean,
                         std=t.std, hflip=t.hflip, scale_range=c.scale_range, max_instances=c.max_instances,
                         skip_crowd=c.skip_crowd, invalid=c.invalid, random=t.random, interpolation=t.interpolation,
                         data_format=cfg.model.data_format, seed=cfg.global_.seed, cat_ids=cat_ids)


