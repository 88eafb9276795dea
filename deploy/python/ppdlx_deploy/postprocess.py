"""Network outputs to results: top-k classes with probabilities and label names, or the kept
detections (box in original pixels, score, class, label), and boxes drawn on an image."""
from __future__ import annotations

from typing import List, Optional

import numpy as np
from PIL import Image, ImageDraw


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def topk_classes(output: np.ndarray, k: int, is_logits: bool):
    probs = softmax(output) if is_logits else output
    k = min(k, probs.shape[-1])
    idx = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
    return idx, np.take_along_axis(probs, idx, axis=-1)


def postprocess(meta: dict, outputs: List[np.ndarray], topk: int = 5, score_threshold: Optional[float] = None):
    """Per image: classification -> [(class_id, label, prob)], detection -> [(box, score, class_id, label)]."""
    labels = meta.get("labels")
    name = (lambda c: labels[c] if labels and 0 <= c < len(labels) else str(c))
    if meta["model"]["family"] == "classification":
        is_logits = meta["postprocess"].get("output", "logits") == "logits"
        idx, probs = topk_classes(outputs[0], topk, is_logits)
        return [[(int(c), name(int(c)), float(p)) for c, p in zip(ci, pi)] for ci, pi in zip(idx, probs)]
    roles = [o["role"] for o in meta["outputs"]]
    out = dict(zip(roles, outputs))
    thr = meta["postprocess"].get("score_threshold", 0.4) if score_threshold is None else score_threshold
    results = []
    for boxes, scores, classes, count in zip(out["boxes"], out["scores"], out["classes"], out["count"]):
        keep = [i for i in range(int(count)) if scores[i] >= thr]
        results.append([(boxes[i].tolist(), float(scores[i]), int(classes[i]), name(int(classes[i]))) for i in keep])
    return results


def draw_detections(img: Image.Image, detections, path: str) -> None:
    img = img.copy()
    draw = ImageDraw.Draw(img)
    for box, score, _, label in detections:
        draw.rectangle(box, outline=(255, 0, 0), width=2)
        draw.text((box[0] + 2, box[1] + 2), f"{label} {score:.2f}", fill=(255, 0, 0))
    img.save(path)
