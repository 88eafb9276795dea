"""Per-category analysis of a detector from pycocotools' own arrays: per-category AP/AP50/AP75/APs/APm/APl
from ``COCOeval.eval['precision']`` (averaged exactly as ``COCOeval.summarize`` averages it, restricted to
one category), AR100 from ``eval['recall']``, ``pr_curves.png`` (precision over pycocotools' recall grid per
category), ``detections.png`` (predicted boxes beside the ground truth on the images with the most errors at
IoU 0.5) and ``analysis.md``.

Input: a ``COCOeval`` on which ``evaluate()`` and ``accumulate()`` have run (``summarize()`` optional).
"""
from __future__ import annotations

import math
import os

import numpy as np

from ppdlx.analysis.figures import (class_colour, draw_boxes, hide_unused, load_rgb, new_figure,
                                    plotting_available, save_figure, show_image)
from ppdlx.analysis.tables import markdown_table, skipped_lines, write_text

PR_CELL = (320, 260)
PR_COLUMNS = 4
PAIR_CELL = 260       # one image of a ground-truth / prediction pair
PAIRS_PER_ROW = 2
PAIRS_TITLE_PX = 60
STAT_NAMES = ("AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "ARs", "ARm", "ARl")


def _check_accumulated(coco_eval):
    if not getattr(coco_eval, "eval", None) or "precision" not in coco_eval.eval:
        raise ValueError("coco_eval has no accumulated results: call evaluate() and accumulate() first")


def _mean_valid(values) -> float:
    """pycocotools' average: entries of -1 (no ground truth) left out; -1 when nothing is left."""
    values = np.asarray(values)
    values = values[values > -1]
    return float(values.mean()) if values.size else -1.0


def _category_names(coco_eval) -> list:
    p = coco_eval.params
    if not p.useCats:
        return ["all categories"]
    cats = {c["id"]: c.get("name", str(c["id"])) for c in coco_eval.cocoGt.loadCats(p.catIds)}
    return [str(cats.get(cid, cid)) for cid in p.catIds]


def per_category_ap(coco_eval) -> list:
    """One dict per category of ``params.catIds`` (order kept): ``category_id``, ``name``, ``AP``, ``AP50``,
    ``AP75``, ``APs``, ``APm``, ``APl``, ``AR100``, ``gt`` (non-crowd boxes), ``detections``; -1 where
    pycocotools has no ground truth."""
    _check_accumulated(coco_eval)
    p, precision, recall = coco_eval.params, coco_eval.eval["precision"], coco_eval.eval["recall"]
    area = {label: i for i, label in enumerate(p.areaRngLbl)}
    m = len(p.maxDets) - 1  # pycocotools' AP uses the largest maxDets (100)
    t50, t75 = (np.flatnonzero(np.isclose(p.iouThrs, t)) for t in (0.5, 0.75))
    cat_ids = list(p.catIds) if p.useCats else [-1]
    out = []
    for k, (cid, name) in enumerate(zip(cat_ids, _category_names(coco_eval))):
        cats = [cid] if p.useCats else []
        out.append({
            "category_id": int(cid), "name": name,
            "AP": _mean_valid(precision[:, :, k, area["all"], m]),
            "AP50": _mean_valid(precision[t50, :, k, area["all"], m]),
            "AP75": _mean_valid(precision[t75, :, k, area["all"], m]),
            "APs": _mean_valid(precision[:, :, k, area["small"], m]),
            "APm": _mean_valid(precision[:, :, k, area["medium"], m]),
            "APl": _mean_valid(precision[:, :, k, area["large"], m]),
            "AR100": _mean_valid(recall[:, k, area["all"], m]),
            "gt": len(coco_eval.cocoGt.getAnnIds(imgIds=p.imgIds, catIds=cats, iscrowd=False)),
            "detections": len(coco_eval.cocoDt.getAnnIds(imgIds=p.imgIds, catIds=cats)),
        })
    return out


def pr_curves(coco_eval) -> dict:
    """``{"recall": [R], "curves": [{name, "iou 0.50": [R], "iou 0.75": [R], "iou 0.50:0.95": [R]}]}``;
    precision is NaN where pycocotools has none (-1)."""
    _check_accumulated(coco_eval)
    p, precision = coco_eval.params, coco_eval.eval["precision"]
    a, m = p.areaRngLbl.index("all"), len(p.maxDets) - 1
    t50, t75 = (int(np.flatnonzero(np.isclose(p.iouThrs, t))[0]) for t in (0.5, 0.75))
    curves = []
    for k, name in enumerate(_category_names(coco_eval)):
        pr = np.where(precision[:, :, k, a, m] > -1, precision[:, :, k, a, m], np.nan)
        mean = np.full(pr.shape[1], np.nan)
        valid = ~np.isnan(pr).all(axis=0)
        mean[valid] = np.nanmean(pr[:, valid], axis=0)
        curves.append({"name": name, "iou 0.50": pr[t50], "iou 0.75": pr[t75], "iou 0.50:0.95": mean})
    return {"recall": np.asarray(p.recThrs), "curves": curves}


def image_errors(coco_eval, score_threshold: float) -> dict:
    """image id -> missed ground-truth boxes + false detections (score >= threshold) at IoU 0.5, from
    ``COCOeval.evalImgs`` (all areas)."""
    p = coco_eval.params
    t50 = int(np.flatnonzero(np.isclose(p.iouThrs, 0.5))[0])
    whole = list(p.areaRng[p.areaRngLbl.index("all")])
    errors = {int(i): 0 for i in p.imgIds}
    for e in coco_eval.evalImgs or []:
        if e is None or list(e["aRng"]) != whole:
            continue
        gt_ignore = np.asarray(e["gtIgnore"], bool).reshape(-1)
        missed = int(((np.asarray(e["gtMatches"])[t50] == 0) & ~gt_ignore).sum()) if len(gt_ignore) else 0
        scores = np.asarray(e["dtScores"])
        false = 0
        if len(scores):
            unmatched = (np.asarray(e["dtMatches"])[t50] == 0) & ~np.asarray(e["dtIgnore"])[t50].astype(bool)
            false = int((unmatched & (scores >= score_threshold)).sum())
        errors[int(e["image_id"])] = errors.get(int(e["image_id"]), 0) + missed + false
    return errors


def detection_analysis(coco_eval, out_dir: str, image_dir: str | None = None, max_images: int = 8,
                       score_threshold: float = 0.3, figures: bool = True) -> dict:
    """Per-category table, ``analysis.md``, ``pr_curves.png`` and (with ``image_dir``) ``detections.png``.
    Returns ``{"task", "stats", "per_category": {name: {...}}, "images_shown", "score_threshold", "files"}``."""
    per_cat = per_category_ap(coco_eval)
    stats = getattr(coco_eval, "stats", None)
    result = {"task": "detection", "score_threshold": float(score_threshold),
              "stats": {k: float(v) for k, v in zip(STAT_NAMES, stats)} if stats is not None and len(stats) == 12
              else None,
              "per_category": {c["name"]: {k: v for k, v in c.items() if k != "name"} for c in per_cat}}
    errors = image_errors(coco_eval, score_threshold)
    shown = sorted(errors, key=lambda i: (-errors[i], i))[:max_images]
    result["images_shown"] = [{"image_id": i, "errors_at_iou_0.5": errors[i]} for i in shown]
    os.makedirs(out_dir, exist_ok=True)
    drawn, skipped = {}, {}
    if figures and plotting_available():
        drawn["pr_curves.png"] = save_figure(lambda: pr_figure(pr_curves(coco_eval)),
                                             os.path.join(out_dir, "pr_curves.png"), skipped)
        if image_dir:
            drawn["detections.png"] = save_figure(
                lambda: detections_figure(coco_eval, image_dir, shown, errors, score_threshold),
                os.path.join(out_dir, "detections.png"), skipped)
    files = {name: path for name, path in drawn.items() if path}
    if skipped:
        result["figures_skipped"] = skipped
    files["analysis.md"] = write_text(os.path.join(out_dir, "analysis.md"), detection_markdown(result, files))
    result["files"] = files
    return result


def pr_size(categories: int):
    columns = min(PR_COLUMNS, max(categories, 1))
    return columns * PR_CELL[0], 50 + math.ceil(max(categories, 1) / columns) * PR_CELL[1]


def pr_figure(pr):
    n = len(pr["curves"])
    width, height = pr_size(n)
    columns = min(PR_COLUMNS, max(n, 1))
    fig = new_figure(width, height)
    fig.subplots_adjust(left=0.07, right=0.98, bottom=40 / height, top=1.0 - 50 / height,
                        wspace=0.3, hspace=0.45)
    axes = [ax for row in fig.subplots(math.ceil(max(n, 1) / columns), columns, squeeze=False) for ax in row]
    fig.suptitle("precision-recall per category (pycocotools, area all, 100 detections/image)", fontsize=10)
    for ax, curve in zip(axes, pr["curves"]):
        for style, key in (("-", "iou 0.50"), ("--", "iou 0.75"), (":", "iou 0.50:0.95")):
            ax.plot(pr["recall"], curve[key], style, linewidth=1.3, label=key)
        ax.set_title(curve["name"], fontsize=9)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("recall", fontsize=8)
        ax.set_ylabel("precision", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if np.isnan(curve["iou 0.50"]).all():
            ax.text(0.5, 0.5, "no ground truth", ha="center", va="center", transform=ax.transAxes)
    if pr["curves"]:
        axes[0].legend(fontsize=7, loc="lower left")
    hide_unused(axes, n)
    return fig


def detections_size(images: int):
    rows = math.ceil(max(images, 1) / PAIRS_PER_ROW)
    return 2 * PAIRS_PER_ROW * PAIR_CELL, PAIRS_TITLE_PX + rows * PAIR_CELL


def detections_figure(coco_eval, image_dir, image_ids, errors, score_threshold):
    gt, dt = coco_eval.cocoGt, coco_eval.cocoDt
    cat_index = {cid: k for k, cid in enumerate(coco_eval.params.catIds)}
    names = dict(zip(coco_eval.params.catIds, _category_names(coco_eval)))
    width, height = detections_size(len(image_ids))
    fig = new_figure(width, height)
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.01, top=1.0 - PAIRS_TITLE_PX / height, wspace=0.05,
                        hspace=0.2)
    rows = math.ceil(max(len(image_ids), 1) / PAIRS_PER_ROW)
    axes = [ax for row in fig.subplots(rows, 2 * PAIRS_PER_ROW, squeeze=False) for ax in row]
    fig.suptitle(f"ground truth | predictions with score >= {score_threshold:g}; images with the most errors "
                 f"at IoU 0.5 first", fontsize=10)
    for n, image_id in enumerate(image_ids):
        info = gt.imgs[image_id]
        image = load_rgb(os.path.join(image_dir, info["file_name"]))
        truth = gt.loadAnns(gt.getAnnIds(imgIds=[image_id]))
        preds = [d for d in dt.loadAnns(dt.getAnnIds(imgIds=[image_id])) if d["score"] >= score_threshold]
        left, right = axes[2 * n], axes[2 * n + 1]
        show_image(left, image, title=f"{info['file_name']}: truth ({len(truth)})", fontsize=7)
        draw_boxes(left, [a["bbox"] for a in truth], [names.get(a["category_id"], a["category_id"]) for a in truth],
                   [class_colour(cat_index.get(a["category_id"], 0)) for a in truth])
        show_image(right, image, title=f"predicted ({len(preds)}), {errors.get(image_id, 0)} errors", fontsize=7)
        draw_boxes(right, [d["bbox"] for d in preds], [names.get(d["category_id"], d["category_id"]) for d in preds],
                   [class_colour(cat_index.get(d["category_id"], 0)) for d in preds],
                   scores=[d["score"] for d in preds])
    hide_unused(axes, 2 * len(image_ids))
    return fig


def detection_markdown(result, files) -> str:
    lines = ["# Per-category analysis (detection)", ""]
    if result["stats"]:
        s = result["stats"]
        lines += [f"AP {s['AP']:.4f}, AP50 {s['AP50']:.4f}, AP75 {s['AP75']:.4f}, APs {s['APs']:.4f}, "
                  f"APm {s['APm']:.4f}, APl {s['APl']:.4f}, AR100 {s['AR100']:.4f} (pycocotools; -1 = no ground "
                  f"truth in that range).", ""]
    headers = ["category", "id", "AP", "AP50", "AP75", "APs", "APm", "APl", "AR100", "gt boxes", "detections"]
    rows = [[name, c["category_id"]] + [c[k] for k in headers[2:9]] + [c["gt"], c["detections"]]
            for name, c in result["per_category"].items()]
    lines += [markdown_table(headers, rows), ""]
    for name in ("pr_curves.png", "detections.png"):
        if name in files:
            lines += [f"![{name}]({name})", ""]
    lines += skipped_lines(result)
    if result["images_shown"]:
        shown = ", ".join(f"{i['image_id']} ({i['errors_at_iou_0.5']})" for i in result["images_shown"])
        lines += [f"Images with the most errors at IoU 0.5 (missed boxes + detections with score >= "
                  f"{result['score_threshold']:g} matching nothing): {shown}.", ""]
    return "\n".join(lines)
