"""Network outputs to results: top-k classes with probabilities and label names, or the kept
detections (box in original pixels, score, class, label), and boxes drawn on an image.

A detection export's ONNX graph stops before NMS (paddle2onnx's conversion of Paddle's
``multiclass_nms3`` gives wrong shapes in onnxruntime): it outputs the top-k decoded candidates,
and :func:`complete_outputs` runs :func:`multiclass_nms` here, a numpy mirror of the Paddle
kernel the Paddle program runs, so every backend hands ``postprocess`` the same four outputs.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from PIL import Image, ImageDraw

from .meta import graph_roles

CANDIDATE_ROLES = ("candidate_boxes", "candidate_scores", "candidate_classes")


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def topk_classes(output: np.ndarray, k: int, is_logits: bool):
    probs = softmax(output) if is_logits else output
    k = min(k, probs.shape[-1])
    idx = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
    return idx, np.take_along_axis(probs, idx, axis=-1)


def label_name(meta: dict, class_id: int) -> str:
    """The class's name from ``inference.yml`` labels; the bare index only when the export has none."""
    labels = meta.get("labels")
    return str(labels[class_id]) if labels and 0 <= class_id < len(labels) else str(class_id)


def _greedy_nms(boxes: np.ndarray, order: np.ndarray, iou_threshold: np.float32) -> List[int]:
    """Paddle's ``NMSFast`` for one class (normalized boxes, eta 1): walk ``order`` and keep a
    box whose IoU with every kept box is ``<= iou_threshold``. float32 arithmetic in the kernel's
    order, so the same boxes survive."""
    kept: List[int] = []
    x1, y1, x2, y2 = (boxes[:, i] for i in range(4))
    with np.errstate(all="ignore"):  # an untrained head decodes to inf boxes, as in the Paddle kernel
        area = np.where((x2 < x1) | (y2 < y1), np.float32(0), (x2 - x1) * (y2 - y1)).astype(np.float32)
    suppressed = np.zeros(len(order), bool)
    for pos, idx in enumerate(order):
        if suppressed[pos]:
            continue
        kept.append(int(idx))
        rest = order[pos + 1:]
        if not len(rest):
            break
        disjoint = (x1[idx] > x2[rest]) | (x2[idx] < x1[rest]) | (y1[idx] > y2[rest]) | (y2[idx] < y1[rest])
        with np.errstate(all="ignore"):
            inter = ((np.minimum(x2[rest], x2[idx]) - np.maximum(x1[rest], x1[idx]))
                     * (np.minimum(y2[rest], y2[idx]) - np.maximum(y1[rest], y1[idx])))
            iou = np.where(disjoint, np.float32(0), inter / (area[rest] + area[idx] - inter))
        suppressed[pos + 1:] |= ~(iou <= iou_threshold)
    return kept


def multiclass_nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, score_threshold: float,
                   iou_threshold: float, keep_top_k: int):
    """One image's candidates (``boxes [K, 4]``, ``scores [K]``, ``classes [K]``) -> ``boxes [D, 4]``,
    ``scores [D]``, ``classes [D]`` int64 (-1 padding), ``count``; ``D = keep_top_k``.

    The semantics of Paddle's CPU ``multiclass_nms3`` (paddle/phi/kernels/cpu/multiclass_nms3_kernel.cc)
    as ppdlx's graph calls it (one score row per class, background -1, nms_top_k -1, normalized,
    eta 1): per class in ascending order, candidates scoring ``> score_threshold`` stable-sorted by
    score, greedy NMS; then the best ``keep_top_k`` over all classes, ordered by score (ties: class,
    then selection order), as the graph's final stable sort leaves them."""
    boxes = np.asarray(boxes, np.float32)
    scores = np.asarray(scores, np.float32)
    classes = np.asarray(classes).astype(np.int64)
    selected = []  # (score, class, box index) in class order, then selection order
    for c in np.unique(classes):
        candidates = np.flatnonzero((classes == c) & (scores > np.float32(score_threshold)))
        order = candidates[np.argsort(-scores[candidates], kind="stable")]
        selected += [(scores[i], int(c), i) for i in _greedy_nms(boxes, order, np.float32(iou_threshold))]
    if selected:
        rank = np.argsort(-np.asarray([s for s, _, _ in selected], np.float32), kind="stable")[:keep_top_k]
        selected = [selected[i] for i in rank]
    out_boxes = np.zeros((keep_top_k, 4), np.float32)
    out_scores = np.zeros(keep_top_k, np.float32)
    out_classes = np.full(keep_top_k, -1, np.int64)
    for row, (score, c, i) in enumerate(selected):
        out_boxes[row], out_scores[row], out_classes[row] = boxes[i], score, c
    return out_boxes, out_scores, out_classes, len(selected)


