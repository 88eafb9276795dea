"""timm's RandAugment and random erasing inside a DALI graph (CPU or GPU), on ``nvidia.dali.auto_aug``.

DALI's own ``rand_augment`` applies every sampled op with one fixed magnitude bin; timm's
``rand-m9-mstd0.5`` (``ppdlx.data.augment``, the paddle.io path) applies each of its ``n`` ops with
probability ``p`` at a magnitude drawn per op from ``N(m, mstd)`` clipped to ``[0, mmax]``, over its own
15-op set and level mapping. So this module keeps DALI's operators and its magnitude-bin mechanism
(``augmentation``: an op's parameter for every bin is computed once and indexed per sample), sends each
sample through the op its index names with DALI's conditional execution (the pipeline needs
``enable_conditionals``), and draws what timm draws:

* per image and layer: an op index uniform over the set (with replacement), a coin with probability
  ``p`` that replaces the op by the identity, a magnitude ``N(m, mstd)`` (``U(0, m)`` for ``mstd=inf``)
  clipped to ``[0, mmax]`` and rounded to ``MAGNITUDE_STEP`` (its bin), and a sign for the ops timm
  negates at random;
* each op's parameter from the magnitude as timm's ``LEVEL_TO_ARG`` (level = magnitude / 10): the
  ``mag_range`` of DALI's op spans timm's range over ``[0, mmax]``, and ``mag_to_param`` truncates where
  timm does (posterize bits, solarize thresholds and additions);
* geometric ops fill with the dataset mean per channel (timm's ``img_mean``): DALI's warps take one fill
  value for all channels, so the image is warped with its mean subtracted and fill 0.

What DALI's operators do differently from PIL's (``docs/data.md`` lists them with their size): warps
interpolate bilinearly (DALI's warps have no bicubic), equalize follows OpenCV's histogram formula,
sharpness also filters the 1-pixel border PIL leaves alone, and contrast blends towards the
luma-weighted mean of the image rather than its rounded grey mean.

Random erasing (timm ``RandomErasing``, count 1): ``erase_random_box`` draws timm's 10 attempts at once
and keeps the first that fits, then replaces the box, in the normalised image, by per-pixel N(0, 1)
noise (``pixel``), one N(0, 1) value per channel (``rand``) or zeros (``const``).
"""
from __future__ import annotations

import inspect
import math

import numpy as np
import nvidia.dali.fn as fn
import nvidia.dali.math as dmath
import nvidia.dali.types as types
from nvidia.dali.auto_aug import augmentations as dali_ops
from nvidia.dali.auto_aug.core import augmentation, signed_bin
from nvidia.dali.pipeline import do_not_convert

from ppdlx.config.randaugment import LEVEL_DENOM, RandAugmentSpec

MAGNITUDE_STEP = 0.01  # timm's magnitudes are continuous; DALI's are bins: 1001 of them over [0, 10]
_EPS = 1e-4  # a magnitude bin that lands a hair below an integer level must truncate as the exact value


@do_not_convert
def _bins(spec: RandAugmentSpec) -> int:
    return int(round(spec.magnitude_max / MAGNITUDE_STEP)) + 1


@do_not_convert  # AutoGraph converts whatever is defined inside a converted function, do_not_convert or not
def _unconverted(aug):
    """``aug`` called as plain Python inside ``select``'s branches. Under the pipeline's conditionals AutoGraph
    converts every function it traces, one transformation per call, and an augmentation's per-bin parameter
    table is a call per bin, sign and op: with timm's fine magnitudes that made building a pipeline take
    minutes (``docs/data.md``). Nothing in an augmentation branches on a DataNode (the branching is
    ``_apply_one``'s), so its call needs no conversion."""
    @do_not_convert
    def call(data, **kwargs):
        return aug(data, **kwargs)
    return call


# -------------------------------------------------------------------- timm's argument per magnitude
def _posterize_mask(bits_kept: float):
    """The AND mask of PIL's ``posterize(img, bits)`` (timm's bits; 0 keeps nothing, >= 8 everything)."""
    bits = int(min(8, max(0, math.floor(bits_kept + _EPS))))
    return np.uint8(0xFF ^ ((1 << (8 - bits)) - 1))


def _posterize_increasing_mask(level4: float):
    return _posterize_mask(4 - math.floor(level4 + _EPS))


def _solarize_threshold(value: float):
    return np.int32(min(256, math.floor(value + _EPS)))


def _solarize_increasing_threshold(value: float):
    return np.int32(256 - min(256, math.floor(value + _EPS)))


def _solarize_addition(value: float):
    return np.uint8(min(128, math.floor(value + _EPS)))


