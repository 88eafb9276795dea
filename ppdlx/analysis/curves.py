"""``curves.png`` from one or more run directories' ``metrics.jsonl``, runs overlaid, legend from their configs.

A run's ``metrics.jsonl`` (``ppdlx.engine.logger.MetricLogger``) holds one JSON object per progress or eval
line: ``kind`` ("train" | "eval"), ``step`` (global optimizer step), ``epoch`` (1-based), and for "train"
``loss``, ``lr``, ``ips_global``; for "eval" ``top1``/``top5``/``loss`` (classification) or ``AP``/``AP50``/...
(detection). Train points sit at fractional epochs (their step within the epoch), eval points at the epoch
they close. A resumed run appends to the same file: a later line for the same step (train) or epoch (eval)
replaces the earlier one, so the curve shows what the finished run did.
"""
from __future__ import annotations

import json
import logging
import os

import numpy as np

from ppdlx.analysis.figures import PLOT_EXTRA, figure_skipped, new_figure, plotting_available, save_png
from ppdlx.config import load_yaml_with_bases
from ppdlx.errors import ConfigError, DataError

log = logging.getLogger("ppdlx.analysis")

# (panel title, record kind, keys: the first one a run has is drawn)
PANELS = (
    ("train loss", "train", ("loss",)),
    ("val loss", "eval", ("loss",)),
    ("learning rate", "train", ("lr",)),
    ("val {}", "eval", ("top1", "AP")),
    ("val {}", "eval", ("top5", "AP50")),
    ("throughput (img/s, all devices)", "train", ("ips_global",)),
)
FIGURE_PX = (1500, 900)
# config keys that tell runs apart in a legend, first; the run's own paths never do
LABEL_KEYS_FIRST = ("model.name", "train.graph", "asp.enabled", "amp.enabled", "amp.dtype", "amp.level",
                    "distill.enabled", "optimizer.name", "lr.base_lr", "data.batch_size", "train.epochs",
                    "data.backend")
LABEL_KEYS_IGNORED = ("global.output_dir", "train.resume")
LABEL_KEYS_SHOWN = 3


def read_metrics(path: str) -> dict:
    """``{kind: [records sorted by step]}`` with repeated steps (train) / epochs (eval) resolved to the last."""
    by_kind: dict = {}
    with open(path, encoding="utf-8", errors="replace") as f:  # a binary file has no record: said by the caller
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a run killed mid-write leaves a partial last line
            if not isinstance(record, dict) or "step" not in record:
                continue
            kind = record.get("kind", "")
            key = record.get("epoch") if kind == "eval" else record["step"]
            by_kind.setdefault(kind, {})[key] = record
    return {kind: sorted(records.values(), key=lambda r: (r["step"], r.get("epoch", 0)))
            for kind, records in by_kind.items()}


def fractional_epochs(records) -> np.ndarray:
    """Each train record's position in epochs: ``epoch - 1 + (step - epoch start) / steps in the epoch``."""
    ends: dict = {}
    for r in records:
        ends[r["epoch"]] = max(ends.get(r["epoch"], 0), r["step"])
    lengths = [ends[e] - ends[e - 1] for e in ends if e - 1 in ends]
    per_epoch = float(np.median(lengths)) if lengths else None
    xs = []
    for r in records:
        e, end = r["epoch"], ends[r["epoch"]]
        start = ends.get(e - 1)
        if start is None:
            start = end - per_epoch if per_epoch else (0 if e == 1 else None)
        xs.append(float(e) if start is None or end <= start else e - 1 + (r["step"] - start) / (end - start))
    return np.asarray(xs)


def _flatten(tree, prefix="") -> dict:
    out = {}
    for key, value in (tree or {}).items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, path + "."))
        else:
            out[path] = value
    return out


def _run_config(run_dir: str) -> dict:
    path = os.path.join(run_dir, "config.yaml")
    if not os.path.isfile(path):
        return {}
    try:
        return _flatten(load_yaml_with_bases(path))
    except ConfigError as err:
        log.warning("%s: not used for the legend (%s)", path, err)
        return {}


