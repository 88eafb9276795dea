"""Opening an image file, with one pixel limit for every reader in ppdlx.

A PNG of a few hundred bytes can declare 50000x50000 pixels. Pillow guards against such decompression bombs
only half-way by default: past ``Image.MAX_IMAGE_PIXELS`` it warns and decodes anyway, past twice that it raises
``DecompressionBombError``, an exception that is not an ``OSError``, so readers that skip an unreadable file
let it through (a data-loader thread died with it and the training hung). Here the limit is set once,
explicitly, and both of Pillow's signals become :class:`ImageTooLarge`, an ``OSError``: a reader that skips or
names an unreadable file does the same for this one, with the limit in its message. The warning is turned into
an error as Pillow's documentation suggests; :func:`open_image` checks the size itself too, so the limit holds
where a caller has reset the warning filters.
"""
from __future__ import annotations

import re
import warnings

from PIL import Image

# Pillow's own refusal threshold (twice its warning threshold): every image Pillow decoded before still opens,
# and nothing larger does (an RGB image at the limit is 0.5 GB decoded, 2 GB as float32).
MAX_IMAGE_PIXELS = 178_956_970
Image.MAX_IMAGE_PIXELS = MAX_IMAGE_PIXELS
warnings.simplefilter("error", Image.DecompressionBombWarning)


class ImageTooLarge(OSError):
    """An image declaring more than :data:`MAX_IMAGE_PIXELS` pixels (its message does not name the file: the
    callers' "<file>: cannot read image (...)" lines do)."""


def _too_large(pixels) -> ImageTooLarge:
    declared = f"declares {pixels:,} pixels, " if pixels else ""
    return ImageTooLarge(f"it {declared}more than the {MAX_IMAGE_PIXELS:,} ppdlx opens (a decompression bomb, or a "
                         f"scan far larger than any input size): shrink it or leave it out")


def open_image(path: str) -> Image.Image:
    """``PIL.Image.open(path)`` (the header only, no pixels decoded yet); :class:`ImageTooLarge` past the limit."""
    try:
        img = Image.open(path)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        found = re.search(r"\((\d+) pixels\)", str(err))
        raise _too_large(int(found.group(1)) if found else None) from None
    if img.width * img.height > MAX_IMAGE_PIXELS:
        pixels = img.width * img.height
        img.close()
        raise _too_large(pixels)
    return img


def open_rgb(path: str) -> Image.Image:
    """The decoded image in RGB; the errors of :func:`open_image` and of Pillow's decoder."""
    with open_image(path) as img:
        return img.convert("RGB")


def why_unreadable(path: str) -> str:
    """What stops ``path`` from decoding, without the path (the line that names a skipped file has it); "" when it
    decodes now."""
    try:
        open_rgb(path)
    except (OSError, ValueError, SyntaxError) as err:
        return (str(err) or type(err).__name__).replace(f" {path!r}", "")
    return ""
