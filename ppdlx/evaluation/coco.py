"""COCO box evaluation with pycocotools, sharded over ranks with every image counted once.

Each rank runs the model + post-processing over its disjoint share of the val images
(``EvalBatchSampler``); detections come back in original-image pixels (post-processing
multiplies by ``image_scale`` = original / resized), class indices are mapped back to the
dataset's category ids, and boxes become COCO ``[x, y, w, h]``. Rank 0 gathers the shards
(``paddle.distributed.all_gather_object``), de-duplicates image ids, optionally writes the
COCO results JSON, and scores with ``COCOeval(iouType="bbox")`` restricted to the evaluated
images; the metrics are broadcast back so every rank returns the same dict.

Metric keys: AP, AP50, AP75, APs, APm, APl, AR1, AR10, AR100, ARs, ARm, ARl (pycocotools'
``stats``; -1 where pycocotools has no ground truth for an area range), plus ``images`` and
``seconds``.
"""
from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import time

import numpy as np
import paddle
import paddle.distributed as pdist

from ppdlx import dist
from ppdlx.evaluation.precise_bn import recompute_bn_stats

log = logging.getLogger("ppdlx.eval")

STAT_KEYS = ("AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "ARs", "ARm", "ARl")


def clip_to_image(boxes, width: float, height: float):
    """``(boxes [K, 4] x1y1x2y2 clipped to the image, has_area [K])``: the post-processing clips to the
    network input, whose padding lies beyond the image's shorter side; a box left with no width or
    height lay wholly in the padding and cannot cover an object (COCO would count it as a false
    positive), so callers drop it."""
    boxes = np.asarray(boxes).reshape(-1, 4)
    boxes = boxes if boxes.dtype.kind == "f" else boxes.astype(np.float32)
    boxes = np.clip(boxes, boxes.dtype.type(0), np.asarray([width, height, width, height], boxes.dtype))
    return boxes, (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])


def detections_to_coco(image_ids, boxes, scores, classes, counts, cat_ids, image_sizes=None) -> list:
    """Post-processed batch -> COCO result dicts.

    ``boxes [N, D, 4]`` x1y1x2y2 in original pixels, ``scores [N, D]``, ``classes [N, D]`` 0-based
    (-1 padding), ``counts [N]``; ``cat_ids[label]`` is the dataset's category id. With ``image_sizes``
    (image id -> ``(width, height)``) boxes are clipped to their image and those left with no area
    dropped (:func:`clip_to_image`).
    """
    out = []
    boxes, scores, classes = np.asarray(boxes), np.asarray(scores), np.asarray(classes)
    counts = np.asarray(counts).reshape(-1)
    for i, image_id in enumerate(np.asarray(image_ids).reshape(-1).tolist()):
        n = int(counts[i])
        size = (image_sizes or {}).get(int(image_id))
        image_boxes, keep = boxes[i, :n], np.ones(n, bool)
        if size is not None:
            image_boxes, keep = clip_to_image(image_boxes, *size)
        for j in np.flatnonzero(keep & (classes[i, :n] >= 0)).tolist():
            x1, y1, x2, y2 = (float(v) for v in image_boxes[j])
            if not all(np.isfinite((x1, y1, x2, y2, float(scores[i, j])))):
                continue  # an untrained head can decode to inf; COCO cannot score it
            out.append({"image_id": int(image_id), "category_id": int(cat_ids[int(classes[i, j])]),
                        "bbox": [round(x1, 3), round(y1, 3), round(x2 - x1, 3), round(y2 - y1, 3)],
                        "score": round(float(scores[i, j]), 5)})
    return out


def coco_evaluate(coco_gt, detections: list, image_ids) -> dict:
    """pycocotools COCOeval (bbox) of ``detections`` over ``image_ids``; returns ``STAT_KEYS`` -> float."""
    return coco_evaluation(coco_gt, detections, image_ids)[0]


