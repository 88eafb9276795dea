"""Classification transforms on PIL images, driven by an explicit numpy Generator.

They read resolved ``data.transforms`` values (``ppdlx.tasks.preprocess``: nulls are the model's
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

# The evaluation geometry is the deploy package's (it ships with ppdlx and cannot import it), so an
# export's pre-processing is the evaluator's by construction.
from ppdlx_deploy.preprocess import PIL_INTERPOLATION, center_crop, normalize, resize_shorter

from ppdlx.config.preprocess import CLASSIFICATION_KEYS, require_resolved
from ppdlx.data.augment import build_rand_augment, random_erasing


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
