"""Single-image detection with the dynamic model + weights, and drawing the result (``tools/infer.py``).

``Detector(cfg)`` builds the model from the config (``data.coco.image_size``, ``model.*``),
loads ``model.weights`` and applies the eval transform (resize longer side, pad, normalise
once); ``detect(path)`` returns boxes in original-image pixels. Class names come from
``<global.output_dir>/classes.json`` (written by training), else from the val/train json's
categories, else ``class <k>``.
"""
from __future__ import annotations

import json
import os

import numpy as np
import paddle
from PIL import Image, ImageDraw, ImageFont

from ppdlx.checkpoint import load_weights, strip_suffix
from ppdlx.data.coco import coco_paths, eval_image
from ppdlx.errors import ConfigError, DataError
from ppdlx.evaluation.coco import clip_to_image
from ppdlx.tasks.detection import build_detection_model, build_postprocess
from ppdlx.tasks.preprocess import resolve_preprocessing

PALETTE = [(230, 25, 75), (60, 180, 75), (0, 130, 200), (245, 130, 48), (145, 30, 180), (70, 240, 240),
           (240, 50, 230), (210, 245, 60), (0, 128, 128), (170, 110, 40), (128, 0, 0), (0, 0, 128)]


def class_names(cfg, weights=None):
    """Names by class index from classes.json next to the weights / in output_dir, or the json's categories."""
    candidates = []
    if weights:
        candidates.append(os.path.join(os.path.dirname(os.path.abspath(strip_suffix(weights))), "classes.json"))
    candidates.append(os.path.join(cfg.global_.output_dir, "classes.json"))
    for path in candidates:
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                return list(json.load(f)["names"])
    for split in ("val", "train"):
        json_path, _ = coco_paths(cfg, split)
        if os.path.isfile(json_path):
            with open(json_path, encoding="utf-8") as f:
                cats = sorted(json.load(f).get("categories", []), key=lambda c: c["id"])
            if cats:
                return [str(c.get("name", c["id"])) for c in cats]
    return [f"class {k}" for k in range(cfg.model.num_classes)]


class Detector:
    def __init__(self, cfg, nms="hard", score_threshold=0.001):
        if not cfg.model.weights:
            raise ConfigError("model.weights is not set: pass -o model.weights=<checkpoint prefix>")
        cfg = resolve_preprocessing(cfg)
        self.cfg = cfg
        self.model = build_detection_model(cfg, cfg.model.num_classes)
        load_weights(self.model, cfg.model.weights, copy=cfg.model.weights_copy)
        self.model.eval()
        self.post = build_postprocess(cfg, self.model)
        self.nms, self.score_threshold = nms, score_threshold
        self.names = class_names(cfg, cfg.model.weights)

    @paddle.no_grad()
    def detect(self, image):
        """PIL image or path -> (image, boxes [K,4] x1y1x2y2 original pixels within the image, scores [K],
        classes [K])."""
        if isinstance(image, str):
            if not os.path.isfile(image):
                raise DataError(f"{image}: image file not found")
            with Image.open(image) as im:
                image = im.convert("RGB")
        arr, image_scale = eval_image(self.cfg, image)
        cls_out, box_out = self.model(paddle.to_tensor(arr[None]))
        scales = paddle.to_tensor([image_scale], dtype="float32")
        if self.nms == "soft":
            boxes, scores, classes, count = self.post.soft_nms(cls_out, box_out, scales,
                                                               sigma=self.cfg.detection.soft_nms_sigma,
                                                               score_threshold=self.score_threshold)
        else:
            boxes, scores, classes, count = (t.numpy() for t in self.post(cls_out, box_out, scales))
        n = int(np.asarray(count).reshape(-1)[0])
        boxes, has_area = clip_to_image(boxes[0][:n], *image.size)
        keep = (np.asarray(scores[0][:n]) >= self.score_threshold) & has_area
        return image, boxes[keep], np.asarray(scores[0][:n])[keep], np.asarray(classes[0][:n])[keep]


def _font(size):
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1
        return ImageFont.load_default()


def draw_detections(image, boxes, scores, classes, names, line_width=None):
    """Boxes with "name score" labels drawn on a copy of the PIL image."""
    out = image.convert("RGB").copy()
    draw = ImageDraw.Draw(out)
    lw = line_width or max(2, round(max(out.size) / 250))
    font = _font(max(11, round(max(out.size) / 40)))
    for (x1, y1, x2, y2), s, c in zip(np.asarray(boxes).tolist(), np.asarray(scores).tolist(),
                                      np.asarray(classes).tolist()):
        colour = PALETTE[int(c) % len(PALETTE)]
        name = names[int(c)] if 0 <= int(c) < len(names) else f"class {int(c)}"
        label = f"{name} {s:.2f}"
        draw.rectangle((x1, y1, x2, y2), outline=colour, width=lw)
        try:
            tb = draw.textbbox((x1, y1), label, font=font)
        except UnicodeEncodeError:
            label = f"class {int(c)} {s:.2f}"
            tb = draw.textbbox((x1, y1), label, font=font)
        th, tw = tb[3] - tb[1], tb[2] - tb[0]
        ty = y1 - th - 4 if y1 - th - 4 >= 0 else y1
        draw.rectangle((x1, ty, x1 + tw + 4, ty + th + 4), fill=colour)
        draw.text((x1 + 2, ty + 2 - tb[1] + y1), label, fill=(255, 255, 255), font=font)
    return out
