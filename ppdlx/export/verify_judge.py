"""Scores, agreement, the gate and the one-line diagnosis of one ``--verify`` case (a backend and
precision), from the predictions of :mod:`ppdlx.export.verify_runs`.

The deployed model is scored by the label NAMES it reports (what a user's service sees) against
the ground truth; agreement is per image: the same top-1 name as ppdlx's model (classification), or
the same kept boxes (detection: score >= the export's display threshold, matched one-to-one by
name and IoU >= 0.5; a box within ``BOUNDARY`` of the threshold may be kept by one side only).

Gate: fp32 within ``FP32_TOP1_POINTS`` top-1 points of ppdlx's evaluator (detection: AP and AP50
within ``FP32_AP``) and >= ``FP32_AGREEMENT`` agreement; other precisions may lose at most
``max_drop`` points (top-1, or AP x 100). A failure names one cause, tested in this order:

* labels: ``inference.yml`` labels are not the model's classes (missing, or another order);
* pre-processing: the deploy pre-processing of the files gives other network inputs than ppdlx's
  eval transform (the settings that differ are named), or ppdlx's evaluator's own loader does;
* numerics: same inputs, but the backend's outputs disagree with the trained model's;
* weights (detection): the trained model as exported disagrees with the evaluator on the same
  inputs (e.g. BatchNorm statistics the evaluator re-estimates and the export could not).

What differs by family (its metrics, its gate, the case's figures, its own cause) is a judge in ``JUDGES``, keyed
by the ``family`` an export's ``inference.yml`` records.
"""
from __future__ import annotations

from typing import List, Optional

import numpy as np

from ppdlx.evaluation.coco import coco_evaluate

FP32_TOP1_POINTS = 0.1
FP32_AP = 0.005
FP32_AGREEMENT = 0.995
INPUT_TOLERANCE = 1e-3  # normalised units: float rounding is ~1e-6, one grey level ~1.7e-2 at std 58
BOUNDARY = 0.01
MATCH_IOU = 0.5


# ------------------------------------------------------------------ scores
def classification_scores(names: List[list], vset) -> dict:
    truth = [vset.classes[t] for t in vset.truth]
    return {"top1": float(np.mean([n[0] == t for n, t in zip(names, truth)])),
            "top5": float(np.mean([t in n[:5] for n, t in zip(names, truth)]))}


def detection_scores(dets: List[tuple], vset, names: Optional[List[list]] = None) -> dict:
    """AP/AP50 (pycocotools) of per-image detections; with ``names`` the category comes from the
    reported name, else from the class index."""
    cat_of = dict(zip(vset.classes, vset.cat_ids))
    results = []
    for i, (boxes, scores, classes) in enumerate(dets):
        for j in range(len(scores)):
            cat = cat_of.get(names[i][j]) if names is not None else vset.cat_ids[int(classes[j])]
            x1, y1, x2, y2 = (float(v) for v in boxes[j])
            if cat is None or not np.isfinite([x1, y1, x2, y2, float(scores[j])]).all():
                continue
            results.append({"image_id": vset.image_ids[i], "category_id": int(cat),
                            "bbox": [x1, y1, x2 - x1, y2 - y1], "score": float(scores[j])})
    stats = coco_evaluate(vset.coco_gt, results, vset.image_ids)
    return {"AP": stats["AP"], "AP50": stats["AP50"]}


# ------------------------------------------------------------------ agreement
def top1_agreement(a, b) -> float:
    return float(np.mean([x == y for x, y in zip(a, b)])) if len(a) else 1.0


def _iou(box, boxes):
    ix = np.clip(np.minimum(box[2], boxes[:, 2]) - np.maximum(box[0], boxes[:, 0]), 0, None)
    iy = np.clip(np.minimum(box[3], boxes[:, 3]) - np.maximum(box[1], boxes[:, 1]), 0, None)
    inter = ix * iy
    area = lambda b: (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])  # noqa: E731
    return inter / np.maximum(area(box) + area(boxes) - inter, 1e-12)


def boxes_agree(a: tuple, b: tuple, threshold: float, max_detections: int) -> bool:
    """Do two images' kept boxes match one-to-one (same class key, IoU >= 0.5)? ``a``/``b`` are
    ``(boxes, scores, keys)``; unmatched boxes within ``BOUNDARY`` of ``threshold`` are excused. A
    full output (``max_detections`` boxes) was cut by score: boxes at the cut may tie with ones
    left out, so only boxes scoring above every full side's lowest score are compared. A box that
    clipping to the image left without area is not compared: its IoU with anything, its own twin
    included, is 0, and it can match no object in an evaluation either."""
    cut = max([float(np.min(d[1])) for d in (a, b) if len(d[1]) >= max_detections] or [-np.inf])

    def kept(d):
        boxes = np.asarray(d[0], dtype=np.float64).reshape(-1, 4)
        has_area = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
        return [i for i in range(len(d[1])) if d[1][i] >= threshold - BOUNDARY and d[1][i] > cut and has_area[i]]
    ka, kb = kept(a), kept(b)
    used = set()
    for i in sorted(ka, key=lambda i: -a[1][i]):
        candidates = [j for j in kb if j not in used and b[2][j] == a[2][i]]
        if candidates:
            ious = _iou(a[0][i], b[0][candidates])
            best = int(np.argmax(ious))
            if ious[best] >= MATCH_IOU:
                used.add(candidates[best])
                continue
        if a[1][i] >= threshold + BOUNDARY:
            return False
    return all(j in used or b[1][j] < threshold + BOUNDARY for j in kb)


