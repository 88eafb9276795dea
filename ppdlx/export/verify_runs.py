"""What ``--verify`` runs over a :class:`ppdlx.export.verify_data.VerifySet`, each giving per-image
predictions:

* ppdlx's evaluator (``ppdlx.engine.run.evaluate``, what ``tools/eval.py`` runs) on the set: the
  reference metrics, and for detection its per-image detections (the COCO results it writes);
* the trained model on ppdlx's own eval transform (``reference``) and on the deploy package's
  pre-processing of the same files (``deploy_inputs``): same numerics, two pre-processings;
* the export through the deploy package's ``Pipeline`` per backend (raw files in, ``inference.yml``
  read as a service reads it), with the label names it reports.

Classification predictions are ``top [N, k]`` class indices (+ ``names`` for the deploy runs) and
``scores [N, C]``; detection predictions are per image ``(boxes [D, 4] xyxy original pixels,
scores [D], classes [D])`` (+ ``names``). What differs by family is a runner in ``RUNS``, keyed by the
``family`` an export's ``inference.yml`` records.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import paddle
from ppdlx_deploy import Pipeline, Preprocessor, clip_to_images, postprocess

from ppdlx.data.coco import build_coco_dataset
from ppdlx.data.image_file import open_rgb
from ppdlx.data.transforms import EvalTransform
from ppdlx.engine.run import evaluate
from ppdlx.export.paddle_export import DetectorForExport
from ppdlx.models.detection.det_postprocess import EfficientDetPostProcess

TOPK = 5


@dataclass
class Predictions:
    top: Optional[np.ndarray] = None                  # classification: [N, k] class indices
    scores: Optional[np.ndarray] = None               # classification: [N, C] logits/probabilities
    dets: List[tuple] = field(default_factory=list)   # detection: per image (boxes, scores, classes)
    names: List[list] = field(default_factory=list)   # deploy runs: top-k names / per-box names


@dataclass
class TrainedRuns:
    reference: Predictions        # trained model, ppdlx's eval transform (classification only)
    deploy_inputs: Predictions    # trained model, deploy pre-processing of the same files
    input_max_abs_diff: float     # deploy inputs vs ppdlx's, normalised units
    input_mean_abs_diff: float


def evaluator_metrics(vset) -> dict:
    return evaluate(vset.eval_cfg)


def evaluator_detections(vset) -> Predictions:
    """The evaluator's own per-image detections, read back from the COCO results it wrote."""
    with open(vset.results_file, encoding="utf-8") as f:
        results = json.load(f)
    class_of = {cid: i for i, cid in enumerate(vset.cat_ids)}
    per_image = {i: [] for i in vset.image_ids}
    for r in results:
        x, y, w, h = r["bbox"]
        per_image.setdefault(r["image_id"], []).append(([x, y, x + w, y + h], r["score"], class_of[r["category_id"]]))
    return Predictions(dets=[_as_arrays(per_image[i]) for i in vset.image_ids])


def _as_arrays(rows) -> tuple:
    return (np.asarray([r[0] for r in rows], np.float32).reshape(-1, 4), np.asarray([r[1] for r in rows], np.float32),
            np.asarray([r[2] for r in rows], np.int64))


def _batches(n: int, size: int):
    for start in range(0, n, size):
        yield list(range(start, min(n, start + size)))


def _accumulate(ours, theirs, max_diff, diff_sum, pixels):
    if ours.shape != theirs.shape:
        return float("inf"), float("inf"), 1
    diff = np.abs(ours.astype(np.float64) - theirs)
    return max(max_diff, float(diff.max())), diff_sum + float(diff.sum()), pixels + diff.size


def _topk(scores: np.ndarray) -> Predictions:
    k = min(TOPK, scores.shape[-1])
    return Predictions(top=np.argsort(-scores, axis=-1, kind="stable")[:, :k], scores=scores)


def split_detections(outputs) -> List[tuple]:
    """``[boxes, scores, classes, count]`` of a batch -> per image ``(boxes, scores, classes)``."""
    boxes, scores, classes, count = outputs
    return [(boxes[i, :int(count[i])].astype(np.float32), scores[i, :int(count[i])].astype(np.float32),
             classes[i, :int(count[i])].astype(np.int64)) for i in range(len(count))]


def deploy_run(model_dir: str, backend: str, precision: str, vset, threads: int, batch_size: int = 8):
    """The export through the deploy package's Pipeline; returns ``(predictions, plan)``."""
    pipeline = Pipeline.open(model_dir, backend, precision, threads=threads, batch_size=batch_size)
    runs = RUNS[vset.family]
    preds, scores = Predictions(), []
    for _, _, outputs in pipeline.batches(vset.paths, batch_size):
        runs.add_deployed(preds, scores, outputs, postprocess(pipeline.meta, outputs, topk=TOPK, score_threshold=0.0))
    runs.finish_deployed(preds, scores)
    return preds, pipeline.predictor.plan


