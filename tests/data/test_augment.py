"""RandAugment (timm rand-m9-mstd0.5) and random erasing (timm pixel mode) in the paddle.io path."""
import numpy as np
import pytest
from PIL import Image

from ppdlx.config import load_config
from ppdlx.data.augment import (RAND_TRANSFORMS, RandAugment, level_to_arg, parse_rand_augment, rand_augment_ops,
                                random_erasing, solarize_add)
from ppdlx.data.transforms import EvalTransform, TrainTransform
from ppdlx.errors import ConfigError


def _image(seed=0, size=48):
    rng = np.random.default_rng(seed)
    base = np.linspace(0, 255, size * size * 3).reshape(size, size, 3)
    return Image.fromarray(np.clip(base + rng.integers(-20, 20, base.shape), 0, 255).astype(np.uint8))


def _transforms(*extra):
    from ppdlx.tasks.preprocess import resolve_preprocessing
    return resolve_preprocessing(load_config(None, ["data.transforms.crop_size=32",
                                                    "data.transforms.interpolation=bicubic", *extra])).data.transforms


def test_parse_timm_policy_string():
    spec = parse_rand_augment("rand-m9-mstd0.5")
    assert (spec.magnitude, spec.num_layers, spec.magnitude_std, spec.magnitude_max, spec.prob) == (9, 2, 0.5, 10, 0.5)
    assert rand_augment_ops(spec) == RAND_TRANSFORMS and len(RAND_TRANSFORMS) == 15
    assert parse_rand_augment("rand-n3-m7-mstd101").magnitude_std == float("inf")
    assert rand_augment_ops(parse_rand_augment("rand-m9-inc1"))[4] == "PosterizeIncreasing"
    with pytest.raises(ConfigError, match=r"data.transforms.randaugment='rand-q9': unknown section 'q9'"):
        load_config(None, ["data.transforms.randaugment=rand-q9"])


def test_level_mapping_at_magnitude_9_is_timms():
    rng = np.random.default_rng(0)
    assert abs(level_to_arg("Rotate", 9, rng)) == pytest.approx(27.0)
    assert abs(level_to_arg("ShearX", 9, rng)) == pytest.approx(0.27)
    assert abs(level_to_arg("TranslateYRel", 9, rng)) == pytest.approx(0.405)
    assert level_to_arg("Color", 9, rng) == pytest.approx(1.72)
    assert level_to_arg("Posterize", 9, rng) == 3
    assert level_to_arg("Solarize", 9, rng) == 230
    assert level_to_arg("SolarizeAdd", 9, rng) == 99
    assert level_to_arg("Invert", 9, rng) is None
    signs = {np.sign(level_to_arg("Rotate", 5, rng)) for _ in range(50)}
    assert signs == {-1.0, 1.0}


def test_ops_pixel_semantics():
    img = _image()
    a = np.asarray(img).astype(int)
    ra = RandAugment("rand-m9-p1.0", fill=(124, 116, 104))  # p=1: every chosen op runs
    rng = np.random.default_rng(0)
    assert np.array_equal(np.asarray(ra.apply_op("Invert", img, rng)), 255 - a)
    assert np.array_equal(np.asarray(ra.apply_op("Posterize", img, rng)), a & 0b11100000)
    sol = np.asarray(ImageSolarize(img, 230))
    assert np.array_equal(sol, np.where(a >= 230, 255 - a, a))
    add = np.asarray(solarize_add(img, 99)).astype(int)
    assert np.array_equal(add, np.where(a < 128, np.minimum(a + 99, 255), a))
    # geometric ops fill the uncovered area with the dataset mean
    rot = np.asarray(RandAugment("rand-m10-p1.0", fill=(124, 116, 104)).apply_op("Rotate", img, rng))
    assert rot.shape == a.shape and tuple(rot[0, 0]) == (124, 116, 104)


def test_a_single_mean_fills_every_channel_with_it():
    """data.transforms.mean may be one number for every channel: RandAugment's geometric fill is then grey, not
    that value in red alone (a 1-tuple fillcolor fills only PIL's first band)."""
    from ppdlx.data.augment import build_rand_augment
    t = load_config(None, ["data.transforms.mean=[100.4]", "data.transforms.randaugment=rand-m10-p1.0",
                           "data.transforms.interpolation=bicubic"]).data.transforms
    ra = build_rand_augment(t)
    assert ra.fill == (100, 100, 100)
    rot = np.asarray(ra.apply_op("Rotate", _image(), np.random.default_rng(0)))
    assert tuple(rot[0, 0]) == (100, 100, 100)


def ImageSolarize(img, threshold):
    from PIL import ImageOps
    return ImageOps.solarize(img, threshold)