def box_agreement(a: List[tuple], b: List[tuple], threshold: float, max_detections: int) -> float:
    return float(np.mean([boxes_agree(x, y, threshold, max_detections) for x, y in zip(a, b)])) if a else 1.0


def keyed(dets: List[tuple], keys: Optional[List[list]] = None, classes: Optional[List[str]] = None) -> List[tuple]:
    """Detections with the key boxes are matched by: the reported names, or class names by index."""
    if keys is not None:
        return [(d[0], d[1], list(k)) for d, k in zip(dets, keys)]
    return [(d[0], d[1], [classes[int(c)] if 0 <= int(c) < len(classes) else str(int(c)) for c in d[2]])
            for d in dets]


# ------------------------------------------------------------------ diagnosis
def label_problem(labels, classes: List[str]) -> Optional[str]:
    if not labels:
        return f"inference.yml has no labels (the model's classes are {_short(classes)})"
    labels = [str(x) for x in labels]
    if labels == list(classes):
        return None
    if sorted(labels) == sorted(classes):
        wrong = [i for i, (x, y) in enumerate(zip(labels, classes)) if x != y]
        i = wrong[0]
        return (f"inference.yml lists the model's classes in another order ({len(wrong)} of {len(classes)} positions "
                f"differ: class {i} is '{labels[i]}' there but '{classes[i]}' in training)")
    return f"inference.yml labels {_short(labels)} are not the model's classes {_short(classes)}"


def _short(values, n: int = 4) -> str:
    values = list(values)
    return "[" + ", ".join(f"'{v}'" for v in values[:n]) + (", ..." if len(values) > n else "") + "]"


def _same(a, b) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(float(a) - float(b)) <= 1e-6 * max(1.0, abs(float(b)))
    return a == b


def preprocess_differences(actual: dict, expected: dict) -> str:
    """The ``inference.yml`` preprocess settings that differ from ppdlx's eval transform, in words."""
    if {"mean", "std"} <= set(actual) & set(expected) and _same(actual["mean"], expected["std"]) \
            and _same(actual["std"], expected["mean"]) and not _same(expected["mean"], expected["std"]):
        return f"inference.yml has mean and std swapped (mean {actual['mean']}, std {actual['std']})"
    diffs = [f"{k} {actual.get(k)!r} (ppdlx: {expected.get(k)!r})" for k in sorted(set(actual) | set(expected))
             if not _same(actual.get(k, expected.get(k)), expected.get(k, actual.get(k)))]
    return "inference.yml preprocess differs from ppdlx's eval transform: " + ", ".join(diffs) if diffs else ""


def diagnose(case: dict, labels, vset, trained, expected_preprocess: dict, meta_preprocess: dict,
             evaluator: dict, reference_metric: Optional[float]) -> str:
    """One line: the cause of a failed case (``case`` holds its scores and agreements)."""
    problem = label_problem(labels, vset.classes)
    if problem:
        return (f"labels: {problem}; by class index the deployed predictions agree with the trained model on "
                f"{case['index_agreement']:.1%} of images")
    if trained.input_max_abs_diff > INPUT_TOLERANCE:
        detail = preprocess_differences(meta_preprocess, expected_preprocess) or \
            "same inference.yml settings, but the deploy package's pre-processing code computes other inputs"
        return (f"pre-processing: {detail}; the deploy inputs differ from ppdlx's by up to "
                f"{trained.input_max_abs_diff:.3g} (mean {trained.input_mean_abs_diff:.3g}) and the trained model on "
                f"them agrees with its own predictions on {case['preprocess_agreement']:.1%} of images")
    judge = JUDGES[vset.family]
    key = judge.primary
    # a quantized network (int8, or a float program judged at the int8 bar) is sensitive to input differences
    # far below INPUT_TOLERANCE, so its disagreement with the evaluator is numerics, not the export's weights
    if case["numerics_agreement"] < FP32_AGREEMENT or case.get("gate", case["precision"]) != "fp32":
        diff = f", max |output diff| {case['max_output_diff']:.3g}" if case.get("max_output_diff") is not None else ""
        return (f"numerics: on the same inputs {case['backend']} {case['precision']} agrees with the trained model on "
                f"{case['numerics_agreement']:.1%} of images{diff}; {key} {case[key]:.4f} vs {evaluator[key]:.4f} "
                f"(or the export holds other weights than model.weights: re-export)")
    cause = judge.own_cause(case)
    if cause:
        return cause
    if reference_metric is not None and abs(reference_metric - evaluator[key]) > 1e-9:
        return (f"pre-processing: ppdlx's evaluator (data.backend={vset.eval_cfg.data.backend}) scores {key} "
                f"{evaluator[key]:.4f} but the same model on ppdlx's PIL eval transform, which the deploy package "
                f"mirrors, scores {reference_metric:.4f}")
    return (f"numerics: {key} {case[key]:.4f} vs {evaluator[key]:.4f} although {case['agreement']:.1%} of images "
            f"agree")


