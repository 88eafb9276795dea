"""Per-class analysis of a classifier's predictions: scikit-learn's precision/recall/F1/support and confusion
matrix, the most confidently misclassified images, ``confusion.png``, ``errors.png`` and ``analysis.md``.

Inputs are plain arrays, one row per image in the same order: true labels ``[N]``, scores ``[N, K]``
(probabilities, or logits: turned into probabilities with a softmax), image paths, class names.
"""
from __future__ import annotations

import os

import numpy as np

from ppdlx.analysis.figures import (grid_figure, grid_size, hide_unused, load_rgb, new_figure, plotting_available,
                                    save_figure, show_image)
from ppdlx.analysis.tables import markdown_table, skipped_lines, write_text

CONFUSION_MARGINS = (130, 110, 50, 110)  # left, right, top, bottom (px): names, colour bar, title
ERROR_CELL = (150, 170)
ERROR_TITLE_PX = 60
ERROR_COLUMNS = 8
MATRIX_IN_REPORT = 100  # classes up to which the confusion matrix goes into the report dict / analysis.md


def to_probabilities(scores) -> np.ndarray:
    """Rows that already are distributions are kept; anything else is treated as logits."""
    from scipy.special import softmax  # scikit-learn (and SciPy): only the per-class analysis, seconds to import
    s = np.asarray(scores, np.float64)
    if s.ndim != 2:
        raise ValueError(f"scores must be [images, classes], got shape {s.shape}")
    if s.size and s.min() >= 0.0 and s.max() <= 1.0 and np.allclose(s.sum(axis=1), 1.0, atol=1e-3):
        return s
    return softmax(s, axis=1)


def classification_metrics(labels, scores, class_names, paths=None, top_errors: int = 16) -> dict:
    """The numbers (no files): ``accuracy``, ``per_class`` {name: precision, recall, f1, support,
    most_confused_with, confused}, ``macro avg``/``weighted avg``, ``confusion_matrix`` (counts, rows = true
    class) and ``most_confident_errors``."""
    # scikit-learn: only the per-class analysis, seconds to import
    from sklearn.metrics import accuracy_score, confusion_matrix, precision_recall_fscore_support
    labels = np.asarray(labels, np.int64).reshape(-1)
    probs = to_probabilities(scores)
    names = [str(n) for n in class_names]
    if probs.shape != (len(labels), len(names)):
        raise ValueError(f"scores have shape {probs.shape}; expected ({len(labels)}, {len(names)}) "
                         f"(one row per label, one column per class name)")
    preds = probs.argmax(axis=1)
    classes = np.arange(len(names))
    precision, recall, f1, support = precision_recall_fscore_support(labels, preds, labels=classes,
                                                                     zero_division=0)
    matrix = confusion_matrix(labels, preds, labels=classes)
    per_class = {}
    for k, name in enumerate(names):
        off = matrix[k].copy()
        off[k] = 0
        worst = int(off.argmax())
        per_class[name] = {"precision": float(precision[k]), "recall": float(recall[k]), "f1": float(f1[k]),
                           "support": int(support[k]),
                           "most_confused_with": names[worst] if off[worst] else None, "confused": int(off[worst])}
    out = {"task": "classification", "images": int(len(labels)), "accuracy": float(accuracy_score(labels, preds)),
           "per_class": per_class}
    for average in ("macro", "weighted"):
        p, r, f, _ = precision_recall_fscore_support(labels, preds, labels=classes, average=average,
                                                     zero_division=0)
        out[f"{average} avg"] = {"precision": float(p), "recall": float(r), "f1": float(f)}
    if len(names) <= MATRIX_IN_REPORT:
        out["confusion_matrix"] = matrix.tolist()
    wrong = np.flatnonzero(preds != labels)
    order = wrong[np.argsort(-probs[wrong, preds[wrong]], kind="stable")][:top_errors]
    out["most_confident_errors"] = [
        {"index": int(i), "path": paths[i] if paths is not None else None, "true": names[labels[i]],
         "pred": names[preds[i]], "confidence": float(probs[i, preds[i]]), "true_prob": float(probs[i, labels[i]])}
        for i in order]
    out["errors"] = int(len(wrong))
    return out


def classification_analysis(labels, scores, paths, class_names, out_dir: str, top_errors: int = 16,
                            figures: bool = True) -> dict:
    """``classification_metrics`` plus ``analysis.md``, ``confusion.png`` and ``errors.png`` in ``out_dir``
    (figures only with matplotlib installed). Returns the metrics with ``files`` {name: path}."""
    from sklearn.metrics import confusion_matrix  # scikit-learn: only the per-class analysis
    result = classification_metrics(labels, scores, class_names, paths, top_errors)
    os.makedirs(out_dir, exist_ok=True)
    drawn, skipped = {}, {}
    if figures and plotting_available():
        labels = np.asarray(labels, np.int64).reshape(-1)
        preds = to_probabilities(scores).argmax(axis=1)
        normalised = confusion_matrix(labels, preds, labels=np.arange(len(class_names)), normalize="true")
        drawn["confusion.png"] = save_figure(lambda: confusion_figure(normalised, class_names, result),
                                             os.path.join(out_dir, "confusion.png"), skipped)
        drawn["errors.png"] = save_figure(lambda: errors_figure(result["most_confident_errors"], result["errors"]),
                                          os.path.join(out_dir, "errors.png"), skipped)
    files = {name: path for name, path in drawn.items() if path}
    if skipped:
        result["figures_skipped"] = skipped
    files["analysis.md"] = write_text(os.path.join(out_dir, "analysis.md"),
                                      classification_markdown(result, class_names, files))
    result["files"] = files
    return result


