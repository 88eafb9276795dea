"""The words of a ``DataReport``: the terminal table, ``data_report.md`` and a JSON-able dict."""
from __future__ import annotations

from collections import Counter

import numpy as np

from ppdlx.analysis.coco_scan import boxes_per_image_summary
from ppdlx.analysis.data_scan import within_split_duplicates
from ppdlx.analysis.tables import markdown_table, text_table

LISTED = 50  # files listed by name in data_report.md per section


def size_summary(split) -> dict:
    sizes = list(split.sizes.values())
    if not sizes:
        return {}
    w = np.asarray([s[0] for s in sizes])
    h = np.asarray([s[1] for s in sizes])
    common = Counter(tuple(s) for s in sizes).most_common(3)
    return {"width": [int(w.min()), float(np.median(w)), int(w.max())],
            "height": [int(h.min()), float(np.median(h)), int(h.max())],
            "most_common": [{"size": f"{s[0]}x{s[1]}", "images": n} for s, n in common]}


def _size_cell(split) -> str:
    s = size_summary(split)
    if not s:
        return "-"
    (w0, _, w1), (h0, _, h1) = s["width"], s["height"]
    top = s["most_common"][0]
    span = f"{w0}x{h0}" if (w0, h0) == (w1, h1) else f"{w0}..{w1} x {h0}..{h1}"
    return f"{span} (most {top['size']}: {top['images']})"


def _count_cell(counts) -> str:
    return f"{min(counts)}/{int(np.median(counts))}/{max(counts)}" if counts else "-"


def summary_rows(report):
    rows, width = [], len(summary_headers(report))
    for split in report.splits.values():
        if split.error:  # the reason is in report.problems
            rows.append([split.name, split.images] + ["-"] * (width - 2))
            continue
        unreadable = len(split.unreadable) if split.decoder else "not decoded"
        if report.boxes:
            b = boxes_per_image_summary(split)
            rows.append([split.name, split.images, split.boxes, f"{b['mean']:.2f}/{b['max']}", b["without_boxes"],
                         len(split.classes), _count_cell(split.class_counts), split.imbalance,
                         split.areas["small"], split.areas["medium"], split.areas["large"], split.crowd,
                         split.touching, split.leaving, len(split.invalid), unreadable, _size_cell(split)])
        else:
            rows.append([split.name, split.images, len(split.classes), _count_cell(split.class_counts),
                         split.imbalance, unreadable, within_split_duplicates(split) if report.hashed else "-",
                         _size_cell(split)])
    return rows


def summary_headers(report):
    if report.boxes:
        return ["split", "images", "boxes", "boxes/image mean/max", "no boxes", "categories",
                "boxes/category min/med/max", "imbalance", "small", "medium", "large", "crowd", "touching border",
                "leaving image", "invalid (left out)", "unreadable", "image size"]
    return ["split", "images", "classes", "images/class min/med/max", "imbalance", "unreadable",
            "repeated files", "image size"]


def class_rows(report):
    train, val = report.splits["train"], report.splits["val"]
    names = train.classes or val.classes
    train_n = dict(zip(train.classes, train.class_counts))
    val_n = dict(zip(val.classes, val.class_counts))
    names = names + [c for c in val.classes if c not in names]
    total = max(sum(train.class_counts), 1)
    rows = []
    for i, name in enumerate(names):
        row = [name, train_n.get(name, "-"), val_n.get(name, "-"),
               f"{100.0 * train_n.get(name, 0) / total:.1f}%"]
        if report.boxes:
            imgs = dict(zip(train.classes, train.category_images))
            row.insert(2, imgs.get(name, "-"))
        rows.append(row)
    return rows


def class_headers(report):
    if report.boxes:
        return ["category", "train boxes", "train images", "val boxes", "train share"]
    return ["class", "train images", "val images", "train share"]


def split_line(report, split) -> str:
    """One split in one line, e.g. ``train 1438 images, 10 classes (139..146 each, imbalance 1.05)``."""
    if split.error:
        return f"{split.name}: {split.error}"
    counts = split.class_counts
    spread = f"{min(counts)}..{max(counts)}" if counts else "-"
    imbalance = "" if split.imbalance is None else f", imbalance {split.imbalance:.2f}"
    if report.boxes:
        return (f"{split.name} {split.images} images, {split.boxes} boxes, {len(split.classes)} categories "
                f"({spread} boxes each{imbalance}) in {split.source}")
    return (f"{split.name} {split.images} images, {len(split.classes)} classes ({spread} each{imbalance}) in "
            f"{split.source}")