def gate(case: dict, evaluator: dict, family: str, max_drop: float, input_max_abs_diff: float = 0.0) -> bool:
    """Whether a case passes. Inputs that differ from ppdlx's fail it whatever its metric did: a weak or
    colour-blind model can score the same on BGR or wrongly normalised inputs, a deployed one would not."""
    if input_max_abs_diff > INPUT_TOLERANCE:
        return False
    # a case may be judged at another precision's bar than it runs at (``gate``: a float program of a quantized
    # network, ppdlx.export.verify.verify_cases)
    return JUDGES[family].gate({**case, "precision": case.get("gate", case["precision"])}, evaluator, max_drop)


class ClassificationJudge:
    keys = ("top1", "top5")
    primary = "top1"

    def judge(self, case, preds, vset, trained, evaluator, meta: dict, reference) -> dict:
        """The case's scores and agreements (top-1 names and indices, numerics, pre-processing)."""
        ref_names = [vset.classes[c] for c in trained.reference.top[:, 0]]
        ours = trained.deploy_inputs.scores
        if meta["postprocess"].get("output", "logits") == "probabilities":  # the export ends in softmax
            ours = np.exp(ours - ours.max(-1, keepdims=True))
            ours = ours / ours.sum(-1, keepdims=True)
        scores = classification_scores(preds.names, vset)
        out = {**scores,
               "agreement": top1_agreement([n[0] for n in preds.names], ref_names),
               "index_agreement": top1_agreement(preds.top[:, 0], trained.reference.top[:, 0]),
               "numerics_agreement": top1_agreement(preds.top[:, 0], trained.deploy_inputs.top[:, 0]),
               "preprocess_agreement": top1_agreement(trained.deploy_inputs.top[:, 0], trained.reference.top[:, 0]),
               "max_output_diff": float(np.max(np.abs(preds.scores - ours)))}
        out["drop_points"] = (evaluator["top1"] - scores["top1"]) * 100
        return out

    def gate(self, case: dict, evaluator: dict, max_drop: float) -> bool:
        points = (evaluator["top1"] - case["top1"]) * 100
        if case["precision"] == "fp32":
            return abs(points) <= FP32_TOP1_POINTS + 1e-9 and case["agreement"] >= FP32_AGREEMENT
        return points <= max_drop + 1e-9

    def own_cause(self, case: dict) -> Optional[str]:
        return None


class DetectionJudge:
    keys = ("AP", "AP50")
    primary = "AP"

    def judge(self, case, preds, vset, trained, evaluator, meta: dict, reference) -> dict:
        """The case's AP and box agreements (names, indices, numerics, pre-processing) at the display threshold."""
        postprocess = meta["postprocess"]
        threshold = float(postprocess.get("score_threshold", 0.4))
        full = int(postprocess.get("max_detections", 100))
        scores = detection_scores(preds.dets, vset, preds.names)
        ref_named = keyed(reference.dets, classes=vset.classes)
        deploy_by_index = keyed(preds.dets, classes=vset.classes)
        ours_on_deploy_inputs = keyed(trained.deploy_inputs.dets, classes=vset.classes)
        return {**scores,
                "agreement": box_agreement(keyed(preds.dets, keys=preds.names), ref_named, threshold, full),
                "index_agreement": box_agreement(deploy_by_index, ref_named, threshold, full),
                "numerics_agreement": box_agreement(deploy_by_index, ours_on_deploy_inputs, threshold, full),
                "preprocess_agreement": box_agreement(ours_on_deploy_inputs, ref_named, threshold, full),
                "kept_boxes": int(sum(int(np.sum(d[1] >= threshold)) for d in reference.dets)),
                "drop_points": (evaluator["AP"] - scores["AP"]) * 100}

    def gate(self, case: dict, evaluator: dict, max_drop: float) -> bool:
        if case["precision"] == "fp32":
            return (abs(evaluator["AP"] - case["AP"]) <= FP32_AP and abs(evaluator["AP50"] - case["AP50"]) <= FP32_AP
                    and case["agreement"] >= FP32_AGREEMENT)
        return (evaluator["AP"] - case["AP"]) * 100 <= max_drop + 1e-9

    def own_cause(self, case: dict) -> Optional[str]:
        if case["preprocess_agreement"] >= FP32_AGREEMENT:
            return None
        return (f"weights: on the same inputs the trained model as exported agrees with ppdlx's evaluator on "
                f"{case['preprocess_agreement']:.1%} of images: the evaluator scores other weights or BatchNorm "
                f"statistics (detection.precise_bn_batches re-estimates them from training images, which the export "
                f"must be able to read)")


JUDGES = {"classification": ClassificationJudge(), "detection": DetectionJudge()}
