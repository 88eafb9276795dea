"""``check_data(cfg) -> DataReport``: what the configured train/val data hold, and whether they can train.

``DataReport.problems`` are the reasons training cannot run on the data (it would stop, or learn nothing of a
class): a split that is missing or has no images, a training class without images, train/val classes that
differ, ``model.num_classes`` that disagrees with the data, files the configured loader stops on, a split of
which no image decodes, a val class folder without images. ``warnings`` are what training survives but a person
should know: unreadable files the loader skips, val images identical to training images, a val category without
boxes, invalid annotations left out, image sizes that differ from the json.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Callable

from ppdlx.analysis.coco_scan import scan_coco_split
from ppdlx.analysis.data_figures import write_data_samples
from ppdlx.analysis.data_scan import SplitReport, cross_split_duplicates, scan_image_folder_split
from ppdlx.analysis.data_text import as_dict, markdown, split_line, summary_text
from ppdlx.analysis.tables import write_text
from ppdlx.data.coco import coco_paths
from ppdlx.data.image_folder import describe_classes_without_images, quoted
from ppdlx.errors import DataError

log = logging.getLogger("ppdlx.analysis")


def _count(n: int, noun: str, plural: str = "") -> str:
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


@dataclass
class DataReport:
    task: str                                     # the task the data train ("classification" | "detection")
    splits: dict                                  # "train" / "val" -> SplitReport
    boxes: bool = False                           # annotated with boxes in categories, not by class folders
    duplicates: list = field(default_factory=list)  # (val path, identical train path)
    problems: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    config: str = ""
    hashed: bool = True

    @property
    def ok(self) -> bool:
        return not self.problems

    def raise_if_unusable(self) -> None:
        """``DataError`` with every problem on one line, if there is any."""
        if self.problems:
            raise DataError("; ".join(self.problems))

    def table(self) -> str:
        return summary_text(self)

    def to_markdown(self, samples_png: str | None = None) -> str:
        return markdown(self, samples_png)

    def to_dict(self) -> dict:
        return as_dict(self)

    def write(self, out_dir: str, samples: int = 8, figures: bool = True) -> dict:
        """``data_report.md`` and (with matplotlib) ``data_samples.png`` in ``out_dir``; returns their paths."""
        os.makedirs(out_dir, exist_ok=True)
        written = {}
        if figures:
            written["data_samples.png"] = write_data_samples(self, os.path.join(out_dir, "data_samples.png"),
                                                             samples)
        written["data_report.md"] = write_text(
            os.path.join(out_dir, "data_report.md"),
            self.to_markdown("data_samples.png" if "data_samples.png" in written else None))
        return written


def check_data(cfg, decode: bool = True, hash_files: bool = True, config_path: str = "") -> DataReport:
    """Scan ``cfg.data``'s train and val splits. ``decode=False, hash_files=False`` only walks directories and
    reads annotations (seconds even for ImageNet): what a start-of-training check can afford."""
    kind = _DATASET_KINDS[cfg.data.dataset]
    splits = {split: kind.scan(cfg, split, decode, hash_files) for split in ("train", "val")}
    report = DataReport(kind.task, splits, kind.boxes, config=config_path, hashed=hash_files)
    report.duplicates = cross_split_duplicates(splits["train"], splits["val"])
    _judge(report, cfg)
    return report


def check_before_training(cfg) -> DataReport:
    """The start-of-training check: a directory walk and the annotations, no decoding or hashing. Logs one line
    per split and each warning; ``DataError`` (one line) when the data cannot train. Call it on every rank:
    a rank that stopped alone would leave the others waiting."""
    report = check_data(cfg, decode=False, hash_files=False)
    for split in report.splits.values():
        log.info("data: %s", split_line(report, split))
    for warning in report.warnings:
        log.warning("data: %s", warning)
    report.raise_if_unusable()
    return report


def _stops_on_unreadable(cfg) -> bool:
    """Whether the configured loader stops (instead of skipping) at a file it cannot decode."""
    return cfg.data.backend == "dali" and cfg.data.dali.corrupt_files == "error"


def _scan_coco(cfg, split: str, decode: bool, hash_files: bool) -> SplitReport:
    json_path, image_dir = coco_paths(cfg, split)
    return scan_coco_split(json_path, image_dir, split, cfg.data.backend, decode, hash_files)


def _scan_image_folder(cfg, split: str, decode: bool, hash_files: bool) -> SplitReport:
    folder = cfg.data.train_split if split == "train" else cfg.data.val_split
    return scan_image_folder_split(cfg.data.root, folder, split, cfg.data.backend, decode, hash_files)


@dataclass(frozen=True)
class _DatasetKind:
    """What the report reads and says for one dataset format."""
    task: str                 # the task the data train (DataReport.task)
    scan: Callable            # (cfg, split, decode, hash_files) -> SplitReport
    boxes: bool               # annotated with boxes in categories (COCO), not images in class folders
    empty_fix: Callable       # n -> what to do about n classes without images (categories without boxes)


# What to do about classes without images (categories without boxes) in a split: labels are positions in the
# sorted folder names (category ids), so a class can only go from every split at once.
def _folder_fix(n: int) -> str:
    return (f"add images to {'that folder' if n == 1 else 'those folders'} or remove {'it' if n == 1 else 'them'} "
            f"from every split (class indices follow the sorted folder names)")


def _category_fix(n: int) -> str:
    return (f"add boxes of {'it' if n == 1 else 'them'} to the json or remove {'it' if n == 1 else 'them'} from "
            f"'categories' in every split's json (class indices follow the sorted category ids)")


# By data.dataset (the DATASETS names): the report reads files, so it asks the dataset's format (the task
# plug-ins, above this package, are not asked).
_DATASET_KINDS = {"coco": _DatasetKind("detection", _scan_coco, True, _category_fix),
                  "image_folder": _DatasetKind("classification", _scan_image_folder, False, _folder_fix)}


def _no_boxes(split: SplitReport) -> str:
    """A training json of which no box is usable: a detector has nothing to learn (not one class of many)."""
    left_out = f", {_count(len(split.invalid), 'invalid annotation/image', 'invalid annotations/images')} left " \
               f"out (first: {split.invalid[0][3]})" if split.invalid else ""
    return (f"{split.source}: no box to train on ({_count(split.images, 'usable image')}, 0 valid annotations"
            f"{left_out}); a detector needs boxes: add annotations to the json"
            + (" or fix the invalid ones" if split.invalid else ""))


def _judge(report: DataReport, cfg) -> None:
    train, val = report.splits["train"], report.splits["val"]
    kind, plural = ("category", "categories") if report.boxes else ("class", "classes")
    has = "boxes" if report.boxes else "images"
    for split in (train, val):
        if split.error:
            report.problems.append(split.error)
            continue
        empty = [c for c, n in zip(split.classes, split.class_counts) if n == 0]
        detection = report.boxes
        if detection and split is train and split.classes and not any(split.class_counts):
            report.problems.append(_no_boxes(split))
        elif empty:
            # Training would learn nothing of such a class. A val class folder without images is a stop too: its
            # accuracy would leave the class out unnoticed (often the folder holds files of another extension).
            # COCO evaluation already scores a category without val boxes as absent (-1), so that one warns.
            names = quoted(empty) if detection else describe_classes_without_images(split.source, empty)
            line = f"{split.source}: {_count(len(empty), kind, plural)} without {has} ({names})"
            if detection and split is val:
                report.warnings.append(line)
            else:
                report.problems.append(f"{line}; {_DATASET_KINDS[cfg.data.dataset].empty_fix(len(empty))}")
        _judge_files(report, split, cfg)
    if train.classes and val.classes and not train.error and not val.error:
        if report.boxes and train.cat_ids != val.cat_ids:
            report.problems.append(f"category ids differ between {train.source} {train.cat_ids[:10]} and "
                                   f"{val.source} {val.cat_ids[:10]}; both splits must list the same categories")
        elif train.classes != val.classes:
            only_train = [c for c in train.classes if c not in val.classes]
            only_val = [c for c in val.classes if c not in train.classes]
            report.problems.append(f"{kind} names differ between {train.source} and {val.source}: only in train "
                                   f"[{quoted(only_train)}], only in val [{quoted(only_val)}]")
    if train.classes and not train.error and cfg.model.num_classes != len(train.classes):
        report.problems.append(f"model.num_classes={cfg.model.num_classes} but {train.source} has "
                               f"{len(train.classes)} {plural}; set model.num_classes={len(train.classes)}")
    if report.duplicates:
        val_path, train_path = report.duplicates[0]
        report.warnings.append(f"{_count(len(report.duplicates), 'val image')} byte-identical to a training image "
                               f"(first: {val_path} = {train_path}); val scores overstate generalisation")
    if cfg.data.backend == "synthetic" and report.problems:
        # synthetic batches read no files: what is wrong with data.root cannot stop training
        report.warnings += [f"(data.backend=synthetic, not used) {p}" for p in report.problems]
        report.problems = []


def _judge_files(report: DataReport, split: SplitReport, cfg) -> None:
    if split.images and split.decoder and len(split.unreadable) == split.images:
        report.problems.append(f"{split.source}: none of the {split.images} images can be decoded "
                               f"({split.decoder}; first: {split.unreadable[0][0]})")
    elif split.unreadable:
        files = _count(len(split.unreadable), "file")
        first = f"first: {split.unreadable[0][0]}: {split.unreadable[0][1]}"
        if _stops_on_unreadable(cfg):
            report.problems.append(f"{split.source}: {files} cannot be decoded and the data.backend=dali loader "
                                   f"stops on them ({first}); delete or replace them")
        else:
            report.warnings.append(f"{split.source}: {files} cannot be decoded; the loader skips them ({first})")
    if split.invalid:
        ann_id, image_id, _, reason = split.invalid[0]
        entries = _count(len(split.invalid), "invalid annotation/image", "invalid annotations/images")
        first = f"annotation id {ann_id}, image id {image_id}" if ann_id is not None else f"image id {image_id}"
        msg = f"{split.source}: {entries} (first: {first}: {reason})"
        if cfg.data.coco.invalid == "error":
            report.problems.append(msg + "; data.coco.invalid=error stops on them: fix them in the json, or set "
                                         "data.coco.invalid=skip to train without them")
        else:
            report.warnings.append(msg + "; left out (data.coco.invalid=skip)")
    if split.sized_from_file:  # the index said so while the check muted its lines: said here, once
        report.warnings.append(f"{split.source}: {_count(split.sized_from_file, 'image')} without a width/height in "
                               f"the json: their sizes were read from the image files")
    if split.size_mismatch:
        path, expected, decoded = split.size_mismatch[0]
        report.warnings.append(f"{split.source}: {_count(len(split.size_mismatch), 'image')} of another size than "
                               f"the json says (first: {path}: json {expected[0]}x{expected[1]}, file "
                               f"{decoded[0]}x{decoded[1]}); their boxes are likely wrong")