class ClassificationRuns:
    def reference(self, vset):
        """The evaluator's own per-image predictions (classification: none beyond its metrics)."""
        return None

    @paddle.no_grad()
    def trained(self, model, vset, cfg, meta: dict, batch_size: int = 16) -> TrainedRuns:
        """The trained model on ppdlx's eval transform and on the deploy pre-processing of every file."""
        model.eval()
        prep = Preprocessor(meta)
        max_diff, diff_sum, pixels = 0.0, 0.0, 0
        transform = EvalTransform(cfg.data.transforms, getattr(model, "data_format", cfg.model.data_format))
        ref_scores, dep_scores = [], []
        for idx in _batches(len(vset), batch_size):
            ours = []
            for i in idx:
                ours.append(transform(open_rgb(vset.paths[i])))  # the training loader's decode
            ours = np.stack(ours)
            theirs = prep.feeds_from_files([vset.paths[i] for i in idx])[prep.input_name]
            max_diff, diff_sum, pixels = _accumulate(ours, theirs, max_diff, diff_sum, pixels)
            ref_scores.append(model(paddle.to_tensor(ours)).astype("float32").numpy())
            dep_scores.append(model(paddle.to_tensor(theirs)).astype("float32").numpy())
        ref, dep = np.concatenate(ref_scores), np.concatenate(dep_scores)
        return TrainedRuns(_topk(ref), _topk(dep), max_diff, diff_sum / max(pixels, 1))

    def reference_metric(self, trained: TrainedRuns, vset) -> Optional[float]:
        """Top-1 of the trained model on ppdlx's PIL eval transform (what the deploy package mirrors)."""
        return float(np.mean(trained.reference.top[:, 0] == np.asarray(vset.truth)))

    def add_deployed(self, preds: Predictions, scores: list, outputs, results) -> None:
        scores.append(np.asarray(outputs[0], np.float32))
        preds.names += [[label for _, label, _ in res] for res in results]

    def finish_deployed(self, preds: Predictions, scores: list) -> None:
        ranked = _topk(np.concatenate(scores))
        preds.top, preds.scores = ranked.top, ranked.scores


class DetectionRuns:
    def reference(self, vset) -> Predictions:
        return evaluator_detections(vset)

    @paddle.no_grad()
    def trained(self, model, vset, cfg, meta: dict, batch_size: int = 16) -> TrainedRuns:
        """The trained model (with the export's post-processing) on the deploy pre-processing of every file,
        whose inputs are compared with ppdlx's COCO eval transform."""
        model.eval()
        prep = Preprocessor(meta)
        max_diff, diff_sum, pixels = 0.0, 0.0, 0
        dataset = build_coco_dataset(vset.eval_cfg, "val")
        index_of = {r["id"]: n for n, r in enumerate(dataset.records)}
        pp = meta["postprocess"]
        detector = DetectorForExport(model, EfficientDetPostProcess.from_model(
            model, pre_nms_top_k=int(pp.get("pre_nms_top_k", 5000)), max_detections=int(pp.get("max_detections", 100)),
            iou_threshold=float(pp.get("nms_iou_threshold", 0.5)),
            score_threshold=float(pp.get("nms_score_threshold", 0.001))))
        dets = []
        for idx in _batches(len(vset), batch_size):
            ours = np.stack([dataset[index_of[vset.image_ids[i]]][0] for i in idx])
            feeds = prep.feeds_from_files([vset.paths[i] for i in idx])
            max_diff, diff_sum, pixels = _accumulate(ours, feeds[prep.input_name], max_diff, diff_sum, pixels)
            outputs = [o.numpy() for o in detector(*[paddle.to_tensor(feeds[i["name"]]) for i in meta["inputs"]])]
            records = [dataset.records[index_of[vset.image_ids[i]]] for i in idx]
            sizes = [(r["width"], r["height"]) for r in records]
            dets += split_detections(clip_to_images(meta, outputs, sizes))  # as the deploy pipeline clips
        return TrainedRuns(Predictions(), Predictions(dets=dets), max_diff, diff_sum / max(pixels, 1))

    def reference_metric(self, trained: TrainedRuns, vset) -> Optional[float]:
        return None

    def add_deployed(self, preds: Predictions, scores: list, outputs, results) -> None:
        preds.dets += split_detections(outputs)
        preds.names += [[label for _, _, _, label in res] for res in results]

    def finish_deployed(self, preds: Predictions, scores: list) -> None:
        pass


RUNS = {"classification": ClassificationRuns(), "detection": DetectionRuns()}
