"""timm-semantics RandAugment and random erasing for the paddle.io path (DALI: ``dali_augment``), from a numpy
Generator.

Both follow ``timm.data.auto_augment.rand_augment_transform`` / ``timm.data.random_erasing``
(the recipe of GPUNet / EfficientNet: ``--aa rand-m9-mstd0.5 --reprob 0.2 --remode pixel``);
randomness comes only from the caller's ``np.random.Generator`` (seeded per sample from
``(seed, epoch, index)``), so a sample's augmentation is reproducible and independent of
the worker count, as the rest of ``ppdlx.data.transforms``.

RandAugment (``"rand-m9-mstd0.5"``: sections ``m`` magnitude, ``n`` ops per image (default 2),
``mstd`` magnitude std, ``mmax`` magnitude cap (default 10), ``inc1`` the "increasing" op set,
``p`` per-op probability (default 0.5)):

* ``n`` ops are drawn uniformly **with** replacement from timm's ``_RAND_TRANSFORMS``:
  AutoContrast, Equalize, Invert, Rotate, Posterize, Solarize, SolarizeAdd, Color, Contrast,
  Brightness, Sharpness, ShearX, ShearY, TranslateXRel, TranslateYRel.
* each op runs with probability ``p``; its magnitude is ``N(m, mstd)`` (``mstd=inf``:
  ``U(0, m)``) clipped to ``[0, mmax]``, then mapped as timm (``level = magnitude / 10``):
  rotate ``30*level`` degrees, shear ``0.3*level``, translate ``0.45*level`` of the size
  (the three randomly negated), enhance factor ``1.8*level + 0.1``, posterize
  ``int(4*level)`` bits kept, solarize threshold ``int(256*level)``, solarize-add
  ``int(110*level)`` below 128.
* geometric ops fill with the dataset mean (``round(mean)`` in 0..255, timm's ``img_mean``) and
  resample with the configured interpolation (timm: ``train_interpolation``; its "random" choice
  between bilinear and bicubic is available here as ``interpolation="random"``).

Random erasing (timm ``RandomErasing``, count 1): with probability ``p`` one rectangle of area
``U(0.02, 1/3)`` of the image and aspect ``exp(U(log 0.3, log 1/0.3))`` (10 attempts to fit) is
replaced, in the *normalised* image, by per-pixel ``N(0, 1)`` noise (``pixel``), one ``N(0, 1)``
colour per channel (``rand``) or zeros (``const``).
"""
from __future__ import annotations

import math

import numpy as np
from PIL import Image, ImageEnhance, ImageOps

from ppdlx.config.randaugment import LEVEL_DENOM, RandAugmentSpec, parse_rand_augment
from ppdlx.errors import ConfigError

_RESAMPLE = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "nearest": Image.NEAREST}

