"""timm's RandAugment and random erasing in DALI's CPU pipelines (``ppdlx/data/dali_augment.py``).

The DALI graph reports what it drew (the op per layer, identity when the per-op coin said no, and the
magnitude bin), so the statistics are read from DALI's own selection; the pixels are checked against
those choices where an op's effect is exact (invert, posterize, solarize), and every op against the
paddle.io path's PIL implementation of timm's ops (``ppdlx.data.augment``) at the same magnitude.
"""
import math

import numpy as np
import pytest

dali = pytest.importorskip("nvidia.dali")

import nvidia.dali.fn as fn  # noqa: E402
import nvidia.dali.types as types  # noqa: E402
from PIL import Image  # noqa: E402

from ppdlx.config import load_config  # noqa: E402
from ppdlx.config.randaugment import parse_rand_augment  # noqa: E402
from ppdlx.data.augment import (_GEOMETRIC, _OPS, RAND_INCREASING_TRANSFORMS, RAND_TRANSFORMS,  # noqa: E402
                                level_to_arg, rand_augment_ops, random_erasing)
from ppdlx.data.dali_augment import MAGNITUDE_STEP, erase_random_box, rand_augment  # noqa: E402
from ppdlx.data.loader import build_classification_loader  # noqa: E402
from tests.data.test_dali import _cfg, tree  # noqa: E402,F401  (the JPEG tree fixture)

FILL = (124, 116, 104)


def _run(graph, batches=1, batch_size=8, seed=7, **pipeline):
    pipe = dali.pipeline_def(graph, enable_conditionals=True)(batch_size=batch_size, num_threads=2, device_id=None,
                                                               seed=seed, **pipeline)
    pipe.build()
    runs = [pipe.run() for _ in range(batches)]
    return [np.concatenate([np.stack([np.asarray(t) for t in run[k]]) for run in runs]) for k in range(len(runs[0]))]


def _textured(count, size, low=0, high=255, seed=0):
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size]
    out = []
    for _ in range(count):
        base = np.stack([(xx * 3 + yy) % 256, (yy * 4) % 256, np.hypot(xx - size / 2, yy - size / 2) * 5 % 256], -1)
        noisy = base * rng.uniform(0.5, 1.0) + rng.uniform(0, 60) + rng.normal(0, 12, base.shape)
        out.append(np.clip(noisy, low, high).astype(np.uint8))
    return out


class _Sign:
    """The generator ``level_to_arg`` draws its sign from, answering one fixed side."""

    def __init__(self, negative):
        self.negative = negative

    def random(self):
        return 0.9 if self.negative else 0.1


def _pil(name, img, magnitude, negative):
    arg = level_to_arg(name, magnitude, _Sign(negative))
    pil = Image.fromarray(img)
    if name in _GEOMETRIC:
        return np.asarray(_OPS[name](pil, arg, resample=Image.BILINEAR, fill=FILL))
    return np.asarray(_OPS[name](pil) if arg is None else _OPS[name](pil, arg))


EXACT = {"Invert", "Posterize", "PosterizeIncreasing", "Solarize", "SolarizeIncreasing", "SolarizeAdd"}
# mean |DALI - PIL| in grey levels on these 48 px images: DALI's equalize follows OpenCV's formula (4.2 here);
# the rest differ by rounding, the luma-weighted contrast centre, bilinear sampling and sharpness's border
TOLERANCE = {"Equalize": 8.0}


