"""Image files to network inputs the way an export's ``inference.yml`` says, for calibration and
for the fp32-vs-int8 comparison: the classification pre-processing of the export (not of a
config), applied by ppdlx's own :class:`~ppdlx.data.transforms.EvalTransform`."""
from __future__ import annotations

import math
import os
from types import SimpleNamespace
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

import ppdlx.tasks  # noqa: F401  (registers the task plug-ins TASKS names)
from ppdlx.data.image_file import open_rgb
from ppdlx.data.image_folder import IMAGE_EXTENSIONS, scan_image_folder
from ppdlx.data.transforms import EvalTransform
from ppdlx.errors import ConfigError, DataError, UnsupportedError
from ppdlx.registry import TASKS

# The keys EvalTransform reads, i.e. what a classification export's preprocess must carry.
PREPROCESS_KEYS = ("resize_short", "crop_size", "interpolation", "mean", "std")


def list_images(directory: str) -> List[str]:
    """Every image file under ``directory`` (any depth), sorted: class sub-folders or a flat folder."""
    if not os.path.isdir(directory):
        raise DataError(f"--calib-images {directory}: directory not found")
    paths = [os.path.join(root, name) for root, _, names in os.walk(directory) for name in names
             if name.lower().endswith(IMAGE_EXTENSIONS)]
    if not paths:
        raise DataError(f"--calib-images {directory}: no images ({', '.join(IMAGE_EXTENSIONS)}) in it or below it")
    return sorted(paths)


def spread_subset(paths: Sequence[str], count: Optional[int]) -> List[str]:
    """``count`` paths evenly spaced over the sorted list: with class sub-folders every class is
    represented, and the choice is the same on every run."""
    if count is None or count >= len(paths):
        return list(paths)
    if count < 1:
        raise ConfigError(f"--num-images {count}: need at least 1 calibration image")
    picks = np.unique(np.linspace(0, len(paths) - 1, count).round().astype(int))
    return [paths[i] for i in picks]


def image_input(meta: dict) -> dict:
    """The export's image input spec; detection exports (two inputs, letterbox) are refused."""
    family = meta.get("model", {}).get("family")
    if family not in TASKS or not TASKS.get(family).classifies_images:
        raise UnsupportedError(f"int8 calibration: model.family {family} in inference.yml; only classification "
                               f"exports are calibrated here (detection exports have no legacy-program route)")
    images = [i for i in meta.get("inputs", []) if i.get("role") == "image"]
    if len(images) != 1 or len(meta["inputs"]) != 1:
        raise ConfigError(f"inference.yml inputs {[i.get('name') for i in meta.get('inputs', [])]}: expected one "
                          f"image input for a classifier")
    return images[0]


class ExportPreprocess:
    """``path -> float32 array`` (CHW or HWC per the export's layout) from ``meta['preprocess']``."""

    def __init__(self, meta: dict):
        self.input = image_input(meta)
        pre = meta.get("preprocess") or {}
        if pre.get("type") != "resize_short_center_crop":
            raise ConfigError(f"inference.yml preprocess.type {pre.get('type')}: expected resize_short_center_crop "
                              f"for a classification export")
        missing = [k for k in PREPROCESS_KEYS if k not in pre]
        if missing:
            raise ConfigError(f"inference.yml preprocess: missing {', '.join(missing)}")
        if pre.get("color", "RGB") != "RGB":
            raise ConfigError(f"inference.yml preprocess.color {pre['color']}: ppdlx exports feed RGB")
        self.layout = self.input.get("layout") or meta["model"].get("data_format", "NCHW")
        self.transform = EvalTransform(SimpleNamespace(**{k: pre[k] for k in PREPROCESS_KEYS}), self.layout)
        self.name = self.input["name"]

    def __call__(self, path: str) -> np.ndarray:
        try:
            img = open_rgb(path)
            return self.transform(img)
        except KeyError as err:
            raise ConfigError(f"inference.yml preprocess.interpolation {err}: not one ppdlx resizes with") from None
        except (OSError, ValueError, SyntaxError) as err:
            raise DataError(f"{path}: cannot read the image ({err})") from None

    def batches(self, paths: Sequence[str], batch_size: int) -> Iterator[Dict[str, np.ndarray]]:
        for start in range(0, len(paths), batch_size):
            yield {self.name: np.stack([self(p) for p in paths[start:start + batch_size]])}


def number_of_batches(count: int, batch_size: int) -> int:
    return int(math.ceil(count / batch_size))


def labelled_images(directory: str, labels: Optional[Sequence[str]]) -> Tuple[List[str], np.ndarray]:
    """An ImageFolder split (``<class>/<image>``) as paths and class ids of the EXPORT's label list
    (folder names looked up in ``labels``; without labels, sorted folder order as in training)."""
    classes, samples = scan_image_folder(directory)
    if labels:
        unknown = [c for c in classes if c not in labels]
        if unknown:
            raise DataError(f"{directory}: class folders {unknown[:5]} are not in the export's labels "
                            f"{list(labels)[:10]}")
        index = {name: i for i, name in enumerate(labels)}
        ids = [index[classes[label]] for _, label in samples]
    else:
        ids = [label for _, label in samples]
    return [p for p, _ in samples], np.asarray(ids, np.int64)
