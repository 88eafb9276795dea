"""ImageFolder dataset: ``root/<split>/<class>/*.jpg``."""
from __future__ import annotations

import os

import numpy as np
from PIL import Image

from ppdlx.errors import DataError
from ppdlx.registry import DATASETS

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".ppm")


def scan_image_folder(split_dir: str):
    """Sorted class names and (path, label) samples; one-line errors for empty/missing dirs."""
    if not os.path.isdir(split_dir):
        raise DataError(f"{split_dir}: split directory not found (expected <data.root>/<split>/<class>/*.jpg; "
                        f"set data.root, or run tools/prepare_demo_data.py for the demo data)")
    classes = sorted(d.name for d in os.scandir(split_dir) if d.is_dir())
    if not classes:
        raise DataError(f"{split_dir}: no class sub-directories (expected <split>/<class>/*.jpg)")
    samples = []
    for label, name in enumerate(classes):
        for dirpath, _, files in sorted(os.walk(os.path.join(split_dir, name))):
            for fname in sorted(files):
                if fname.lower().endswith(IMAGE_EXTENSIONS):
                    samples.append((os.path.join(dirpath, fname), label))
    if not samples:
        raise DataError(f"{split_dir}: no images with extensions {', '.join(IMAGE_EXTENSIONS)}")
    return classes, samples


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, epoch, index])


@DATASETS.register("image_folder")
class ImageFolder:
    """Map-style dataset returning ``(image_array | None, label, index)``.

    An unreadable file yields ``None`` for the image; the collate function drops it
    and the loader reports it once by name (one warning line per file).
    """

    def __init__(self, root: str, split: str, transform, seed: int = 0, classes=None):
        self.split_dir = os.path.join(root, split)
        found, self.samples = scan_image_folder(self.split_dir)
        if classes is not None and list(classes) != found:
            raise DataError(f"{self.split_dir}: class folders {found[:5]}... differ from the training split's")
        self.classes = found
        self.transform = transform
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        path, label = self.samples[index]
        try:
            with Image.open(path) as img:
                img = img.convert("RGB")
            array = self.transform(img, sample_rng(self.seed, self.epoch, index))
        except (OSError, ValueError, SyntaxError):
            return None, label, index
        return array, label, index