def complete_outputs(meta: dict, graph: str, outputs: List[np.ndarray],
                     feeds: Dict[str, np.ndarray]) -> List[np.ndarray]:
    """The outputs of ``meta["outputs"]`` whichever ``graph`` ran (``"onnx"`` or ``"program"``, a
    predictor's ``plan["graph"]``): a detection ONNX graph's candidates
    (input pixels) go through :func:`multiclass_nms`, are clipped to the input (``clip_to_input_hw``,
    written by exports whose program clips) and scaled to original pixels by the ``image_scale``
    feed, as the Paddle program does inside the graph."""
    roles = graph_roles(meta, graph)
    if tuple(roles) != CANDIDATE_ROLES:
        return outputs
    nms = meta["onnx"]["nms"]
    out = dict(zip(roles, outputs))
    scale_name = next(i["name"] for i in meta["inputs"] if i.get("role") == "scale")
    scales = np.asarray(feeds[scale_name], np.float32).reshape(-1)
    results = [multiclass_nms(b, s, c, nms["score_threshold"], nms["iou_threshold"], nms["keep_top_k"])
               for b, s, c in zip(out["candidate_boxes"], out["candidate_scores"], out["candidate_classes"])]
    boxes = np.stack([r[0] for r in results])
    if nms.get("clip_to_input_hw"):
        h, w = (float(v) for v in nms["clip_to_input_hw"])
        boxes = np.clip(boxes, np.float32(0), np.asarray([w, h, w, h], np.float32))
    boxes = boxes * scales.reshape(-1, 1, 1)
    return [boxes.astype(np.float32), np.stack([r[1] for r in results]), np.stack([r[2] for r in results]),
            np.asarray([r[3] for r in results], np.int32)]


def clip_to_images(meta: dict, outputs: List[np.ndarray], sizes: Sequence[Tuple[int, int]]) -> List[np.ndarray]:
    """A detection batch's boxes clipped to each image's ``(width, height)``: the graph clips to the
    network input, whose padding lies beyond an image's shorter side (what ppdlx's evaluator clips
    its COCO results to). A box left with no width or height lay wholly in the padding: it is
    dropped, the image's later detections move up (score order kept) and its count shrinks, as the
    evaluator drops it. Classification outputs are returned as they are."""
    if not decodes_boxes(meta):
        return outputs
    roles = [o["role"] for o in meta["outputs"]]
    out = dict(zip(roles, outputs))
    limits = np.asarray([[w, h, w, h] for w, h in sizes], np.float32).reshape(-1, 1, 4)
    boxes = np.clip(np.asarray(out["boxes"], np.float32), np.float32(0), limits)
    counts = np.asarray(out["count"]).reshape(-1)
    has_area = (boxes[..., 2] > boxes[..., 0]) & (boxes[..., 3] > boxes[..., 1])
    valid = np.arange(boxes.shape[1])[None, :] < counts[:, None]
    compacted = {"boxes": boxes}
    if not has_area[valid].all():
        scores, classes = np.asarray(out["scores"]), np.asarray(out["classes"])
        compacted = {"boxes": np.zeros_like(boxes), "scores": np.zeros_like(scores),
                     "classes": np.full_like(classes, -1), "count": np.zeros_like(np.asarray(out["count"]))}
        for i in range(len(counts)):
            kept = np.flatnonzero(has_area[i] & valid[i])
            compacted["boxes"][i, :len(kept)] = boxes[i, kept]
            compacted["scores"][i, :len(kept)] = scores[i, kept]
            compacted["classes"][i, :len(kept)] = classes[i, kept]
            compacted["count"].reshape(-1)[i] = len(kept)
    return [compacted.get(role, o) for role, o in zip(roles, outputs)]


def postprocess(meta: dict, outputs: List[np.ndarray], topk: int = 5, score_threshold: Optional[float] = None):
    """Per image: classification -> [(class_id, label, prob)], detection -> [(box, score, class_id, label)];
    ``label`` is the class name from ``inference.yml``."""
    if not decodes_boxes(meta):
        is_logits = meta["postprocess"].get("output", "logits") == "logits"
        idx, probs = topk_classes(outputs[0], topk, is_logits)
        return [[(int(c), label_name(meta, int(c)), float(p)) for c, p in zip(ci, pi)] for ci, pi in zip(idx, probs)]
    roles = [o["role"] for o in meta["outputs"]]
    out = dict(zip(roles, outputs))
    thr = meta["postprocess"].get("score_threshold", 0.4) if score_threshold is None else score_threshold
    results = []
    for boxes, scores, classes, count in zip(out["boxes"], out["scores"], out["classes"], out["count"]):
        keep = [i for i in range(int(count)) if scores[i] >= thr]
        results.append([(boxes[i].tolist(), float(scores[i]), int(classes[i]), label_name(meta, int(classes[i])))
                        for i in keep])
    return results


def decodes_boxes(meta: dict) -> bool:
    """Whether the export's outputs are boxes (a detector's), which its results carry and can be drawn."""
    return (meta.get("model") or {}).get("family") == "detection"


def result_text(meta: dict, path: str, result) -> str:
    """One image's :func:`postprocess` result as the command line prints it."""
    if not decodes_boxes(meta):
        return f"{path}: " + ", ".join(f"{label} (id {c}) {p:.4f}" for c, label, p in result)
    return f"{path}: {len(result)} detections" + "".join(
        f"\n  {label} (id {c}) {s:.3f} [{', '.join(f'{v:.1f}' for v in box)}]" for box, s, c, label in result)


def draw_detections(img: Image.Image, detections, path: str) -> None:
    img = img.copy()
    draw = ImageDraw.Draw(img)
    for box, score, _, label in detections:
        draw.rectangle(box, outline=(255, 0, 0), width=2)
        draw.text((box[0] + 2, box[1] + 2), f"{label} {score:.2f}", fill=(255, 0, 0))
    img.save(path)