def _enhance_increasing(magnitude: float):
    return np.float32(max(0.1, 1.0 + magnitude))


def _sharpness_increasing(magnitude: float):
    return dali_ops.sharpness_kernel_shifted(max(0.1, 1.0 + magnitude))


@do_not_convert
def _with_mean_fill(aug):
    """``aug`` (a DALI warp) filling with the per-channel ``fill``: warped with the mean subtracted, fill 0."""
    op, takes_shape = aug.op, "shape" in inspect.signature(aug.op).parameters

    def warped(data, parameter, fill, shape=None, interp_type=None):
        extra = {"shape": shape} if takes_shape else {}
        out = op(fn.cast(data, dtype=types.FLOAT) - fill, parameter, fill_value=0.0, interp_type=interp_type, **extra)
        return fn.cast(out + fill, dtype=types.UINT8)

    return augmentation(warped, mag_range=aug.mag_range, randomly_negate=aug.randomly_negate,
                        mag_to_param=aug._mag_to_param, name=aug.name)


@do_not_convert
def timm_ops(spec: RandAugmentSpec) -> dict:
    """timm's op name -> a DALI augmentation whose parameter at magnitude ``v`` (bins over ``[0, mmax]``) is
    timm's ``LEVEL_TO_ARG[name](v)``."""
    top = spec.magnitude_max / LEVEL_DENOM  # the level at the last bin
    enhance = (0.1, 0.1 + 1.8 * top)  # 1.8 * level + 0.1, never negated
    ops = {
        "AutoContrast": dali_ops.auto_contrast,
        "Equalize": dali_ops.equalize,
        "Invert": dali_ops.invert,
        "Rotate": _with_mean_fill(dali_ops.rotate.augmentation(mag_range=(0.0, 30.0 * top), randomly_negate=True)),
        "ShearX": _with_mean_fill(dali_ops.shear_x.augmentation(mag_range=(0.0, 0.3 * top), randomly_negate=True)),
        "ShearY": _with_mean_fill(dali_ops.shear_y.augmentation(mag_range=(0.0, 0.3 * top), randomly_negate=True)),
        "TranslateXRel": _with_mean_fill(dali_ops.translate_x.augmentation(mag_range=(0.0, 0.45 * top),
                                                                           randomly_negate=True)),
        "TranslateYRel": _with_mean_fill(dali_ops.translate_y.augmentation(mag_range=(0.0, 0.45 * top),
                                                                           randomly_negate=True)),
        "Posterize": dali_ops.posterize.augmentation(mag_range=(0.0, 4.0 * top), mag_to_param=_posterize_mask),
        "PosterizeIncreasing": dali_ops.posterize.augmentation(mag_range=(0.0, 4.0 * top),
                                                               mag_to_param=_posterize_increasing_mask),
        "Solarize": dali_ops.solarize.augmentation(mag_range=(0.0, 256.0 * top), mag_to_param=_solarize_threshold),
        "SolarizeIncreasing": dali_ops.solarize.augmentation(mag_range=(0.0, 256.0 * top),
                                                             mag_to_param=_solarize_increasing_threshold),
        "SolarizeAdd": dali_ops.solarize_add.augmentation(mag_range=(0.0, 110.0 * top),
                                                          mag_to_param=_solarize_addition),
    }
    for name in ("Color", "Contrast", "Brightness"):
        aug = {"Color": dali_ops.color, "Contrast": dali_ops.contrast, "Brightness": dali_ops.brightness}[name]
        ops[name] = aug.augmentation(mag_range=enhance, randomly_negate=False, mag_to_param=None)
        ops[name + "Increasing"] = aug.augmentation(mag_range=(0.0, 0.9 * top), randomly_negate=True,
                                                    mag_to_param=_enhance_increasing)
    ops["Sharpness"] = dali_ops.sharpness.augmentation(mag_range=enhance, randomly_negate=False,
                                                       mag_to_param=dali_ops.sharpness_kernel_shifted)
    ops["SharpnessIncreasing"] = dali_ops.sharpness.augmentation(mag_range=(0.0, 0.9 * top), randomly_negate=True,
                                                                 mag_to_param=_sharpness_increasing)
    return ops