@pytest.mark.parametrize("name", sorted(set(RAND_TRANSFORMS) | set(RAND_INCREASING_TRANSFORMS)))
def test_each_op_is_timms_op_at_the_same_magnitude(name):
    size, magnitude = 48, 9
    images = _textured(8, size)
    spec = parse_rand_augment(f"rand-m{magnitude}-n1-p1" + ("-inc1" if name in RAND_INCREASING_TRANSFORMS
                                                            and name not in RAND_TRANSFORMS else ""))

    def graph():
        x = fn.external_source(source=lambda: images, batch=True, layout="HWC")
        out, chosen, bins = rand_augment(x, spec, [name], size, FILL)
        return out, chosen, bins

    out, chosen, bins = _run(graph)
    assert (chosen == 0).all() and (bins == round(magnitude / MAGNITUDE_STEP)).all()
    errors, changes = [], []
    for img, got in zip(images, out):
        errors.append(min(np.abs(got.astype(float) - _pil(name, img, magnitude, negative)).mean()
                          for negative in (False, True)))
        changes.append(np.abs(got.astype(float) - img).mean())
    if name in EXACT:
        assert max(errors) == 0.0, (name, errors)
    else:
        assert max(errors) < TOLERANCE.get(name, 1.5), (name, errors)
    assert min(changes) > 3 * max(errors) or name in EXACT, (name, changes, errors)


def _posterized(img, magnitude):
    bits = int(magnitude / 10 * 4 + 1e-4)
    return img & np.uint8(0xFF ^ ((1 << (8 - bits)) - 1))


@pytest.mark.parametrize("policy, moments", [
    ("rand-m9-mstd0.5", None),                   # GPUNet's: 2 ops at p 0.5, magnitude N(9, 0.5) clipped to [0, 10]
    ("rand-m7-mstd101-n3-p0.8", (3.5, 7 / math.sqrt(12))),  # mstd > 100: magnitude U(0, 7)
])
def test_rand_augment_draws_the_configured_ops_and_magnitudes(policy, moments):
    spec = parse_rand_augment(policy)
    size, batch, batches = 20, 256, 4
    images = _textured(batch, size, low=40, high=200, seed=1)  # never full range: every op changes them
    ops = rand_augment_ops(spec)
    identity = len(ops)

    def graph():
        x = fn.external_source(source=lambda: images, batch=True, layout="HWC")
        return rand_augment(x, spec, ops, size, FILL)

    out, chosen, bins = _run(graph, batches=batches, batch_size=batch)
    inputs = np.stack(images * batches)
    n = spec.num_layers
    assert chosen.shape == bins.shape == (batch * batches, n)
    applied = chosen != identity
    assert abs(applied.mean() - spec.prob) < 0.05
    per_image = np.bincount(applied.sum(1), minlength=n + 1) / len(applied)
    expected = [math.comb(n, k) * spec.prob ** k * (1 - spec.prob) ** (n - k) for k in range(n + 1)]
    assert np.abs(per_image - expected).max() < 0.06, (per_image, expected)
    frequency = np.bincount(chosen[applied], minlength=len(ops)) / applied.sum()
    assert frequency.min() > 0 and np.abs(frequency - 1 / len(ops)).max() < 0.035, frequency
    magnitude = bins * MAGNITUDE_STEP
    assert magnitude.min() >= 0 and magnitude.max() <= spec.magnitude_max
    if moments is None:  # N(m, mstd) clipped to [0, mmax], from numpy's normal
        reference = np.clip(np.random.default_rng(0).normal(spec.magnitude, spec.magnitude_std, 10 ** 6), 0,
                            spec.magnitude_max)
        moments = reference.mean(), reference.std()
    assert abs(magnitude.mean() - moments[0]) < 0.06 and abs(magnitude.std() - moments[1]) < 0.06, \
        (magnitude.mean(), magnitude.std(), moments)
    # the pixels follow the reported draws: untouched without an op, exact where one exact op ran
    unchanged = (out == inputs).reshape(len(out), -1).all(1)
    assert unchanged[~applied.any(1)].all() and (~applied.any(1)).sum() >= 5
    single = applied.sum(1) == 1
    op_of = np.where(applied, chosen, -1).max(1)
    mag_of = np.where(applied, magnitude, -1).max(1)
    checked = 0
    for i in np.flatnonzero(single):
        name = ops[op_of[i]]
        if name == "Invert":
            np.testing.assert_array_equal(out[i], 255 - inputs[i])
        elif name == "Posterize":
            np.testing.assert_array_equal(out[i], _posterized(inputs[i], mag_of[i]))
        elif name == "Solarize":
            threshold = min(256, int(mag_of[i] / 10 * 256 + 1e-4))
            np.testing.assert_array_equal(out[i], np.where(inputs[i] >= threshold, 255 - inputs[i], inputs[i]))
        else:
            continue
        checked += 1
    assert checked >= 5


