"""Mixup and CutMix of a training batch on its device, with timm's semantics (``timm.data.mixup.Mixup``,
``mode="batch"``, ``correct_lam=True``), in dynamic and static graphs alike.

Per optimizer step one draw (``draw_mix``, from a stream of its own seeded by ``(seed, epoch, step)``, so
every graph mode and a resumed run draw the same): with probability ``prob`` the batch is mixed; when
both alphas are set, CutMix with probability ``switch_prob``, else Mixup; ``lam ~ Beta(alpha, alpha)``.
CutMix pastes a box of side ``sqrt(1 - lam)`` of the image, centred at a uniform pixel and clipped to the
image, and corrects ``lam`` to ``1 - clipped box area / image area``. Each image is mixed with the batch
in reverse order (timm's ``flip(0)``), and the targets -- label smoothing folded in, as timm's
``mixup_target`` -- are ``lam * own + (1 - lam) * partner's``, so they still sum to 1.

``mix_batch`` is one formula for both graph modes: ``images * W + partner * (1 - W)`` with
``W = weight * (1 - box mask)`` (Mixup: ``weight = lam``, no box; CutMix: ``weight = 1``), the draw given as
Python numbers (dynamic: they become op attributes, nothing is uploaded per step) or as fed tensors
(a static program). Nothing is read back from the device.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import paddle


@dataclass(frozen=True)
class MixSpec:
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    prob: float = 1.0          # timm --mixup-prob: of mixing a batch at all
    switch_prob: float = 0.5   # timm --mixup-switch-prob: of CutMix when both alphas are set

    @property
    def enabled(self) -> bool:
        return self.mixup_alpha > 0 or self.cutmix_alpha > 0

    @classmethod
    def of(cls, train_cfg) -> "MixSpec":
        return cls(train_cfg.mixup_alpha, train_cfg.cutmix_alpha, train_cfg.mix_prob, train_cfg.mix_switch_prob)


@dataclass(frozen=True)
class MixDraw:
    lam: float                 # the targets' weight of the image itself (CutMix: 1 - pasted area / image area)
    weight: float              # the images' weight outside the box (Mixup: lam; CutMix: 1)
    box: tuple = (0, 0, 0, 0)  # (top, bottom, left, right) of the pasted box, bottom/right exclusive

    def feed(self) -> dict:
        """The draw as a static program's feeds (``mix_inputs``)."""
        return {"mix_lam": np.asarray([self.lam], np.float32), "mix_weight": np.asarray([self.weight], np.float32),
                "mix_box": np.asarray(self.box, np.int64)}


NO_MIX = MixDraw(1.0, 1.0)


def image_size(shape, channels_last: bool) -> tuple:
    """``(height, width)`` of a batch of ``shape`` (NCHW, or NHWC with ``channels_last``)."""
    return (int(shape[1]), int(shape[2])) if channels_last else (int(shape[2]), int(shape[3]))


def draw_mix(spec: MixSpec, seed: int, epoch: int, step: int, height: int, width: int) -> MixDraw:
    """timm's ``_params_per_batch`` and ``cutmix_bbox_and_lam`` for one step."""
    rng = np.random.default_rng([seed, epoch, step, 17])
    if not spec.enabled or rng.random() >= spec.prob:
        return NO_MIX
    if spec.mixup_alpha > 0 and spec.cutmix_alpha > 0:
        cutmix = rng.random() < spec.switch_prob
    else:
        cutmix = spec.cutmix_alpha > 0
    alpha = spec.cutmix_alpha if cutmix else spec.mixup_alpha
    lam = float(rng.beta(alpha, alpha))
    if not cutmix:
        return MixDraw(lam, lam)
    ratio = np.sqrt(1.0 - lam)
    cut_h, cut_w = int(height * ratio), int(width * ratio)
    cy, cx = int(rng.integers(0, height)), int(rng.integers(0, width))
    top, bottom = int(np.clip(cy - cut_h // 2, 0, height)), int(np.clip(cy + (cut_h + 1) // 2, 0, height))
    left, right = int(np.clip(cx - cut_w // 2, 0, width)), int(np.clip(cx + (cut_w + 1) // 2, 0, width))
    corrected = 1.0 - (bottom - top) * (right - left) / float(height * width)
    return MixDraw(corrected, 1.0, (top, bottom, left, right))


def mix_inputs() -> tuple:
    """Inside a static program: the fed ``(lam, weight, box)`` of ``MixDraw.feed``."""
    return (paddle.static.data("mix_lam", [1], "float32"), paddle.static.data("mix_weight", [1], "float32"),
            paddle.static.data("mix_box", [4], "int64"))


def _size(images, axis: int):
    size = images.shape[axis]
    return size if isinstance(size, int) and size > 0 else paddle.shape(images)[axis]  # static: unknown until run


def mix_batch(images, targets, lam, weight, box, channels_last: bool = False):
    """``(mixed images, mixed soft targets)``; ``lam``/``weight``/``box`` as ``MixDraw`` holds them, Python
    numbers or tensors. The partner of image ``i`` is image ``N - 1 - i``."""
    if isinstance(lam, float) and (lam, weight) == (1.0, 1.0):  # an unmixed step (timm returns early too)
        return images, targets
    numbers = isinstance(lam, float)
    if numbers:  # as the fed tensors of a static program, so both graph modes round alike (filled, not uploaded)
        lam, weight = paddle.full([1], lam, "float32"), paddle.full([1], weight, images.dtype)
    partner = paddle.flip(images, axis=[0])
    targets = targets * lam + paddle.flip(targets, axis=[0]) * (1.0 - lam)
    if numbers and box[1] <= box[0]:  # Mixup: no mask to build
        return images * weight + partner * (1.0 - weight), targets
    h_axis = 1 if channels_last else 2
    rows = paddle.arange(_size(images, h_axis), dtype="int64")
    cols = paddle.arange(_size(images, h_axis + 1), dtype="int64")
    inside = (((rows >= box[0]) & (rows < box[1])).unsqueeze(1) & ((cols >= box[2]) & (cols < box[3])).unsqueeze(0))
    keep = (1.0 - inside.astype(images.dtype)) * weight.astype(images.dtype)
    keep = keep.unsqueeze(-1) if channels_last else keep
    return images * keep + partner * (1.0 - keep), targets
