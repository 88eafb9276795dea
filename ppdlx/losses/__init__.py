"""Classification losses (registered in ``LOSSES``)."""
from __future__ import annotations

import paddle.nn.functional as F

from ppdlx.registry import LOSSES


def soft_targets(labels, num_classes: int, smoothing: float):
    """One-hot labels smoothed towards the uniform distribution."""
    one_hot = F.one_hot(labels.reshape([-1]), num_classes).astype("float32")
    return one_hot * (1.0 - smoothing) + smoothing / num_classes


def soft_cross_entropy(logits, targets):
    """Mean over the batch of ``sum(-targets * log_softmax(logits))``; computed in float32."""
    log_probs = F.log_softmax(logits.astype("float32"), axis=-1)
    return (-(targets * log_probs).sum(axis=-1)).mean()


@LOSSES.register("cross_entropy")
class LabelSmoothingCrossEntropy:
    """Cross-entropy with label smoothing; accepts int labels or soft (mixup) targets."""

    def __init__(self, num_classes: int, label_smoothing: float = 0.0):
        self.num_classes, self.smoothing = num_classes, label_smoothing

    def targets(self, labels):
        return soft_targets(labels, self.num_classes, self.smoothing)

    def __call__(self, logits, labels=None, targets=None):
        if targets is None:
            targets = self.targets(labels)
        return soft_cross_entropy(logits, targets)


def build_loss(cfg, num_classes: int):
    return LOSSES.build(cfg.loss.name, num_classes=num_classes, label_smoothing=cfg.loss.label_smoothing)
