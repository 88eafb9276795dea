"""What a training step minimises, given the model and a batch from the loader."""
from __future__ import annotations

from ppdlx.data.mixing import MixSpec, draw_mix, image_size, mix_batch


def mixed(criterion, images, labels, mix: MixSpec, seed: int, epoch: int, step: int, channels_last: bool):
    """Mixup / CutMix of the batch on its device (``ppdlx.data.mixing``): ``(images, soft targets)``."""
    draw = draw_mix(mix, seed, epoch, step, *image_size(images.shape, channels_last))
    return mix_batch(images, criterion.targets(labels), draw.lam, draw.weight, draw.box, channels_last)


class ClassificationObjective:
    """Label-smoothed cross-entropy with optional Mixup / CutMix (``mix.enabled``)."""

    def __init__(self, criterion, mix: MixSpec = MixSpec(), seed: int = 0, data_format: str = "NCHW"):
        self.criterion = criterion
        self.mix, self.seed, self.channels_last = mix, seed, data_format == "NHWC"

    def __call__(self, model, batch, epoch: int, step: int):
        images, labels = batch
        if self.mix.enabled:
            images, targets = mixed(self.criterion, images, labels, self.mix, self.seed, epoch, step,
                                    self.channels_last)
            logits = model(images)
            return self.criterion(logits, targets=targets), int(images.shape[0])
        logits = model(images)
        return self.criterion(logits, labels), int(images.shape[0])