def test_random_erasing_draws_timms_boxes_and_fills_them_with_unit_noise():
    size, batch, batches, probability = 32, 256, 4, 0.5

    def graph():
        ones = fn.external_source(source=lambda: [np.full((3, size, size), 5.0, np.float32)] * batch, batch=True,
                                  layout="CHW")
        return erase_random_box(ones, probability, "pixel", size, "CHW")

    (out,) = _run(graph, batches=batches, batch_size=batch)
    erased = out != 5.0
    hit = erased.reshape(len(out), -1).any(1)
    assert abs(hit.mean() - probability) < 0.05
    boxes = []
    for mask in erased[hit, 0]:
        rows, cols = np.flatnonzero(mask.any(1)), np.flatnonzero(mask.any(0))
        h, w = rows[-1] - rows[0] + 1, cols[-1] - cols[0] + 1
        assert mask.sum() == h * w  # one solid rectangle, the same in every channel
        boxes.append((h, w))
    assert np.array_equal(erased[:, 0], erased[:, 2])
    noise = out[erased]
    assert abs(noise.mean()) < 0.02 and abs(noise.std() - 1.0) < 0.02
    # timm's box distribution, from the paddle.io path's numpy transcription of it
    rng = np.random.default_rng(0)
    reference = []
    for _ in range(4000):
        img = random_erasing(np.full((3, size, size), 5.0, np.float32), rng, 1.0)
        mask = img[0] != 5.0
        if mask.any():
            reference.append((mask.any(1).sum(), mask.any(0).sum()))
    for got, want in ((np.array(boxes), np.array(reference)),):
        area, ref_area = got.prod(1) / size ** 2, want.prod(1) / size ** 2
        aspect, ref_aspect = np.log(got[:, 0] / got[:, 1]), np.log(want[:, 0] / want[:, 1])
        assert abs(area.mean() - ref_area.mean()) < 0.015 and abs(aspect.mean() - ref_aspect.mean()) < 0.08
        assert abs(area.std() - ref_area.std()) < 0.015 and abs(aspect.std() - ref_aspect.std()) < 0.08


def test_the_gpunet_recipe_runs_on_the_dali_loader_and_resumes_its_draws(tree):  # noqa: F811
    root, _ = tree
    recipe = load_config("configs/base/gpunet_imagenet.yaml")
    t = recipe.data.transforms
    assert recipe.data.backend == "dali" and (t.randaugment, t.random_erasing, t.random_erasing_mode) == \
        ("rand-m9-mstd0.5", 0.2, "pixel")
    cfg = _cfg(root, f"data.transforms.randaugment={t.randaugment}", "data.transforms.random_erasing=0.5",
               f"data.transforms.random_erasing_mode={t.random_erasing_mode}", "data.transforms.hflip=0.5")
    first = build_classification_loader(cfg, "train")
    first.set_epoch(0)
    batches = [images.numpy() for images, _ in first]
    assert len(batches) == 6 and batches[0].shape == (4, 3, 32, 32) and batches[0].dtype == np.float32
    erased = [(np.abs(img) > 1.0 + 1e-3).any() for b in batches for img in b]  # normalised to [-1, 1] but noise
    assert 2 <= sum(erased) <= 22
    state = first.state_dict()
    first.set_epoch(1)
    expected = [images.numpy() for images, _ in first]
    resumed = build_classification_loader(cfg, "train")
    resumed.set_state_dict(state)
    resumed.set_epoch(1)
    for want, (got, _) in zip(expected, resumed):
        np.testing.assert_array_equal(want, got.numpy())
    fresh = build_classification_loader(cfg, "train")  # without the state: the same order, other draws
    fresh.set_epoch(1)
    assert any(not np.array_equal(want, got.numpy()) for want, (got, _) in zip(expected, fresh))
