"""The images ``--verify`` runs, and the config that points ppdlx's own evaluator at exactly them.

``source`` is ``val`` (the config's val split) or a dataset root laid out like ``data.root``
(classification: ``PATH/<data.val_split>/<class>/*.jpg``; detection: ``PATH/<data.coco.val_json>``
and ``PATH/<data.coco.val_images>``). ``max_images`` takes that many images evenly spaced over
the split (every class keeps its share); the evaluator then sees a copy of the split holding only
them: symlinks in class folders (classification) or a COCO json of the chosen images.

Detection is evaluated with the post-processing the export runs (hard NMS with the exported
settings) instead of the recipe's soft-NMS (numpy, not exportable): the one deliberate difference
from ``tools/eval.py``. BatchNorm statistics are re-estimated as configured
(``detection.precise_bn_batches``) on both sides: the export applies the same re-estimation.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, List, Optional

import numpy as np

from ppdlx.data.coco_index import coco_from_dict, coco_paths, shared_index
from ppdlx.data.image_folder import scan_image_folder
from ppdlx.errors import ConfigError


@dataclass
class VerifySet:
    family: str
    source: str                 # for the report: the split directory or annotation file
    paths: List[str]            # image files, in the order every run sees them
    classes: List[str]          # the model's class names (index = class id)
    eval_cfg: Any               # the config that makes ppdlx's evaluator score exactly these images
    truth: List[int] = field(default_factory=list)      # classification: class index per image
    image_ids: List[int] = field(default_factory=list)  # detection: COCO image id per image
    cat_ids: List[int] = field(default_factory=list)    # detection: category id per class index
    coco_gt: Any = None                                 # detection: pycocotools COCO of these images
    results_file: Optional[str] = None                  # detection: the evaluator's COCO results

    def __len__(self):
        return len(self.paths)


def evenly_spaced(total: int, limit: Optional[int]) -> List[int]:
    if not limit or limit >= total:
        return list(range(total))
    return sorted({int(round(i)) for i in np.linspace(0, total - 1, limit)})


def _root(cfg, source: str) -> str:
    if source in (None, "", "val"):
        return cfg.data.root
    if not os.path.isdir(source):
        raise ConfigError(f"--verify {source}: not a directory (give 'val' or a dataset root laid out like data.root)")
    return source


def classification_set(cfg, source: str, max_images: Optional[int], workdir: str, postprocess: dict) -> VerifySet:
    """``postprocess``: the export's ``inference.yml`` postprocess section (the verdict reads it, not the set)."""
    root = _root(cfg, source)
    split_dir = os.path.join(root, cfg.data.val_split)
    found, samples = scan_image_folder(split_dir)
    train_dir = os.path.join(cfg.data.root, cfg.data.train_split)
    classes = sorted(d.name for d in os.scandir(train_dir) if d.is_dir()) if os.path.isdir(train_dir) else found
    if set(found) - set(classes):
        raise ConfigError(f"--verify: {split_dir} has class folders {sorted(set(found) - set(classes))[:5]} that the "
                          f"training split {train_dir} does not have")
    chosen = evenly_spaced(len(samples), max_images)
    names = [found[samples[i][1]] for i in chosen]
    paths = [os.path.abspath(samples[i][0]) for i in chosen]
    eval_root = root
    if len(chosen) < len(samples) or found != classes:
        eval_root = os.path.join(workdir, "data")
        for name in classes:
            os.makedirs(os.path.join(eval_root, "val", name), exist_ok=True)
        for n, (path, name) in enumerate(zip(paths, names)):
            os.symlink(path, os.path.join(eval_root, "val", name, f"{n:06d}_{os.path.basename(path)}"))
    eval_cfg = cfg.replace({"data.root": os.path.abspath(eval_root),
                            "data.val_split": "val" if eval_root != root else cfg.data.val_split,
                            "global.output_dir": os.path.join(workdir, "eval")})
    return VerifySet("classification", split_dir, paths, classes, eval_cfg, truth=[classes.index(n) for n in names])


def detection_set(cfg, source: str, max_images: Optional[int], workdir: str, postprocess: dict) -> VerifySet:
    """``postprocess``: the export's ``inference.yml`` postprocess section (its NMS settings)."""
    root = _root(cfg, source)
    json_path, image_dir = coco_paths(cfg.replace({"data.root": root}), "val")
    index = shared_index(json_path, image_dir, cfg.data.coco.invalid)
    chosen = [index.records[i] for i in evenly_spaced(len(index.records), max_images)]
    ids = {r["id"] for r in chosen}
    gt = index.gt_dataset
    subset = {"info": gt.get("info", {}), "categories": gt["categories"],
              "images": [img for img in gt["images"] if img["id"] in ids],
              "annotations": [a for a in gt["annotations"] if a["image_id"] in ids]}
    os.makedirs(workdir, exist_ok=True)
    subset_json = os.path.join(workdir, "instances_verify.json")
    with open(subset_json, "w", encoding="utf-8") as f:
        json.dump(subset, f)
    out_dir = os.path.join(workdir, "eval")
    d = postprocess
    eval_cfg = cfg.replace({
        "data.root": os.path.abspath(root), "data.coco.val_json": os.path.abspath(subset_json),
        "data.coco.val_images": os.path.abspath(image_dir), "global.output_dir": out_dir,
        "detection.nms": "hard", "detection.save_results": True,
        "detection.pre_nms_top_k": int(d.get("pre_nms_top_k", cfg.detection.pre_nms_top_k)),
        "detection.max_detections": int(d.get("max_detections", cfg.detection.max_detections)),
        "detection.iou_threshold": float(d.get("nms_iou_threshold", cfg.detection.iou_threshold)),
        "detection.score_threshold": float(d.get("nms_score_threshold", cfg.detection.score_threshold))})
    return VerifySet("detection", json_path, [os.path.abspath(r["path"]) for r in chosen], list(index.class_names),
                     eval_cfg, image_ids=[r["id"] for r in chosen], cat_ids=list(index.cat_ids),
                     coco_gt=coco_from_dict(subset), results_file=os.path.join(out_dir, "detections_val.json"))


# the set builder of each family an export's inference.yml records
SETS = {"classification": classification_set, "detection": detection_set}


def build_verify_set(cfg, family: str, source: str, max_images: Optional[int], workdir: str,
                     postprocess: dict) -> VerifySet:
    return SETS[family](cfg, source, max_images, workdir, postprocess)
