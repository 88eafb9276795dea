"""Image files to network inputs, as ``inference.yml`` describes: a line-by-line mirror of
ppdlx.data.transforms (EvalTransform) for classification, and of EfficientDet's eval transform
(ppdlx.data.coco_dataset / coco_geometry.eval_size: longer side to the input size, pad
bottom/right) for detection. Deliberately a copy: deploy/ must run without ppdlx.

``preprocess.color`` is the channel order the network was trained on: ``RGB`` (every ppdlx
export) or ``BGR`` (channels reversed after decoding, before normalising)."""
from __future__ import annotations

import glob
import os
from typing import Dict, List, Sequence

import numpy as np
from PIL import Image

from .errors import DeployError
from .meta import META_FILE

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".ppm")

_INTERP = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "nearest": Image.NEAREST}


def resize_shorter(img: Image.Image, size: int, interpolation: str) -> Image.Image:
    w, h = img.size
    if w <= h:
        new_w, new_h = size, max(1, int(round(h * size / w)))
    else:
        new_w, new_h = max(1, int(round(w * size / h))), size
    return img.resize((new_w, new_h), _INTERP[interpolation])


def center_crop(img: Image.Image, size: int) -> Image.Image:
    w, h = img.size
    left, top = int(round((w - size) / 2.0)), int(round((h - size) / 2.0))
    return img.crop((left, top, left + size, top + size))


COLORS = ("RGB", "BGR")


def normalize(img: Image.Image, mean, std, layout: str, color: str = "RGB") -> np.ndarray:
    arr = np.asarray(img, dtype=np.float32)
    if color == "BGR":
        arr = arr[..., ::-1]
    arr = (arr - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(arr.transpose(2, 0, 1) if layout == "NCHW" else arr)


def load_image(path: str) -> Image.Image:
    try:
        with Image.open(path) as img:
            return img.convert("RGB")
    except (OSError, ValueError, SyntaxError) as err:
        raise DeployError(f"{path}: cannot read image ({err})") from None


def list_images(path: str) -> List[str]:
    if os.path.isdir(path):
        files = sorted(p for p in glob.glob(os.path.join(path, "**", "*"), recursive=True)
                       if p.lower().endswith(IMAGE_EXTENSIONS))
        if not files:
            raise DeployError(f"{path}: no images ({', '.join(IMAGE_EXTENSIONS)})")
        return files
    if not os.path.isfile(path):
        raise DeployError(f"--input {path}: no such file or directory")
    return [path]


class Preprocessor:
    """``inference.yml`` pre-processing. ``__call__(PIL image) -> (array, scale)``; ``scale`` is
    original pixels per input pixel (detection) or 1.0 (classification)."""

    def __init__(self, meta: dict):
        self.cfg = meta["preprocess"]
        self.family = meta["model"]["family"]
        image_input = [i for i in meta["inputs"] if i.get("role", "image") == "image"][0]
        self.input_name = image_input["name"]
        self.layout = image_input.get("layout", meta["model"].get("data_format", "NCHW"))
        self.scale_name = next((i["name"] for i in meta["inputs"] if i.get("role") == "scale"), None)
        if self.cfg["type"] not in ("resize_short_center_crop", "resize_long_pad"):
            raise DeployError(f"{META_FILE}: unknown preprocess.type {self.cfg['type']!r}")
        self.color = self.cfg.get("color", "RGB")
        if self.color not in COLORS:
            raise DeployError(f"{META_FILE}: preprocess.color {self.color!r}: expected one of {', '.join(COLORS)}")

    def __call__(self, img: Image.Image):
        c = self.cfg
        if c["type"] == "resize_short_center_crop":
            img = center_crop(resize_shorter(img, c["resize_short"], c["interpolation"]), c["crop_size"])
            return normalize(img, c["mean"], c["std"], self.layout, self.color), 1.0
        # resize_long_pad: the longer side to `size` (truncated, as ppdlx's eval_size), pad bottom/right.
        size = int(c["size"])
        w, h = img.size
        ratio = min(size / h, size / w)
        new_w, new_h = max(1, int(w * ratio + 1e-4)), max(1, int(h * ratio + 1e-4))
        fx, fy = new_w / w, new_h / h
        resized = img.resize((new_w, new_h), _INTERP[c["interpolation"]], box=(0, 0, new_w / fx, new_h / fy))
        arr = normalize(resized, c["mean"], c["std"], "NHWC", self.color)
        # pad_value is in normalised units (ppdlx pads after normalising: 0 is the mean colour)
        canvas = np.empty((size, size, 3), np.float32)
        canvas[...] = np.asarray(c.get("pad_value", 0.0), np.float32)
        canvas[:new_h, :new_w] = arr
        if self.layout == "NCHW":
            canvas = canvas.transpose(2, 0, 1)
        return np.ascontiguousarray(canvas), 1.0 / ratio

    def feeds(self, images: Sequence[Image.Image]) -> Dict[str, np.ndarray]:
        arrays, scales = zip(*(self(img) for img in images))
        feeds = {self.input_name: np.stack(arrays)}
        if self.scale_name:
            feeds[self.scale_name] = np.asarray(scales, np.float32)
        return feeds

    def feeds_from_files(self, paths: Sequence[str]) -> Dict[str, np.ndarray]:
        """Decode the files (RGB) and pre-process them into one batch."""
        return self.feeds([load_image(p) for p in paths])
