"""What a training step minimises, given the model and a batch from the loader."""
from __future__ import annotations

import numpy as np
import paddle


class ClassificationObjective:
    """Label-smoothed cross-entropy with optional mixup (alpha > 0)."""

    def __init__(self, criterion, mixup_alpha: float = 0.0, seed: int = 0):
        self.criterion = criterion
        self.mixup_alpha = mixup_alpha
        self.seed = seed

    def __call__(self, model, batch, epoch: int, step: int):
        images, labels = batch
        if self.mixup_alpha > 0:
            rng = np.random.default_rng([self.seed, epoch, step, 17])
            lam = float(rng.beta(self.mixup_alpha, self.mixup_alpha))
            perm = paddle.to_tensor(rng.permutation(images.shape[0]).astype(np.int64))
            images = lam * images + (1.0 - lam) * paddle.gather(images, perm)
            targets = self.criterion.targets(labels)
            targets = lam * targets + (1.0 - lam) * paddle.gather(targets, perm)
            logits = model(images)
            return self.criterion(logits, targets=targets), int(images.shape[0])
        logits = model(images)
        return self.criterion(logits, labels), int(images.shape[0])
