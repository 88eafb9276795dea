"""One pixel limit for every image ppdlx opens: a PNG declaring 50000x50000 pixels in 69 bytes is refused at its
header with a line naming the limit, by every reader, and skipped by the training loaders (the paddle.io loader's
thread died on Pillow's DecompressionBombError, which is no OSError, and training hung with data.workers=0)."""
import logging
import shutil
import warnings

import pytest
from PIL import Image

from ppdlx.data.image_file import MAX_IMAGE_PIXELS, ImageTooLarge, open_image, open_rgb, why_unreadable
from ppdlx.data.loader import build_classification_loader
from tools.reliability.faults import decompression_bomb_png
from tests.data.test_image_folder import cfg_for

TOO_LARGE = ("it declares 2,500,000,000 pixels, more than the 178,956,970 ppdlx opens (a decompression bomb, or a "
             "scan far larger than any input size): shrink it or leave it out")


def test_a_png_declaring_50000x50000_is_refused_at_its_header(tmp_path):
    bomb = decompression_bomb_png(str(tmp_path / "huge.png"))
    with pytest.raises(ImageTooLarge) as err:
        open_image(bomb)
    assert str(err.value) == TOO_LARGE and isinstance(err.value, OSError)
    assert why_unreadable(bomb) == TOO_LARGE
    Image.new("RGB", (40, 30)).save(tmp_path / "small.png")
    assert open_rgb(str(tmp_path / "small.png")).size == (40, 30) and why_unreadable(str(tmp_path / "small.png")) == ""


def test_the_limit_holds_where_the_warning_filters_were_reset(tmp_path):
    # 14000 x 14000 is past the limit but below Pillow's own refusal (twice it), where Pillow only warns: a caller
    # that resets the warning filters (as pytest does around each test) must not get the image decoded.
    assert MAX_IMAGE_PIXELS < 14_000 ** 2 < 2 * MAX_IMAGE_PIXELS
    bomb = decompression_bomb_png(str(tmp_path / "big.png"), side=14_000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ImageTooLarge, match="it declares 196,000,000 pixels, more than the 178,956,970"):
            open_image(bomb)


@pytest.mark.parametrize("workers", [0, 1])
def test_the_paddle_loader_skips_it_with_a_line_naming_the_limit(tiny_tree, tmp_path, ppdlx_caplog, workers):
    root = tmp_path / "tree"
    shutil.copytree(tiny_tree, root)
    bomb = decompression_bomb_png(str(root / "val" / "0" / "huge.png"))
    loader = build_classification_loader(cfg_for(str(root), f"data.workers={workers}"), "val")
    with ppdlx_caplog.at_level(logging.WARNING, logger="ppdlx.data"):
        seen = sum(int(y.shape[0]) for _, y in loader)
    assert loader.num_images == 17 and seen == 16
    assert [r.getMessage() for r in ppdlx_caplog.records if "unreadable" in r.getMessage()] == [
        f"skipping unreadable image {bomb} ({TOO_LARGE}; 1 skipped so far)"]
