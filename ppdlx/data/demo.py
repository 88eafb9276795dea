"""Demo datasets that ship inside packages, written as an ImageFolder JPEG tree.

* ``digits``: scikit-learn's 1,797 handwritten digits (8x8, 10 classes), upscaled.
* ``fashion_mnist``: Fashion-MNIST from Debian's ``dataset-fashion-mnist`` package.
"""
from __future__ import annotations

import gzip
import os

import numpy as np
from PIL import Image
from sklearn.datasets import load_digits

from ppdlx.errors import DataError

FASHION_DIRS = ("/usr/share/dataset-fashion-mnist", "/usr/share/datasets/fashion-mnist",
                "/usr/share/fashion-mnist")
FASHION_CLASSES = ["t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag",
                   "ankle-boot"]


def load_digits_arrays():
    d = load_digits()
    images = (d.images / 16.0 * 255.0).clip(0, 255).astype(np.uint8)
    return images, d.target.astype(np.int64), [str(i) for i in range(10)]


def _read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def find_fashion_mnist():
    for base in FASHION_DIRS:
        for root, _, files in os.walk(base):
            names = {f.split(".")[0]: os.path.join(root, f) for f in files}
            if "train-images-idx3-ubyte" in names and "train-labels-idx1-ubyte" in names:
                return names
    return None


def load_fashion_arrays(limit=None):
    names = find_fashion_mnist()
    if names is None:
        raise DataError("fashion_mnist: Debian's dataset-fashion-mnist is not installed "
                        "(apt-get install dataset-fashion-mnist), or use --dataset digits")
    images = _read_idx(names["train-images-idx3-ubyte"])
    labels = _read_idx(names["train-labels-idx1-ubyte"]).astype(np.int64)
    if limit:
        images, labels = images[:limit], labels[:limit]
    return images, labels, FASHION_CLASSES


def stratified_split(labels, val_fraction, seed):
    rng = np.random.default_rng(seed)
    val = np.zeros(len(labels), bool)
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        rng.shuffle(idx)
        val[idx[: int(round(len(idx) * val_fraction))]] = True
    return val


def write_image_folder(out_dir, images, labels, class_names, size, val_fraction=0.2, seed=0, quality=95):
    """Write ``out_dir/{train,val}/<class>/<n>.jpg``; returns counts per split."""
    is_val = stratified_split(labels, val_fraction, seed)
    counts = {"train": 0, "val": 0}
    for i, (img, label) in enumerate(zip(images, labels)):
        split = "val" if is_val[i] else "train"
        folder = os.path.join(out_dir, split, class_names[label])
        os.makedirs(folder, exist_ok=True)
        pil = Image.fromarray(img).convert("RGB").resize((size, size), Image.BICUBIC)
        pil.save(os.path.join(folder, f"{i:05d}.jpg"), quality=quality)
        counts[split] += 1
    return counts


def prepare(dataset: str, out_dir: str, size: int, seed: int = 0, limit=None):
    if dataset == "digits":
        images, labels, names = load_digits_arrays()
    elif dataset == "fashion_mnist":
        images, labels, names = load_fashion_arrays(limit)
    else:
        raise DataError(f"unknown demo dataset '{dataset}' (choose digits or fashion_mnist)")
    return write_image_folder(out_dir, images, labels, names, size, seed=seed)
