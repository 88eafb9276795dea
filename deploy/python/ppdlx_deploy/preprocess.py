"""Image files to network inputs, as ``inference.yml`` describes: resize the shorter side and crop
the centre (classification), or resize the longer side to the input size and pad bottom/right
(detection). deploy/ must run without ppdlx, so this geometry is defined here and ppdlx's evaluation
transforms (ppdlx.data.transforms.EvalTransform, coco_geometry.eval_size) call these functions: what
a deployment feeds is what was evaluated.

``preprocess.color`` is the channel order the network was trained on: ``RGB`` (every ppdlx
export) or ``BGR`` (channels reversed after decoding, before normalising)."""
from __future__ import annotations

import glob
import os
import warnings
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Type

import numpy as np
from PIL import Image

from .errors import DeployError
from .meta import META_FILE

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".ppm")

# ppdlx's pixel limit (ppdlx.data.image_file): Pillow's refusal threshold, its warning below that an error
MAX_IMAGE_PIXELS = 178_956_970
Image.MAX_IMAGE_PIXELS = MAX_IMAGE_PIXELS
warnings.simplefilter("error", Image.DecompressionBombWarning)

PIL_INTERPOLATION = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "nearest": Image.NEAREST}


def resize_shorter(img: Image.Image, size: int, interpolation: str) -> Image.Image:
    w, h = img.size
    if w <= h:
        new_w, new_h = size, max(1, int(round(h * size / w)))
    else:
        new_w, new_h = max(1, int(round(w * size / h))), size
    return img.resize((new_w, new_h), PIL_INTERPOLATION[interpolation])


def center_crop(img: Image.Image, size: int) -> Image.Image:
    w, h = img.size
    left, top = int(round((w - size) / 2.0)), int(round((h - size) / 2.0))
    return img.crop((left, top, left + size, top + size))


def resize_long_size(width: int, height: int, size: int):
    """Longer side -> ``size`` keeping the aspect ratio: ``(scaled_w, scaled_h, image_scale)``, sizes
    truncated, ``image_scale = original / resized`` (the factor boxes are multiplied by afterwards)."""
    scale = min(size / height, size / width)
    return max(1, int(width * scale + 1e-4)), max(1, int(height * scale + 1e-4)), 1.0 / scale


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
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise DeployError(f"{path}: cannot read image (it declares more than {MAX_IMAGE_PIXELS:,} pixels, the limit "
                          f"against decompression bombs: shrink it)") from None


def readable_batches(paths: Sequence[str], batch_size: int, load: Callable = load_image,
                     on_unreadable: Optional[Callable[[str, Exception], None]] = None,
                     unreadable: Type[Exception] = DeployError) -> Iterator[Tuple[List[str], list]]:
    """``(paths, [load(path), ...])`` per batch, in the order given. A file ``load`` refuses with
    ``unreadable`` raises it; with ``on_unreadable`` it is handed to it (``(path, error)``) and left out
    instead, and the next readable files fill the batch, so each result stays with its path."""
    batch: List[str] = []
    loaded: list = []
    for path in paths:
        try:
            item = load(path)
        except unreadable as err:
            if on_unreadable is None:
                raise
            on_unreadable(path, err)
            continue
        batch.append(path)
        loaded.append(item)
        if len(batch) == batch_size:
            yield batch, loaded
            batch, loaded = [], []
    if batch:
        yield batch, loaded


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
        # resize_long_pad: the longer side to `size`, pad bottom/right.
        size = int(c["size"])
        w, h = img.size
        new_w, new_h, image_scale = resize_long_size(w, h, size)
        fx, fy = new_w / w, new_h / h
        resized = img.resize((new_w, new_h), PIL_INTERPOLATION[c["interpolation"]], box=(0, 0, new_w / fx, new_h / fy))
        arr = normalize(resized, c["mean"], c["std"], "NHWC", self.color)
        # pad_value is in normalised units (ppdlx pads after normalising: 0 is the mean colour)
        canvas = np.empty((size, size, 3), np.float32)
        canvas[...] = np.asarray(c.get("pad_value", 0.0), np.float32)
        canvas[:new_h, :new_w] = arr
        if self.layout == "NCHW":
            canvas = canvas.transpose(2, 0, 1)
        return np.ascontiguousarray(canvas), image_scale

    def feeds(self, images: Sequence[Image.Image]) -> Dict[str, np.ndarray]:
        arrays, scales = zip(*(self(img) for img in images))
        feeds = {self.input_name: np.stack(arrays)}
        if self.scale_name:
            feeds[self.scale_name] = np.asarray(scales, np.float32)
        return feeds

    def feeds_from_files(self, paths: Sequence[str]) -> Dict[str, np.ndarray]:
        """Decode the files (RGB) and pre-process them into one batch."""
        return self.feeds([load_image(p) for p in paths])
