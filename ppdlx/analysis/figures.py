"""What every figure shares: matplotlib imported only when a figure is drawn, headless, and exact pixel sizes.

Figures are ``matplotlib.figure.Figure`` objects on an Agg canvas, never ``pyplot``: nothing global is
switched (a notebook's backend stays as it was) and no figure outlives the call that drew it. Sizes are
given in pixels and saved at ``DPI`` without tight cropping, so a PNG has exactly the size asked for.
"""
from __future__ import annotations

import logging
import math
import os

import numpy as np

from ppdlx.data.image_file import open_rgb
from ppdlx.errors import UnsupportedError

log = logging.getLogger("ppdlx.analysis")

DPI = 100
PLOT_EXTRA = "pip install 'ppdlx[plot]'"
MAX_BOX_LABELS = 25  # labelled boxes per image; every box is outlined


def plotting_available() -> bool:
    """Whether matplotlib imports (the package only: pyplot and its backends are never loaded)."""
    try:
        import matplotlib  # noqa: F401  (optional, ppdlx[plot]: figures only)
    except ImportError:
        return False
    return True


def new_figure(width_px: int, height_px: int):
    """An empty ``Figure`` of ``width_px x height_px`` on its own Agg canvas."""
    try:
        # optional (ppdlx[plot]): figures only, training and every report work without it
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure  # optional, as above
    except ImportError:
        raise UnsupportedError(f"figures need matplotlib, which is not installed: {PLOT_EXTRA}") from None
    fig = Figure(figsize=(width_px / DPI, height_px / DPI), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def grid_size(cells: int, max_columns: int, cell_px, title_px: int):
    """``(columns, rows, width, height)`` of a grid of ``cells`` (at least one) ``cell_px = (w, h)`` cells,
    at most ``max_columns`` a row, under a ``title_px`` title band."""
    columns = min(max_columns, max(cells, 1))
    rows = math.ceil(max(cells, 1) / columns)
    return columns, rows, columns * cell_px[0], title_px + rows * cell_px[1]


def grid_figure(cells: int, max_columns: int, cell_px, title_px: int, title: str, wspace: float, hspace: float):
    """``(figure, axes in reading order)`` of a :func:`grid_size` grid of image cells titled ``title``."""
    columns, rows, width, height = grid_size(cells, max_columns, cell_px, title_px)
    fig = new_figure(width, height)
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.01, top=1.0 - title_px / height, wspace=wspace,
                        hspace=hspace)
    axes = [ax for row in fig.subplots(rows, columns, squeeze=False) for ax in row]
    fig.suptitle(title, fontsize=10)
    return fig, axes


def figure_skipped(name: str, err: BaseException) -> str:
    """Log that figure ``name`` was not drawn because of ``err`` (one warning line); returns the reason."""
    message = (str(err).strip().splitlines() or [""])[0]
    reason = f"{type(err).__name__}: {message}" if message else type(err).__name__
    log.warning("%s not drawn: %s", name, reason)
    return reason


def save_figure(draw, path: str, skipped: dict) -> str | None:
    """``save_png(draw(), path)``; when drawing or saving fails, the figure is left out with one warning
    line (``skipped[name] = reason``) and None returned: a picture is never worth the exit code of a
    finished training or evaluation, nor the rest of its report."""
    name = os.path.basename(path)
    try:
        return save_png(draw(), path)
    except Exception as err:  # noqa: BLE001 - any drawing failure (matplotlib, fonts, images) skips the figure
        skipped[name] = figure_skipped(name, err)
        return None


def save_png(fig, path: str) -> str:
    """Write ``fig`` to ``path`` atomically (a reader never sees half a PNG); returns ``path``."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}.png"
    try:
        fig.savefig(tmp, dpi=DPI, format="png")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return path


def class_colour(index: int):
    """A distinct RGB colour per class index (matplotlib's qualitative tab20 map)."""
    from matplotlib import colormaps  # optional (ppdlx[plot]): figures only
    index = int(index)
    # tab20 pairs a dark and a light shade of each hue: the ten dark ones first, then the light ones
    return colormaps["tab20"]((2 * index + (index // 10) % 2) % 20)[:3]


def load_rgb(path: str):
    """The image as an RGB array, or None when it cannot be opened (drawn as an 'unreadable' cell)."""
    try:
        return np.asarray(open_rgb(path))
    except (OSError, ValueError, SyntaxError):
        return None


def show_image(ax, image, title: str = "", fontsize: float = 8, placeholder: str = "unreadable") -> None:
    """``image`` (array, or None: ``placeholder`` is written instead) in ``ax`` without ticks, with a title."""
    ax.set_xticks([])
    ax.set_yticks([])
    if image is None:
        ax.text(0.5, 0.5, placeholder, ha="center", va="center", transform=ax.transAxes, fontsize=fontsize)
    else:
        ax.imshow(image, interpolation="nearest" if max(image.shape[:2]) < 64 else "antialiased")
    if title:
        ax.set_title(title, fontsize=fontsize)


def clip_to_view(ax, boxes_xywh) -> list:
    """``(index, x1, y1, x2, y2)`` of each COCO ``[x, y, w, h]`` box cut to what ``ax`` shows (the image);
    boxes with no area left there, or not finite, are left out."""
    (left, right), (top, bottom) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
    kept = []
    for i, box in enumerate(boxes_xywh):
        x, y, w, h = (float(v) for v in box)
        if not np.isfinite([x, y, w, h]).all():
            continue
        x1, x2 = min(max(x, left), right), min(max(x + w, left), right)
        y1, y2 = min(max(y, top), bottom), min(max(y + h, top), bottom)
        if x2 > x1 and y2 > y1:
            kept.append((i, x1, y1, x2, y2))
    return kept


def draw_boxes(ax, boxes_xywh, names, colours, scores=None, fontsize: float = 7) -> int:
    """COCO ``[x, y, w, h]`` boxes as outlines cut to the image ``ax`` shows (one artist for all of them), the
    ``MAX_BOX_LABELS`` largest each labelled with its name (and score) inside the axes: an under-trained detector
    predicts boxes far outside the image, and text placed there overflows the font rasteriser; a text per box made
    an image with a thousand boxes take minutes to draw, and unreadable. Returns how many boxes are labelled."""
    from matplotlib.collections import PatchCollection  # optional (ppdlx[plot]): figures only
    from matplotlib.patches import Rectangle  # optional, as above
    top = min(ax.get_ylim())
    shown = clip_to_view(ax, boxes_xywh)
    if not shown:
        return 0
    ax.add_collection(PatchCollection([Rectangle((x1, y1), x2 - x1, y2 - y1) for _, x1, y1, x2, y2 in shown],
                                      facecolor="none", edgecolors=[colours[i] for i, *_ in shown], linewidths=1.5))
    labelled = sorted(shown, key=lambda b: (b[3] - b[1]) * (b[4] - b[2]), reverse=True)[:MAX_BOX_LABELS]
    for i, x1, y1, x2, y2 in labelled:
        colour = colours[i]
        label = names[i] if scores is None else f"{names[i]} {scores[i]:.2f}"
        inside = y1 - top < 0.1 * (y2 - y1) + 4  # no room above the box: the label goes just inside its top edge
        ax.text(x1, y1, label, fontsize=fontsize, color="white", va="top" if inside else "bottom", clip_on=True,
                bbox=dict(facecolor=colour, edgecolor="none", pad=1.0, alpha=0.85))
    return len(labelled)


def hide_unused(axes, used: int) -> None:
    for ax in list(np.ravel(axes))[used:]:
        ax.set_visible(False)
