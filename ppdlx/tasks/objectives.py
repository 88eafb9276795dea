"""What a training step minimises, given the model and a batch from the loader."""
from __future__ import annotations

import numpy as np
import paddle


def mixup_draw(alpha: float, seed: int, epoch: int, step: int, batch: int):
    """``(lam, permutation)`` of the mixup at (``epoch``, ``step``): a stream of its own, so every graph
    mode and a resumed run draw the same."""
    rng = np.random.default_rng([seed, epoch, step, 17])
    lam = float(rng.beta(alpha, alpha))
    return lam, rng.permutation(batch).astype(np.int64)


def mixup(criterion, images, labels, alpha: float, seed: int, epoch: int, step: int):
    """Mixed images and soft targets (``criterion.targets(labels)`` mixed the same way)."""
    lam, perm = mixup_draw(alpha, seed, epoch, step, images.shape[0])
    perm = paddle.to_tensor(perm)
    images = lam * images + (1.0 - lam) * paddle.gather(images, perm)
    targets = criterion.targets(labels)
    return images, lam * targets + (1.0 - lam) * paddle.gather(targets, perm)


class ClassificationObjective:
    """Label-smoothed cross-entropy with optional mixup (alpha > 0)."""

    def __init__(self, criterion, mixup_alpha: float = 0.0, seed: int = 0):
        self.criterion = criterion
        self.mixup_alpha = mixup_alpha
        self.seed = seed

    def __call__(self, model, batch, epoch: int, step: int):
        images, labels = batch
        if self.mixup_alpha > 0:
            images, targets = mixup(self.criterion, images, labels, self.mixup_alpha, self.seed, epoch, step)
            logits = model(images)
            return self.criterion(logits, targets=targets), int(images.shape[0])
        logits = model(images)
        return self.criterion(logits, labels), int(images.shape[0])