def verdict(report) -> str:
    if report.problems:
        return "CANNOT TRAIN: " + "; ".join(report.problems)
    return "ok: the data can train" + (f" ({len(report.warnings)} warnings)" if report.warnings else "")


def summary_text(report, max_classes: int = 30) -> str:
    blocks = [text_table(summary_headers(report), summary_rows(report))]
    rows = class_rows(report)
    if rows:
        more = f"\n... {len(rows) - max_classes} more in data_report.md" if len(rows) > max_classes else ""
        blocks.append(text_table(class_headers(report), rows[:max_classes]) + more)
    tail = [f"duplicates across train/val (same bytes): {len(report.duplicates)}" if report.hashed else
            "duplicates across train/val: not checked"]
    tail += [f"warning: {w}" for w in report.warnings] + [verdict(report)]
    return "\n\n".join(blocks) + "\n\n" + "\n".join(tail)


def _listing(title, items) -> list:
    if not items:
        return []
    lines = [f"### {title} ({len(items)})", ""]
    lines += [f"- {' - '.join(str(p) for p in item)}" if isinstance(item, tuple) else f"- {item}"
              for item in items[:LISTED]]
    if len(items) > LISTED:
        lines.append(f"- ... {len(items) - LISTED} more")
    return lines + [""]


def markdown(report, samples_png=None) -> str:
    lines = [f"# Data report ({report.task})", ""]
    if report.config:
        lines += [f"Config: `{report.config}`", ""]
    lines += [f"**{verdict(report)}**", ""]
    for split in report.splits.values():
        how = f"decoded with {split.decoder}" if split.decoder else "not decoded (sizes from headers/json)"
        lines.append(f"- {split.name}: `{split.source}` ({how})")
    lines += ["", "## Splits", "", markdown_table(summary_headers(report), summary_rows(report)), ""]
    if report.boxes:
        lines += ["Boxes per COCO area range (pycocotools' limits 32² and 96² px²; a box exactly on a limit counts "
                  "in the larger range). 'touching border': an edge on the image border; 'leaving image': reaching "
                  "past it (the loader clips up to 1 px, beyond that the annotation is invalid and left out).", ""]
    lines += ["## Categories" if report.boxes else "## Classes", "",
              markdown_table(class_headers(report), class_rows(report)), ""]
    lines += ["## Image sizes", ""]
    for split in report.splits.values():
        s = size_summary(split)
        if s:
            common = ", ".join(f"{c['size']} ({c['images']})" for c in s["most_common"])
            lines.append(f"- {split.name}: width min/median/max {s['width'][0]}/{s['width'][1]:g}/{s['width'][2]}, "
                         f"height {s['height'][0]}/{s['height'][1]:g}/{s['height'][2]}; most common: {common}")
    lines.append("")
    if report.problems:
        lines += ["## Problems (training cannot run)", ""] + [f"- {p}" for p in report.problems] + [""]
    if report.warnings:
        lines += ["## Warnings", ""] + [f"- {w}" for w in report.warnings] + [""]
    for split in report.splits.values():
        lines += _listing(f"Unreadable files in {split.name}", split.unreadable)
        lines += _listing(f"Invalid annotations in {split.name} (annotation id, image id, file, reason)",
                          split.invalid)
        lines += _listing(f"Images whose size differs from the json in {split.name}", split.size_mismatch)
    lines += _listing("Val files identical to training files (val, train)", report.duplicates)
    if samples_png:
        lines += ["## Samples", "", f"![training samples]({samples_png})", ""]
    return "\n".join(lines)


def as_dict(report) -> dict:
    splits = {}
    for name, split in report.splits.items():
        entry = {"source": split.source, "error": split.error, "images": split.images,
                 "classes": dict(zip(split.classes, split.class_counts)),
                 "imbalance": None if split.imbalance in (None, float("inf")) else split.imbalance,
                 "unreadable": [list(u) for u in split.unreadable], "decoder": split.decoder,
                 "sizes": size_summary(split)}
        if report.boxes:
            entry.update(boxes=split.boxes, boxes_per_image=boxes_per_image_summary(split), areas=split.areas,
                         crowd=split.crowd, touching=split.touching, leaving=split.leaving,
                         category_images=dict(zip(split.classes, split.category_images)),
                         invalid=[list(i) for i in split.invalid])
        splits[name] = entry
    return {"task": report.task, "ok": report.ok, "problems": list(report.problems),
            "warnings": list(report.warnings), "splits": splits,
            "duplicates": [list(d) for d in report.duplicates] if report.hashed else None}