# ----------------------------------------------------------------------------------------- RandAugment
def rand_augment(images, spec: RandAugmentSpec, op_names, size: int, fill, interp_type=types.INTERP_LINEAR):
    """``(augmented images, op index per layer [n] (len(op_names) = identity), magnitude bin per layer [n])``.

    ``images``: uint8 HWC of ``size`` x ``size``; ``op_names``: timm's op set (``augment.rand_augment_ops``);
    ``fill``: the per-channel fill in 0..255. Inside a pipeline with ``enable_conditionals=True``.
    """
    n = spec.num_layers
    table = timm_ops(spec)
    augmentations = [_unconverted(table[name]) for name in op_names] + [_unconverted(dali_ops.identity)]
    chosen = fn.random.uniform(values=list(range(len(op_names))), shape=(n,), dtype=types.INT32)
    if spec.prob < 1.0:
        applied = fn.random.coin_flip(probability=spec.prob, shape=(n,), dtype=types.INT32)
        chosen = chosen * applied + len(op_names) * (1 - applied)
    magnitude = _magnitudes(spec, n)
    bins = fn.cast(dmath.floor(magnitude / MAGNITUDE_STEP + 0.5), dtype=types.INT32)
    signed = signed_bin(bins, random_sign=fn.random.uniform(values=[0, 1], shape=(n,), dtype=types.INT32))
    fill = types.Constant(np.asarray(fill, np.float32).reshape(-1), device=images.device)
    for layer in range(n):
        images = _apply_one(augmentations, chosen[layer], images, magnitude_bin=signed[layer],
                            num_magnitude_bins=_bins(spec), shape=(size, size), fill=fill, interp_type=interp_type)
    return images, chosen, bins


def _apply_one(augmentations, index, images, **kwargs):
    """Each sample through ``augmentations[index]``: one conditional per op. DALI's ``select`` splits
    recursively, and AutoGraph transforms each recursive call anew, which dominated building the pipeline
    (``docs/data.md``)."""
    out = images
    for k, aug in enumerate(augmentations):
        if index == k:
            out = aug(images, **kwargs)
    return out


@do_not_convert
def _magnitudes(spec: RandAugmentSpec, n: int):
    """timm's per-op magnitude, clipped to ``[0, mmax]``: fixed, ``N(m, mstd)``, or ``U(0, m)`` (mstd=inf)."""
    if spec.magnitude_std == float("inf"):
        drawn = fn.random.uniform(range=[0.0, float(spec.magnitude)], shape=(n,))
    elif spec.magnitude_std > 0:
        drawn = fn.random.normal(mean=float(spec.magnitude), stddev=float(spec.magnitude_std), shape=(n,))
    else:
        drawn = types.Constant(np.full((n,), spec.magnitude, np.float32))
    return dmath.clamp(drawn, 0.0, float(spec.magnitude_max))


# -------------------------------------------------------------------------------------- random erasing
def erase_random_box(images, probability: float, mode: str, size: int, layout: str,
                     min_area: float = 0.02, max_area: float = 1.0 / 3.0, min_aspect: float = 0.3, attempts: int = 10):
    """timm's ``RandomErasing`` (count 1) on normalised float ``images`` of ``size`` x ``size`` (layout
    ``CHW`` or ``HWC``): with ``probability``, the first of ``attempts`` (area, aspect) draws that fits
    inside the image is erased at a uniform position."""
    area = float(size * size)
    target = fn.random.uniform(range=[min_area, max_area], shape=(attempts,)) * area
    aspect = dmath.exp(fn.random.uniform(range=[math.log(min_aspect), -math.log(min_aspect)], shape=(attempts,)))
    # timm rounds to the nearest integer: floor(x + 0.5) for these positive sizes
    heights = dmath.floor(dmath.sqrt(target * aspect) + 0.5)
    widths = dmath.floor(dmath.sqrt(target / aspect) + 0.5)
    h = w = 0.0
    untried = 1.0  # no earlier attempt fitted
    for k in range(attempts):
        fits = fn.cast((heights[k] < size) & (widths[k] < size), dtype=types.FLOAT)
        take = fits * untried
        h, w = h + take * heights[k], w + take * widths[k]
        untried = untried * (1.0 - fits)
    erase = fn.cast(fn.random.coin_flip(probability=probability), dtype=types.FLOAT) * (1.0 - untried)
    h, w = h * erase, w * erase
    top = dmath.floor(fn.random.uniform(range=[0.0, 1.0]) * (size - h + 1.0))
    left = dmath.floor(fn.random.uniform(range=[0.0, 1.0]) * (size - w + 1.0))
    keep = fn.erase(images * 0.0 + 1.0, anchor=fn.stack(top, left), shape=fn.stack(h, w), axis_names="HW",
                    fill_value=0.0)
    if mode == "const":
        noise = images * 0.0
    elif mode == "rand":
        colour = fn.random.normal(shape=(1, 1, 3) if layout == "HWC" else (3, 1, 1))
        noise = images * 0.0 + (colour.gpu() if images.device == "gpu" else colour)
    else:
        noise = fn.random.normal(images)
    return images * keep + noise * (1.0 - keep)
