"""Classification transforms on PIL images, driven by an explicit numpy Generator.

They read resolved ``data.transforms`` values (``ppdlx.engine.preprocess_cfg``: nulls are the model's
``default_cfg``) and refuse a null one.

Randomness comes from the caller's generator (seeded per sample from
(seed, epoch, index)), so a sample's augmentation does not depend on worker
count or on whether the run was resumed: this is what makes kill-and-resume
bit-identical.
"""
from __future__ import annotations

import math

import numpy as np
from PIL import Image

from ppdlx.config.preprocess import CLASSIFICATION_KEYS, require_resolved
from ppdlx.data.augment import build_rand_augment, random_erasing

PIL_INTERPOLATION = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}


def random_resized_crop_box(width, height, scale, ratio, rng, attempts=10):
    """(left, top, w, h) of a random crop covering ``scale`` of the area at aspect ``ratio``."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(attempts):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1)), w, h
    # Fallback: centre crop at the closest allowed aspect ratio.
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        w, h = int(round(height * ratio[1])), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def resize_shorter(img: Image.Image, size: int, interpolation: str) -> Image.Image:
    w, h = img.size
    if w <= h:
        new_w, new_h = size, max(1, int(round(h * size / w)))
    else:
        new_w, new_h = max(1, int(round(w * size / h))), size
    return img.resize((new_w, new_h), PIL_INTERPOLATION[interpolation])


def center_crop(img: Image.Image, size: int) -> Image.Image:
    w, h = img.size
    left, top = int(round((w - size) / 2.0)), int(round((h - size) / 2.0))
    return img.crop((left, top, left + size, top + size))


def normalize(img: Image.Image, mean, std, data_format: str) -> np.ndarray:
    arr = np.asarray(img, dtype=np.float32)
    arr = (arr - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(arr.transpose(2, 0, 1) if data_format == "NCHW" else arr)


class TrainTransform:
    """Random-resized-crop -> horizontal flip -> normalise (the RN50 recipe).

    Optional (``ppdlx.data.augment``, timm order): RandAugment after the flip, random erasing
    on the normalised array.
    """

    def __init__(self, cfg, data_format="NCHW"):
        require_resolved(cfg, CLASSIFICATION_KEYS)
        self.cfg, self.data_format = cfg, data_format
        self.randaugment = build_rand_augment(cfg)

    def __call__(self, img: Image.Image, rng: np.random.Generator) -> np.ndarray:
        c = self.cfg
        if c.random:
            left, top, w, h = random_resized_crop_box(img.width, img.height, c.scale, c.ratio, rng)
            img = img.resize((c.crop_size, c.crop_size), PIL_INTERPOLATION[c.interpolation],
                             box=(left, top, left + w, top + h))
            if rng.random() < c.hflip:
                img = img.transpose(Image.FLIP_LEFT_RIGHT)
            if self.randaugment is not None:
                img = self.randaugment(img, rng)
        else:
            img = center_crop(resize_shorter(img, c.resize_short, c.interpolation), c.crop_size)
        arr = normalize(img, c.mean, c.std, self.data_format)
        if c.random and c.random_erasing > 0:
            arr = random_erasing(arr, rng, c.random_erasing, c.random_erasing_mode, self.data_format)
        return arr


class EvalTransform:
    """Resize the shorter side -> centre crop -> normalise."""

    def __init__(self, cfg, data_format="NCHW"):
        require_resolved(cfg, CLASSIFICATION_KEYS)
        self.cfg, self.data_format = cfg, data_format

    def __call__(self, img: Image.Image, rng=None) -> np.ndarray:
        c = self.cfg
        img = center_crop(resize_shorter(img, c.resize_short, c.interpolation), c.crop_size)
        return normalize(img, c.mean, c.std, self.data_format)
