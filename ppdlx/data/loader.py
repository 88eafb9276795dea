"""Build the classification input pipeline for a split from the ``data`` config."""
from __future__ import annotations

import numpy as np
import paddle

from ppdlx.config.preprocess import CLASSIFICATION_KEYS, require_resolved
from ppdlx.data.image_folder import ImageFolder, require_images_in_every_class
from ppdlx.data.loader_common import PaddleIOLoader, dali_required, split_batch_sampler
from ppdlx.data.transforms import EvalTransform, TrainTransform


def _collate(batch):
    good = [(img, label) for img, label, _ in batch if img is not None]
    skipped = np.asarray([index if img is None else -1 for img, _, index in batch], dtype=np.int64)
    if not good:
        return np.zeros((1,), np.float32), np.full((1,), -1, np.int64), skipped
    images = np.stack([img for img, _ in good])
    labels = np.asarray([label for _, label in good], dtype=np.int64)
    return images, labels, skipped


class ImageFolderLoader(PaddleIOLoader):
    """Yields ``(images, labels)`` paddle tensors; reports unreadable files once each."""

    def __init__(self, dataset: ImageFolder, batch_sampler, workers: int):
        super().__init__(dataset, batch_sampler, workers, _collate)
        self.source = dataset.split_dir

    def path_of(self, index: int) -> str:
        return self.dataset.samples[index][0]


class SyntheticLoader:
    """One fixed random batch repeated: measures the trainer without input cost."""

    def __init__(self, batch_size, num_images, num_classes, crop_size, data_format, seed=0):
        rng = np.random.default_rng(seed)
        shape = (batch_size, 3, crop_size, crop_size) if data_format == "NCHW" else \
            (batch_size, crop_size, crop_size, 3)
        self.images = paddle.to_tensor(rng.standard_normal(shape).astype(np.float32))
        self.labels = paddle.to_tensor(rng.integers(0, num_classes, batch_size).astype(np.int64))
        self.steps = max(1, num_images // batch_size)
        self.num_images = self.steps * batch_size

    def set_epoch(self, epoch):
        pass

    def __len__(self):
        return self.steps

    def __iter__(self):
        for _ in range(self.steps):
            yield self.images, self.labels


def build_classification_loader(cfg, split: str, rank: int = 0, world_size: int = 1, num_classes=None,
                                batch_size=None, classes=None):
    """``split`` is "train" or "val"; returns a loader with ``set_epoch``, ``len`` and ``num_images``."""
    data, fmt = cfg.data, cfg.model.data_format
    batch_size = batch_size or data.batch_size
    # synthetic batches are noise of the crop size: the other values are not needed
    require_resolved(data.transforms, ("crop_size",) if data.backend == "synthetic" else CLASSIFICATION_KEYS)
    if data.backend == "synthetic":
        return SyntheticLoader(batch_size, data.synthetic.num_images, num_classes or cfg.model.num_classes,
                               data.transforms.crop_size, fmt, cfg.global_.seed + rank)
    if data.backend == "dali":
        with dali_required():
            from ppdlx.data.dali import build_dali_loader  # the DALI backend: optional (nvidia-dali)
        return build_dali_loader(cfg, split, rank, world_size, batch_size=batch_size, classes=classes)
    training = split == "train"
    transform = TrainTransform(data.transforms, fmt) if training else EvalTransform(data.transforms, fmt)
    dataset = ImageFolder(data.root, data.train_split if training else data.val_split, transform,
                          seed=cfg.global_.seed, classes=classes)
    if not training:
        require_images_in_every_class(dataset.split_dir, dataset.classes, dataset.samples)
    sampler = split_batch_sampler(training, len(dataset), batch_size, rank, world_size, cfg.global_.seed,
                                  shuffle=True, source=dataset.split_dir, last_batch=data.last_batch)
    return ImageFolderLoader(dataset, sampler, data.workers)