RAND_TRANSFORMS = ("AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize", "SolarizeAdd", "Color",
                   "Contrast", "Brightness", "Sharpness", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")
RAND_INCREASING_TRANSFORMS = ("AutoContrast", "Equalize", "Invert", "Rotate", "PosterizeIncreasing",
                              "SolarizeIncreasing", "SolarizeAdd", "ColorIncreasing", "ContrastIncreasing",
                              "BrightnessIncreasing", "SharpnessIncreasing", "ShearX", "ShearY", "TranslateXRel",
                              "TranslateYRel")


# ------------------------------------------------------------------------------ image ops
def _affine(img, matrix, resample, fill):
    return img.transform(img.size, Image.AFFINE, matrix, resample=resample, fillcolor=fill)


def shear_x(img, factor, resample, fill):
    return _affine(img, (1, factor, 0, 0, 1, 0), resample, fill)


def shear_y(img, factor, resample, fill):
    return _affine(img, (1, 0, 0, factor, 1, 0), resample, fill)


def translate_x_rel(img, pct, resample, fill):
    return _affine(img, (1, 0, pct * img.size[0], 0, 1, 0), resample, fill)


def translate_y_rel(img, pct, resample, fill):
    return _affine(img, (1, 0, 0, 0, 1, pct * img.size[1]), resample, fill)


def rotate(img, degrees, resample, fill):
    return img.rotate(degrees, resample=resample, fillcolor=fill)


def posterize(img, bits, **_):
    return img if bits >= 8 else ImageOps.posterize(img, bits)


def solarize(img, threshold, **_):
    return ImageOps.solarize(img, threshold)


def solarize_add(img, add, threshold=128, **_):
    lut = [min(255, i + add) if i < threshold else i for i in range(256)]
    if img.mode not in ("L", "RGB"):
        return img
    return img.point(lut * 3 if img.mode == "RGB" else lut)


def _enhance(cls):
    def op(img, factor, **_):
        return cls(img).enhance(factor)
    return op


_OPS = {
    "AutoContrast": lambda img, **_: ImageOps.autocontrast(img),
    "Equalize": lambda img, **_: ImageOps.equalize(img),
    "Invert": lambda img, **_: ImageOps.invert(img),
    "Rotate": rotate, "ShearX": shear_x, "ShearY": shear_y,
    "TranslateXRel": translate_x_rel, "TranslateYRel": translate_y_rel,
    "Posterize": posterize, "PosterizeIncreasing": posterize,
    "Solarize": solarize, "SolarizeIncreasing": solarize, "SolarizeAdd": solarize_add,
    "Color": _enhance(ImageEnhance.Color), "ColorIncreasing": _enhance(ImageEnhance.Color),
    "Contrast": _enhance(ImageEnhance.Contrast), "ContrastIncreasing": _enhance(ImageEnhance.Contrast),
    "Brightness": _enhance(ImageEnhance.Brightness), "BrightnessIncreasing": _enhance(ImageEnhance.Brightness),
    "Sharpness": _enhance(ImageEnhance.Sharpness), "SharpnessIncreasing": _enhance(ImageEnhance.Sharpness),
}
_GEOMETRIC = {"Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel"}


# ------------------------------------------------------------------- magnitude -> argument
def _negate(v, rng):
    return -v if rng.random() > 0.5 else v


def level_to_arg(name: str, magnitude: float, rng):
    """timm's ``LEVEL_TO_ARG``: the op argument for a (clipped) magnitude; may draw a sign."""
    level = magnitude / LEVEL_DENOM
    if name == "Rotate":
        return _negate(level * 30.0, rng)
    if name in ("ShearX", "ShearY"):
        return _negate(level * 0.3, rng)
    if name in ("TranslateXRel", "TranslateYRel"):
        return _negate(level * 0.45, rng)
    if name in ("Color", "Contrast", "Brightness", "Sharpness"):
        return level * 1.8 + 0.1
    if name.endswith("Increasing") and name[:-len("Increasing")] in ("Color", "Contrast", "Brightness", "Sharpness"):
        return max(0.1, 1.0 + _negate(level * 0.9, rng))
    if name == "Posterize":
        return int(level * 4)
    if name == "PosterizeIncreasing":
        return 4 - int(level * 4)
    if name == "Solarize":
        return int(level * 256)
    if name == "SolarizeIncreasing":
        return 256 - int(level * 256)
    if name == "SolarizeAdd":
        return int(level * 110)
    return None  # AutoContrast, Equalize, Invert


# ------------------------------------------------------------------------------ RandAugment
def rand_augment_ops(spec: RandAugmentSpec) -> tuple:
    """The op names ``spec`` draws from: timm's increasing set with ``inc1``, its default set otherwise."""
    return RAND_INCREASING_TRANSFORMS if spec.increasing else RAND_TRANSFORMS


class RandAugment:
    """``RandAugment(spec, fill=(124, 116, 104), interpolation="bicubic")(pil_img, rng) -> pil_img``."""

    def __init__(self, spec, fill=(128, 128, 128), interpolation: str = "bicubic"):
        self.spec = parse_rand_augment(spec) if isinstance(spec, str) else spec
        self.fill = tuple(int(v) for v in fill)
        if interpolation != "random" and interpolation not in _RESAMPLE:
            raise ConfigError(f"RandAugment interpolation {interpolation!r}: use bilinear, bicubic or random")
        self.interpolation = interpolation

    def sample_magnitude(self, rng) -> float:
        s = self.spec
        m = s.magnitude
        if s.magnitude_std == float("inf"):
            m = rng.uniform(0.0, m)
        elif s.magnitude_std > 0:
            m = rng.normal(m, s.magnitude_std)
        return float(min(max(m, 0.0), s.magnitude_max))

    def _resample(self, rng):
        if self.interpolation == "random":
            return (Image.BILINEAR, Image.BICUBIC)[int(rng.integers(0, 2))]
        return _RESAMPLE[self.interpolation]

    def apply_op(self, name: str, img, rng):
        """One timm ``AugmentOp(name, prob=spec.prob)`` call."""
        if self.spec.prob < 1.0 and rng.random() > self.spec.prob:
            return img
        arg = level_to_arg(name, self.sample_magnitude(rng), rng)
        op = _OPS[name]
        if name in _GEOMETRIC:
            return op(img, arg, resample=self._resample(rng), fill=self.fill if img.mode == "RGB" else self.fill[0])
        return op(img) if arg is None else op(img, arg)

    def choose_ops(self, rng):
        ops = rand_augment_ops(self.spec)
        return [ops[i] for i in rng.integers(0, len(ops), size=self.spec.num_layers)]

    def __call__(self, img, rng):
        for name in self.choose_ops(rng):
            img = self.apply_op(name, img, rng)
        return img


def rand_augment_fill(mean) -> tuple:
    """timm's ``img_mean``: the fill of geometric ops, the dataset mean per channel in 0..255."""
    fill = tuple(min(255, int(round(v))) for v in mean)
    return fill * 3 if len(fill) == 1 else fill  # one mean for every channel: PIL would fill red alone


def build_rand_augment(cfg):
    """The RandAugment of a ``TransformsConfig`` (``randaugment`` string) or None."""
    spec = getattr(cfg, "randaugment", None)
    if not spec:
        return None
    return RandAugment(parse_rand_augment(spec), fill=rand_augment_fill(cfg.mean), interpolation=cfg.interpolation)


# --------------------------------------------------------------------------- random erasing
def random_erasing(arr: np.ndarray, rng, probability: float, mode: str = "pixel", data_format: str = "NCHW",
                   min_area: float = 0.02, max_area: float = 1.0 / 3.0, min_aspect: float = 0.3):
    """timm ``RandomErasing`` (count 1) on one normalised float image (CHW or HWC); in place, returned."""
    if probability <= 0 or rng.random() > probability:
        return arr
    chw = data_format == "NCHW"
    c, h, w = (arr.shape if chw else (arr.shape[2], arr.shape[0], arr.shape[1]))
    area = h * w
    log_ratio = (math.log(min_aspect), math.log(1.0 / min_aspect))
    for _ in range(10):
        target_area = rng.uniform(min_area, max_area) * area
        aspect = math.exp(rng.uniform(*log_ratio))
        eh = int(round(math.sqrt(target_area * aspect)))
        ew = int(round(math.sqrt(target_area / aspect)))
        if ew < w and eh < h:
            top = int(rng.integers(0, h - eh + 1))
            left = int(rng.integers(0, w - ew + 1))
            if mode == "pixel":
                patch = rng.standard_normal((c, eh, ew), dtype=np.float32)
            elif mode == "rand":
                patch = np.broadcast_to(rng.standard_normal((c, 1, 1), dtype=np.float32), (c, eh, ew))
            else:
                patch = np.zeros((c, eh, ew), np.float32)
            if chw:
                arr[:, top:top + eh, left:left + ew] = patch
            else:
                arr[top:top + eh, left:left + ew, :] = patch.transpose(1, 2, 0)
            break
    return arr