def confusion_cell_px(classes: int) -> int:
    return max(1, min(48, 1200 // max(classes, 1)))


def confusion_size(classes: int):
    left, right, top, bottom = CONFUSION_MARGINS
    side = classes * confusion_cell_px(classes)
    return left + side + right, top + side + bottom


def confusion_figure(normalised, class_names, result):
    k = len(class_names)
    width, height = confusion_size(k)
    left, right, top, bottom = CONFUSION_MARGINS
    side = k * confusion_cell_px(k)
    fig = new_figure(width, height)
    ax = fig.add_axes([left / width, bottom / height, side / width, side / height])
    image = ax.imshow(np.nan_to_num(normalised), cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest")
    bar = fig.add_axes([(left + side + 20) / width, bottom / height, 18 / width, side / height])
    fig.colorbar(image, cax=bar)
    cell = confusion_cell_px(k)
    if cell >= 10:
        ticks = np.arange(k)
        ax.set_xticks(ticks, [str(n) for n in class_names], rotation=90, fontsize=8)
        ax.set_yticks(ticks, [str(n) for n in class_names], fontsize=8)
    if cell >= 28:
        for t in range(k):
            for p in range(k):
                value = normalised[t, p]
                if value > 0:
                    ax.text(p, t, f"{value:.2f}", ha="center", va="center", fontsize=7,
                            color="white" if value > 0.5 else "black")
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    fig.suptitle(f"confusion matrix, rows normalised to the true class ({result['images']} images, "
                 f"accuracy {result['accuracy']:.4f})", fontsize=10)
    return fig


def errors_size(shown: int):
    return grid_size(shown, ERROR_COLUMNS, ERROR_CELL, ERROR_TITLE_PX)[2:]


def errors_figure(errors, total_errors: int):
    fig, axes = grid_figure(len(errors), ERROR_COLUMNS, ERROR_CELL, ERROR_TITLE_PX,
                            f"most confidently misclassified: {len(errors)} of {total_errors} errors", 0.1, 0.45)
    for ax, e in zip(axes, errors):
        image = load_rgb(e["path"]) if e["path"] else None
        show_image(ax, image, title=f"true {e['true']}\npred {e['pred']} ({e['confidence']:.2f})",
                   placeholder="unreadable" if e["path"] else f"image {e['index']}")
    if not errors:
        axes[0].axis("off")
        axes[0].text(0.5, 0.5, "no misclassified images", ha="center", va="center", transform=axes[0].transAxes)
    hide_unused(axes, max(len(errors), 1))
    return fig


def classification_markdown(result, class_names, files) -> str:
    lines = ["# Per-class analysis (classification)", "",
             f"{result['images']} images, accuracy {result['accuracy']:.4f}, {result['errors']} misclassified. "
             f"Macro F1 {result['macro avg']['f1']:.4f}, weighted F1 {result['weighted avg']['f1']:.4f} "
             f"(scikit-learn).", ""]
    rows = [[name, v["precision"], v["recall"], v["f1"], v["support"],
             f"{v['most_confused_with']} ({v['confused']})" if v["most_confused_with"] is not None else "-"]
            for name, v in result["per_class"].items()]
    for average in ("macro avg", "weighted avg"):
        a = result[average]
        rows.append([average, a["precision"], a["recall"], a["f1"], result["images"], ""])
    lines += [markdown_table(["class", "precision", "recall", "F1", "support", "most confused with (images)"],
                             rows), ""]
    if "confusion_matrix" in result and len(class_names) <= 20:
        lines += ["## Confusion matrix (counts; rows true, columns predicted)", "",
                  markdown_table(["true \\ pred"] + [str(n) for n in class_names],
                                 [[str(n)] + row for n, row in zip(class_names, result["confusion_matrix"])]), ""]
    for name in ("confusion.png", "errors.png"):
        if name in files:
            lines += [f"![{name}]({name})", ""]
    lines += skipped_lines(result)
    if result["most_confident_errors"]:
        lines += ["## Most confidently misclassified", "",
                  markdown_table(["image", "true", "predicted", "confidence", "p(true)"],
                                 [[e["path"] or e["index"], e["true"], e["pred"], e["confidence"], e["true_prob"]]
                                  for e in result["most_confident_errors"]]), ""]
    return "\n".join(lines)