def coco_evaluation(coco_gt, detections: list, image_ids):
    """``(STAT_KEYS -> float, the summarised COCOeval or None without detections)``; the COCOeval is what
    ``ppdlx.analysis.detection_analysis`` reads."""
    from pycocotools.cocoeval import COCOeval  # optional (ppdlx[coco]): only COCO evaluation needs it
    image_ids = sorted({int(i) for i in image_ids})
    if not detections or not image_ids:
        return {k: 0.0 for k in STAT_KEYS}, None
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        coco_dt = coco_gt.loadRes(list(detections))
        ev = COCOeval(coco_gt, coco_dt, iouType="bbox")
        ev.params.imgIds = image_ids
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    for line in buf.getvalue().splitlines():
        if line.startswith(" Average"):
            log.debug(line)
    return {k: float(v) for k, v in zip(STAT_KEYS, ev.stats)}, ev


def gather_shards(detections: list, image_ids: list):
    """Every rank's (detections, image ids) -> merged on all ranks (image ids de-duplicated)."""
    if dist.world_size() <= 1:
        return detections, sorted(set(image_ids))
    shards = []
    pdist.all_gather_object(shards, (detections, list(image_ids)))
    return merge_shards(shards)


def merge_shards(shards):
    """``[(detections, image_ids), ...]`` -> (all detections, sorted unique image ids). An image that
    appears in two shards keeps the detections of its first shard only."""
    seen, merged = set(), []
    for dets, ids in shards:
        ids = set(int(i) for i in ids) - seen
        merged += [d for d in dets if d["image_id"] in ids]
        seen |= ids
    return merged, sorted(seen)


def write_results(path: str, detections: list) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(detections, f)
    os.replace(tmp, path)


class CocoEvaluator:
    """``evaluator(model) -> metrics`` over a (sharded) COCO val loader; ``primary = "AP"``."""

    primary = "AP"

    def __init__(self, loader, postprocess, coco_gt, cat_ids, nms="soft", soft_nms_sigma=0.5,
                 score_threshold=0.001, results_path=None, precise_bn=None):
        self.loader, self.postprocess = loader, postprocess
        self.coco_gt, self.cat_ids = coco_gt, list(cat_ids)
        self.nms, self.sigma, self.score_threshold = nms, soft_nms_sigma, score_threshold
        self.results_path = results_path
        self.precise_bn = precise_bn  # (train loader, batches): re-estimate BN statistics before evaluating
        self.last_coco_eval = None  # rank 0: the last evaluation's COCOeval (per-category analysis)
        self.image_sizes = {int(i): (info["width"], info["height"]) for i, info in coco_gt.imgs.items()
                            if "width" in info and "height" in info}

    @paddle.no_grad()
    def predict(self, model):
        """This rank's (COCO detections, evaluated image ids)."""
        detections, image_ids = [], []
        for images, _, _, ids, scales in self.loader:
            # float32, without autocast, whatever the training's AMP: what is evaluated here (and picks
            # the best checkpoint) is what tools/eval.py and the export compute
            cls_out, box_out = model(images)
            cls_out = [c.astype("float32") for c in cls_out]
            box_out = [b.astype("float32") for b in box_out]
            if self.nms == "soft":
                with np.errstate(invalid="ignore", over="ignore"):  # inf boxes of an untrained head
                    boxes, scores, classes, counts = self.postprocess.soft_nms(
                        cls_out, box_out, scales, sigma=self.sigma, score_threshold=self.score_threshold)
            else:
                boxes, scores, classes, counts = (t.numpy() for t in self.postprocess(cls_out, box_out, scales))
            ids = np.asarray(ids).reshape(-1)
            detections += detections_to_coco(ids, boxes, scores, classes, counts, self.cat_ids, self.image_sizes)
            image_ids += ids.tolist()
        return detections, image_ids

    def __call__(self, model) -> dict:
        was_training = model.training
        start = time.perf_counter()
        if self.precise_bn is not None and self.precise_bn[1] > 0:
            recompute_bn_stats(model, self.precise_bn[0], self.precise_bn[1])
        model.eval()
        detections, image_ids = self.predict(model)
        if was_training:
            model.train()
        detections, image_ids = gather_shards(detections, image_ids)
        metrics = None
        if dist.rank() == 0:
            if self.results_path:
                write_results(self.results_path, detections)
            metrics, self.last_coco_eval = coco_evaluation(self.coco_gt, detections, image_ids)
            metrics.update(images=len(image_ids), detections=len(detections))
        if dist.world_size() > 1:
            holder = [metrics]
            pdist.broadcast_object_list(holder, src=0)
            metrics = holder[0]
        metrics["seconds"] = time.perf_counter() - start
        return metrics
