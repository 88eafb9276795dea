"""Mixup and CutMix on the device (``ppdlx/data/mixing.py``) against timm's ``Mixup`` (mode "batch").

timm draws from NumPy's global generator in a fixed order (mix or not, Mixup or CutMix, lam, the box
centre); replaying those draws through ppdlx's ``mix_batch`` must give timm's images and targets."""
import numpy as np
import paddle
import pytest

from ppdlx.config import load_config
from ppdlx.data.mixing import MixDraw, MixSpec, draw_mix, mix_batch
from ppdlx.losses import LabelSmoothingCrossEntropy
from tests.weights.reference import import_torchvision

CLASSES, SMOOTHING = 10, 0.1


def _timm_mixup():
    import_torchvision()  # timm imports it
    timm_mixup = pytest.importorskip("timm.data.mixup")
    return timm_mixup


def _replayed_draw(timm_mixup, mixer, seed, shape):
    """The draws timm's ``Mixup.__call__`` makes after ``np.random.seed(seed)``, as a ``MixDraw``."""
    np.random.seed(seed)
    lam, cutmix = mixer._params_per_batch()
    if lam == 1.0:
        return MixDraw(1.0, 1.0)
    if not cutmix:
        return MixDraw(float(lam), float(lam))
    (top, bottom, left, right), lam = timm_mixup.cutmix_bbox_and_lam(shape, lam, correct_lam=True)
    return MixDraw(float(lam), 1.0, (int(top), int(bottom), int(left), int(right)))


@pytest.mark.parametrize("channels_last", [False, True])
def test_mixed_images_and_targets_are_timms(channels_last):
    torch = pytest.importorskip("torch")
    timm_mixup = _timm_mixup()
    mixer = timm_mixup.Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, prob=0.9, switch_prob=0.5, mode="batch",
                             label_smoothing=SMOOTHING, num_classes=CLASSES)
    criterion = LabelSmoothingCrossEntropy(CLASSES, SMOOTHING)
    rng = np.random.default_rng(0)
    kinds = set()
    for seed in range(40):
        images = rng.standard_normal((6, 3, 12, 16)).astype(np.float32)
        labels = rng.integers(0, CLASSES, 6)
        np.random.seed(seed)
        want_x, want_t = mixer(torch.from_numpy(images.copy()), torch.from_numpy(labels))
        draw = _replayed_draw(timm_mixup, mixer, seed, images.shape)
        kinds.add("none" if draw.lam == 1.0 else "cutmix" if draw.box[1] > draw.box[0] else "mixup")
        x = images.transpose(0, 2, 3, 1) if channels_last else images
        got_x, got_t = mix_batch(paddle.to_tensor(x), criterion.targets(paddle.to_tensor(labels)), draw.lam,
                                 draw.weight, draw.box, channels_last)
        got_x = got_x.numpy().transpose(0, 3, 1, 2) if channels_last else got_x.numpy()
        np.testing.assert_allclose(got_x, want_x.numpy(), rtol=0, atol=1e-6)
        np.testing.assert_allclose(got_t.numpy(), want_t.numpy(), rtol=0, atol=1e-6)
        np.testing.assert_allclose(got_t.numpy().sum(1), 1.0, atol=1e-6)
    assert kinds == {"none", "mixup", "cutmix"}


def test_cutmix_lam_is_the_clipped_box_area_and_the_draws_follow_the_settings():
    spec = MixSpec(mixup_alpha=0.2, cutmix_alpha=1.0, prob=0.8, switch_prob=0.4)
    draws = [draw_mix(spec, 3, epoch, step, 24, 32) for epoch in range(5) for step in range(400)]
    mixed = [d for d in draws if d != MixDraw(1.0, 1.0)]
    cutmix = [d for d in mixed if d.box[1] > d.box[0]]
    assert abs(len(mixed) / len(draws) - 0.8) < 0.03 and abs(len(cutmix) / len(mixed) - 0.4) < 0.04
    clipped = 0
    for d in cutmix:
        top, bottom, left, right = d.box
        assert 0 <= top < bottom <= 24 and 0 <= left < right <= 32 and d.weight == 1.0
        assert d.lam == pytest.approx(1 - (bottom - top) * (right - left) / (24 * 32))
        clipped += top == 0 or left == 0 or bottom == 24 or right == 32
    assert clipped > len(cutmix) / 4  # centres near the border clip the box; lam says how much was pasted
    mixup_lam = np.array([d.lam for d in mixed if d.box[1] <= d.box[0]])
    assert all(d.weight == d.lam for d in mixed if d.box[1] <= d.box[0])
    assert abs(mixup_lam.mean() - 0.5) < 0.05 and abs(mixup_lam.var() - 1 / (4 * 1.4)) < 0.03  # Beta(0.2, 0.2)
    assert draw_mix(spec, 3, 2, 7, 24, 32) == draw_mix(spec, 3, 2, 7, 24, 32)  # reproducible per step


def test_the_settings_load():
    cfg = load_config(None, ["train.cutmix_alpha=1.0", "train.mixup_alpha=0.8", "train.mix_switch_prob=0.3"])
    assert MixSpec.of(cfg.train) == MixSpec(0.8, 1.0, 1.0, 0.3)
    assert not MixSpec.of(load_config(None, []).train).enabled