def test_magnitude_noise_probability_and_op_choice_statistics():
    ra = RandAugment("rand-m9-mstd0.5")
    rng = np.random.default_rng(1)
    mags = np.array([ra.sample_magnitude(rng) for _ in range(4000)])
    assert abs(mags.mean() - 9.0) < 0.03 and abs(mags.std() - 0.5) < 0.03 and mags.max() <= 10.0
    assert np.array_equal(np.clip(mags, 0, 10), mags)
    chosen = [name for _ in range(3000) for name in ra.choose_ops(rng)]
    counts = np.array([chosen.count(n) for n in RAND_TRANSFORMS])
    assert counts.sum() == 6000 and counts.min() > 300 and counts.max() < 500  # uniform, with replacement
    img = _image(size=16)
    changed = np.mean([not np.array_equal(np.asarray(ra.apply_op("Invert", img, rng)), np.asarray(img))
                       for _ in range(2000)])
    assert abs(changed - 0.5) < 0.04  # each op runs with probability 0.5


def test_train_transform_with_randaugment_is_deterministic_per_generator():
    cfg = _transforms("data.transforms.randaugment=rand-m9-mstd0.5", "data.transforms.random_erasing=0.2")
    t = TrainTransform(cfg)
    img = _image(size=40)
    a = t(img, np.random.default_rng([42, 0, 7]))
    b = t(img, np.random.default_rng([42, 0, 7]))
    c = t(img, np.random.default_rng([42, 1, 7]))
    assert a.shape == (3, 32, 32) and a.dtype == np.float32
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    nhwc = TrainTransform(cfg, "NHWC")(img, np.random.default_rng([42, 0, 7]))
    assert np.array_equal(nhwc, a.transpose(1, 2, 0))
    # off: the random stream and the output are exactly the plain recipe's
    plain = TrainTransform(_transforms())(img, np.random.default_rng(3))
    off = TrainTransform(_transforms("data.transforms.random_erasing=0.0"))(img, np.random.default_rng(3))
    assert np.array_equal(plain, off)
    # randaugment really changes images: over 20 samples most differ from the plain recipe
    ra = TrainTransform(_transforms("data.transforms.randaugment=rand-m9-mstd0.5"))
    differ = sum(not np.array_equal(ra(img, np.random.default_rng(s)), TrainTransform(_transforms())(
        img, np.random.default_rng(s))) for s in range(20))
    assert differ >= 12  # P(no op runs) = 1/4, Identity-like ops aside


def test_random_erasing_fraction_area_and_pixel_noise():
    rng = np.random.default_rng(0)
    erased, areas, stds = 0, [], []
    for _ in range(3000):
        arr = np.full((3, 32, 32), 5.0, np.float32)
        out = random_erasing(arr, rng, 0.2, "pixel")
        mask = out[0] != 5.0
        if mask.any():
            erased += 1
            areas.append(mask.mean())
            stds.append(out[:, mask].std())
            assert (out[:, ~mask] == 5.0).all()
    assert abs(erased / 3000 - 0.2) < 0.025
    areas = np.array(areas)
    assert areas.min() >= 0.015 and areas.max() <= 0.36 and 0.12 < areas.mean() < 0.2  # U(0.02, 1/3) of the area
    assert abs(np.mean(stds) - 1.0) < 0.1  # per-pixel N(0, 1) in normalised space
    const = random_erasing(np.full((3, 32, 32), 5.0, np.float32), np.random.default_rng(4), 1.0, "const")
    assert (const == 0).any() and set(np.unique(const)) <= {0.0, 5.0}
    nhwc = random_erasing(np.full((32, 32, 3), 5.0, np.float32), np.random.default_rng(4), 1.0, "const", "NHWC")
    assert np.array_equal(nhwc, const.transpose(1, 2, 0))


def test_crop_pct_sets_the_eval_resize_and_bicubic_eval():
    cfg = _transforms("data.transforms.crop_size=224", "data.transforms.crop_pct=0.875")
    assert cfg.resize_short == 256
    cfg = _transforms("data.transforms.crop_size=320", "data.transforms.crop_pct=1.0")
    assert cfg.resize_short == 320
    img = _image(size=64)
    out = EvalTransform(_transforms("data.transforms.crop_size=32", "data.transforms.crop_pct=0.5",
                                    "data.transforms.mean=[0,0,0]", "data.transforms.std=[1,1,1]"))(img)
    assert out.shape == (3, 32, 32)
    ref2 = np.asarray(img.resize((64, 64), Image.BICUBIC).crop((16, 16, 48, 48)), np.float32).transpose(2, 0, 1)
    assert np.array_equal(out, ref2)  # resize_short 64 (= 32 / 0.5) bicubic, then centre 32
