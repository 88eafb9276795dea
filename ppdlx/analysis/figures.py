"""What every figure shares: matplotlib imported only when a figure is drawn, headless, and exact pixel sizes.

Figures are ``matplotlib.figure.Figure`` objects on an Agg canvas, never ``pyplot``: nothing global is
switched (a notebook's backend stays as it was) and no figure outlives the call that drew it. Sizes are
given in pixels and saved at ``DPI`` without tight cropping, so a PNG has exactly the size asked for.
"""
from __future__ import annotations

import math
import os

import numpy as np

from ppdlx.errors import UnsupportedError

DPI = 100
PLOT_EXTRA = "pip install 'ppdlx[plot]'"


def plotting_available() -> bool:
    """Whether matplotlib imports (the package only: pyplot and its backends are never loaded)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def new_figure(width_px: int, height_px: int):
    """An empty ``Figure`` of ``width_px x height_px`` on its own Agg canvas."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
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


def save_png(fig, path: str) -> str:
    """Write ``fig`` to ``path`` atomically (a reader never sees half a PNG); returns ``path``."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}.png"
    fig.savefig(tmp, dpi=DPI, format="png")
    os.replace(tmp, path)
    return path


def class_colour(index: int):
    """A distinct RGB colour per class index (matplotlib's qualitative tab20 map)."""
    from matplotlib import colormaps
    index = int(index)
    # tab20 pairs a dark and a light shade of each hue: the ten dark ones first, then the light ones
    return colormaps["tab20"]((2 * index + (index // 10) % 2) % 20)[:3]


def load_rgb(path: str):
    """The image as an RGB array, or None when it cannot be opened (drawn as an 'unreadable' cell)."""
    from PIL import Image
    try:
        with Image.open(path) as img:
            return np.asarray(img.convert("RGB"))
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


def draw_boxes(ax, boxes_xywh, names, colours, scores=None, fontsize: float = 7) -> None:
    """COCO ``[x, y, w, h]`` boxes as outlines, each labelled with its name (and score)."""
    from matplotlib.patches import Rectangle
    top = min(ax.get_ylim())
    for i, (x, y, w, h) in enumerate(boxes_xywh):
        colour = colours[i]
        ax.add_patch(Rectangle((x, y), w, h, fill=False, edgecolor=colour, linewidth=1.5))
        label = names[i] if scores is None else f"{names[i]} {scores[i]:.2f}"
        inside = y - top < 0.1 * h + 4  # no room above the box: the label goes just inside its top edge
        ax.text(x, y, label, fontsize=fontsize, color="white", va="top" if inside else "bottom", clip_on=True,
                bbox=dict(facecolor=colour, edgecolor="none", pad=1.0, alpha=0.85))


def hide_unused(axes, used: int) -> None:
    for ax in list(np.ravel(axes))[used:]:
        ax.set_visible(False)
