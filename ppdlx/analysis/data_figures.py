"""``data_samples.png``: training images as the data hold them, one row per class (classification) or
images with their boxes drawn and named (detection)."""
from __future__ import annotations

import os

from ppdlx.analysis.figures import (class_colour, draw_boxes, grid_figure, grid_size, hide_unused, load_rgb,
                                    new_figure, save_png, show_image)

CELL_PX = 96          # one classification sample
LABEL_PX = 120        # the class-name column
TITLE_PX = 50
MAX_CLASS_ROWS = 20   # a 1000-class set shows its first classes
BOX_CELL_PX = 240     # one detection sample
BOX_COLUMNS = 4


def classification_grid(split, per_class: int):
    """``[(class name, [paths])]``: the first ``per_class`` decodable files of each class (sorted order)."""
    bad = {p for p, _ in split.unreadable}
    rows = []
    for label, name in enumerate(split.classes[:MAX_CLASS_ROWS]):
        paths = [p for p, lab in zip(split.paths, split.labels) if lab == label and p not in bad]
        rows.append((name, paths[:per_class]))
    return rows


def classification_samples_size(rows: int, columns: int):
    return LABEL_PX + columns * CELL_PX, TITLE_PX + rows * CELL_PX


def detection_samples_size(images: int):
    return grid_size(images, BOX_COLUMNS, (BOX_CELL_PX, BOX_CELL_PX), TITLE_PX)[2:]


def write_data_samples(report, path: str, samples: int = 8) -> str:
    """``samples`` images per class (classification) or in all (detection), from the training split."""
    split = report.splits["train"]
    fig = _detection_figure(split, samples) if report.boxes else \
        _classification_figure(split, samples)
    return save_png(fig, path)


def _classification_figure(split, per_class: int):
    rows = classification_grid(split, per_class) or [("(no images)", [])]
    columns = max(per_class, 1)
    width, height = classification_samples_size(len(rows), columns)
    fig = new_figure(width, height)
    fig.subplots_adjust(left=LABEL_PX / width, right=1.0, bottom=0.0, top=1.0 - TITLE_PX / height,
                        wspace=0.04, hspace=0.04)
    axes = fig.subplots(len(rows), columns, squeeze=False)
    fig.suptitle(f"{split.name}: first {per_class} images of each class ({split.source})", fontsize=10)
    for r, (name, paths) in enumerate(rows):
        for c in range(columns):
            ax = axes[r][c]
            if c < len(paths):
                show_image(ax, load_rgb(paths[c]))
            else:
                ax.axis("off")
        axes[r][0].axis("on")
        axes[r][0].set_xticks([])
        axes[r][0].set_yticks([])
        axes[r][0].set_ylabel(name, rotation=0, ha="right", va="center", fontsize=9)
    return fig


def _detection_figure(split, count: int):
    bad = {p for p, _ in split.unreadable}
    chosen = [i for i, p in enumerate(split.paths) if p not in bad][:max(count, 1)]
    fig, flat = grid_figure(len(chosen), BOX_COLUMNS, (BOX_CELL_PX, BOX_CELL_PX), TITLE_PX,
                            f"{split.name}: {len(chosen)} images with their boxes ({split.source})", 0.05, 0.15)
    for ax, i in zip(flat, chosen):
        boxes = split.image_boxes[i]
        plural = "" if len(boxes) == 1 else "es"
        show_image(ax, load_rgb(split.paths[i]))
        labelled = draw_boxes(ax, [b[:4] for b in boxes], [split.classes[b[4]] for b in boxes],
                              [class_colour(b[4]) for b in boxes])
        some = f", {labelled} largest labelled" if labelled < len(boxes) else ""
        ax.set_title(f"{os.path.basename(split.paths[i])} ({len(boxes)} box{plural}{some})", fontsize=8)
    hide_unused(flat, len(chosen))
    return fig
