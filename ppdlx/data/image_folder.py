"""ImageFolder dataset: ``root/<split>/<class>/*.jpg``."""
from __future__ import annotations

import os

import numpy as np

from ppdlx.data.image_file import open_rgb
from ppdlx.errors import DataError
from ppdlx.registry import DATASETS

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".ppm")
SHOWN = 5  # names listed in a one-line message before "and N more"


def quoted(names) -> str:
    """``'a', 'b', ... and 3 more``: at most ``SHOWN`` names of a one-line message."""
    names = list(names)
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(repr(n) for n in names[:SHOWN]) + more


def class_folders(split_dir: str) -> list:
    """The sorted sub-directory names of a split: its classes, in label order."""
    return sorted(d.name for d in os.scandir(split_dir) if d.is_dir())


def scan_image_folder(split_dir: str):
    """Sorted class names and (path, label) samples; one-line errors for empty/missing dirs."""
    if not os.path.isdir(split_dir):
        raise DataError(f"{split_dir}: split directory not found (expected <data.root>/<split>/<class>/*.jpg; "
                        f"set data.root, or run tools/prepare_demo_data.py for the demo data)")
    classes = class_folders(split_dir)
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


def describe_classes_without_images(split_dir: str, names) -> str:
    """The class folders ``names`` of ``split_dir`` for a message: ``'a', 'b' (2 files, none with an image
    extension (.jpg, ...): e.g. 'x.tif')``; what the non-image files are is what the user has to fix."""
    names = list(names)
    parts = []
    for name in names[:SHOWN]:
        files = sorted(f for _, _, fs in os.walk(os.path.join(split_dir, name)) for f in fs)
        note = (f" ({len(files)} file{'s' if len(files) != 1 else ''}, none with an image extension "
                f"({', '.join(IMAGE_EXTENSIONS)}): e.g. {files[0]!r})") if files else ""
        parts.append(repr(name) + note)
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(parts) + more


def require_images_in_every_class(split_dir: str, classes, samples) -> None:
    """An evaluation split must hold images of every class: ``DataError`` naming the class folders without any
    (its accuracy would silently leave those classes out)."""
    has_images = {label for _, label in samples}
    empty = [name for label, name in enumerate(classes) if label not in has_images]
    if empty:
        raise DataError(f"{split_dir}: {len(empty)} class folder{'s' if len(empty) != 1 else ''} without images "
                        f"({describe_classes_without_images(split_dir, empty)}); an evaluation split needs images "
                        f"of every class: add them, or remove the folder from every split")


def check_same_classes(split_dir: str, found, expected, expected_from: str) -> None:
    """``DataError`` naming the class folders of ``split_dir`` missing from or extra to ``expected`` (labels are
    sorted-folder indices, so one folder more or less shifts every label after it)."""
    found, expected = list(found), list(expected)
    if found == expected:
        return
    missing = [c for c in expected if c not in found]
    extra = [c for c in found if c not in expected]
    if missing or extra:
        diff = "; ".join(part for part in (f"missing {quoted(missing)}" if missing else "",
                                           f"extra {quoted(extra)}" if extra else "") if part)
    else:
        diff = "the same names in another order"
    raise DataError(f"{split_dir}: class folders differ from {expected_from} ({diff}); every split needs the same "
                    f"class folders, as labels are the indices of the sorted folder names")


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
        if classes is not None:
            check_same_classes(self.split_dir, found, classes, "the training split's")
        self.classes = found
        self.transform = transform
        self.seed = seed
        self.epoch = 0

    @staticmethod
    def folders_outside_root(cfg) -> list:
        """``[(setting, folder)]`` read besides ``data.root``: none, the splits are folders inside it."""
        return []

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        path, label = self.samples[index]
        try:
            img = open_rgb(path)
            array = self.transform(img, sample_rng(self.seed, self.epoch, index))
        except (OSError, ValueError, SyntaxError):
            return None, label, index
        return array, label, index