def run_labels(run_dirs) -> list:
    """Legend entries: the directory name, then the config values that differ between the runs."""
    dirs = [os.path.normpath(os.path.abspath(d)) for d in run_dirs]
    names = [os.path.basename(d) for d in dirs]
    if len(set(names)) < len(names):
        names = [os.path.join(os.path.basename(os.path.dirname(d)), os.path.basename(d)) for d in dirs]
    configs = [_run_config(d) for d in dirs]
    if len(dirs) == 1:
        model = configs[0].get("model.name")
        return [f"{names[0]} ({model})" if model else names[0]]
    keys = sorted({k for c in configs for k in c} - set(LABEL_KEYS_IGNORED))
    differing = [k for k in keys if len({json.dumps(c.get(k), sort_keys=True, default=str) for c in configs}) > 1]
    ordered = [k for k in LABEL_KEYS_FIRST if k in differing] + [k for k in differing if k not in LABEL_KEYS_FIRST]
    labels = []
    for name, config in zip(names, configs):
        shown = ", ".join(f"{k}={config.get(k)}" for k in ordered[:LABEL_KEYS_SHOWN])
        labels.append(f"{name}: {shown}" if shown else name)
    return labels


def _metrics_path(run_dir: str) -> str:
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise DataError(f"{run_dir}: no metrics.jsonl (a ppdlx run directory has one; is this the run's "
                        f"global.output_dir?)")
    return path


def _describe_file(path: str) -> str:
    size = os.path.getsize(path)
    if not size:
        return "empty"
    with open(path, "rb") as f:
        head = f.read(4096)
    binary = b"\0" in head or _not_text(head)
    return f"{size} bytes{', binary' if binary else ''}"


def _not_text(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as err:
        return err.start < len(data) - 4  # a multi-byte character cut by the 4 KB read is still text
    return False


def plot_curves(run_dirs, out_path: str, labels=None) -> dict:
    """Draw every run of ``run_dirs`` into one ``curves.png``. Returns ``{"path", "panels": {title: [labels of
    the curves drawn in it]}}``, read back from the figure's axes."""
    run_dirs = list(run_dirs)
    metrics = [read_metrics(_metrics_path(d)) for d in run_dirs]
    for run_dir, records in zip(run_dirs, metrics):
        if not records:
            path = _metrics_path(run_dir)
            raise DataError(f"{path}: no metrics record in it ({_describe_file(path)}, no line a JSON object with a "
                            f"'step'); give a run directory whose training logged a step")
    labels = list(labels) if labels else run_labels(run_dirs)
    fig = new_figure(*FIGURE_PX)
    legend_rows = int(np.ceil(len(run_dirs) / 2))
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.07, top=0.93 - 0.03 * legend_rows, wspace=0.25,
                        hspace=0.35)
    axes = fig.subplots(2, 3).ravel()
    handles = {}
    for ax, (title, kind, keys) in zip(axes, PANELS):
        used = []
        for i, (m, label) in enumerate(zip(metrics, labels)):
            records = m.get(kind, [])
            key = next((k for k in keys if any(k in r for r in records)), None)
            if key is None:
                continue
            records = [r for r in records if isinstance(r.get(key), (int, float)) and "epoch" in r]
            if kind == "train":
                x = fractional_epochs(records)
                line, = ax.plot(x, [r[key] for r in records], color=f"C{i}", linewidth=1.2, label=label)
            else:
                line, = ax.plot([r["epoch"] for r in records], [r[key] for r in records], color=f"C{i}",
                                marker="o", markersize=3, linewidth=1.2, label=label)
            handles.setdefault(label, line)
            used.append(key)
        ax.set_title(title.format(" | ".join(dict.fromkeys(used)) or keys[0]), fontsize=10)
        ax.set_xlabel("epoch", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        if not used:
            ax.text(0.5, 0.5, "not in metrics.jsonl", ha="center", va="center", transform=ax.transAxes)
    fig.legend(list(handles.values()), list(handles.keys()), loc="upper center", ncol=min(len(handles), 2),
               fontsize=9, frameon=False)
    save_png(fig, out_path)
    return {"path": out_path,
            "panels": {ax.get_title(): [line.get_label() for line in ax.get_lines()] for ax in axes}}


def write_run_figures(run_dir: str) -> list:
    """``<run_dir>/curves.png`` at the end of a run. Never stops a run: without matplotlib or metrics, or
    when drawing fails, it logs one line and returns ``[]``; otherwise the written paths."""
    if not plotting_available():
        log.info("curves.png not drawn: matplotlib is not installed (%s)", PLOT_EXTRA)
        return []
    if not os.path.isfile(os.path.join(run_dir, "metrics.jsonl")):
        log.info("curves.png not drawn: %s has no metrics.jsonl", run_dir)
        return []
    try:
        out = plot_curves([run_dir], os.path.join(run_dir, "curves.png"))
    except Exception as err:  # noqa: BLE001 - a figure never fails the run it shows
        figure_skipped("curves.png", err)
        return []
    log.info("curves: %s", out["path"])
    return [out["path"]]
