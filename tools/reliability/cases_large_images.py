"""An image declaring 50000x50000 pixels in a 69-byte PNG (a decompression bomb, issue 41) given to every tool that
reads images: each names the file and ppdlx's pixel limit in one line, or skips the file with that line while
training, and none hangs (the paddle.io loader with workers=0 did, after the exception killed its thread)."""
from __future__ import annotations

import os
import shutil

from ppdlx.data.image_file import MAX_IMAGE_PIXELS
from .battery import Case, Run
from .faults import decompression_bomb_png
from .workspace import DETECTION_CONFIG, DETECTION_OVERRIDES

AREA = "large images"
BOMB = "huge.png"
LIMIT = f"{MAX_IMAGE_PIXELS:,}"
WHOLE_EPOCH = "train.steps_per_epoch=null"  # every file is read once: the bomb cannot be missed


def _bomb(ctx, *parts):
    folder = ctx.path(*parts[:-1]) if len(parts) > 1 else ctx.dir
    os.makedirs(folder, exist_ok=True)
    return decompression_bomb_png(os.path.join(folder, parts[-1]))


def _infer_classifier(ctx):
    weights = os.path.join(ctx.fx.get("run"), "latest")
    return Run(ctx.classification("tools/infer.py", f"model.weights={weights}", args=("--image", _bomb(ctx, BOMB))),
               mentions=[BOMB, LIMIT], description="tools/infer.py (classifier) --image a PNG declaring 50000x50000")


def _infer_detector(ctx):
    weights = os.path.join(ctx.fx.get("detection_run"), "latest")
    argv = ctx.tool("tools/infer.py", "-c", DETECTION_CONFIG, "-o", *DETECTION_OVERRIDES,
                    f"data.root={ctx.fx.get('coco')}", f"model.weights={weights}", "--image", _bomb(ctx, BOMB),
                    "--output", ctx.path("det.png"))
    return Run(argv, mentions=[BOMB, LIMIT], description="tools/infer.py (detector) --image a PNG declaring "
                                                         "50000x50000")


def _quantize(ctx):
    weights = os.path.join(ctx.fx.get("run"), "latest")
    calib = ctx.path("calib")
    shutil.copytree(os.path.join(ctx.fx.get("digits"), "val", "0"), calib)
    _bomb(ctx, "calib", "a_" + BOMB)
    return Run(ctx.classification("tools/quantize.py", f"model.weights={weights}", args=(
        "--calib-images", calib, "--output-dir", ctx.path("int8"), "--num-images", "8")),
        mentions=["a_" + BOMB, LIMIT], description="quantize --calib-images holding a PNG declaring 50000x50000")


def _deploy(ctx):
    return Run(ctx.deploy(ctx.fx.get("export"), "--input", _bomb(ctx, BOMB)), mentions=[BOMB, f"{LIMIT} pixels"],
               description="deploy --input a PNG declaring 50000x50000")


def _tree_with_bomb(ctx):
    tree = ctx.copy("digits")
    decompression_bomb_png(os.path.join(tree, "train", "3", BOMB))
    return tree


def _check_data(backend):
    def prepare(ctx):
        tree = _tree_with_bomb(ctx)
        return Run(ctx.classification("tools/check_data.py", f"data.backend={backend}", data=tree,
                                      args=("--out", ctx.path("report"))),
                   description=f"check_data.py (data.backend={backend}) on a tree holding train/3/huge.png declaring "
                               f"50000x50000")
    return prepare


def _train(backend, workers=0):
    def prepare(ctx):
        tree = _tree_with_bomb(ctx)
        return Run(ctx.train(ctx.path("out"), f"data.backend={backend}", f"data.workers={workers}", WHOLE_EPOCH,
                             data=tree, epochs=1),
                   description=f"train/3/huge.png declares 50000x50000; data.backend={backend}"
                   + (f", data.workers={workers}" if backend == "paddle" else ""))
    return prepare


def _named_with(*needed):
    """Exit 0 is right when one line names the file and all of ``needed``."""
    def check(ctx, run, result):
        for line in result.output.splitlines():
            if BOMB in line and all(n in line for n in needed):
                return True, f"exit 0, {BOMB} named: {line.strip()[:150]}"
        return False, f"exit 0 without a line naming {BOMB} and {', '.join(needed)}"
    return check


def cases():
    return [
        Case("infer_classifier_huge_png", AREA, "infer.py", "", _infer_classifier, needs_fix=False),
        Case("infer_detector_huge_png", AREA, "infer.py", "", _infer_detector, needs_fix=False),
        Case("quantize_huge_png_calib_image", AREA, "quantize.py", "", _quantize, needs_fix=False),
        Case("deploy_huge_png", AREA, "deploy/python/infer.py", "", _deploy, needs_fix=False),
        Case("check_data_huge_png_paddle", AREA, "check_data.py", "", _check_data("paddle"), expect="ok",
             check=_named_with(LIMIT)),
        Case("check_data_huge_png_dali", AREA, "check_data.py", "", _check_data("dali"), expect="ok",
             check=_named_with()),
        Case("train_huge_png_paddle_workers0", AREA, "train.py", "", _train("paddle", 0), expect="ok",
             check=_named_with(LIMIT), timeout=240),
        Case("train_huge_png_paddle_workers1", AREA, "train.py", "", _train("paddle", 1), expect="ok",
             check=_named_with(LIMIT), timeout=240),
        Case("train_huge_png_dali", AREA, "train.py", "", _train("dali"), expect="ok", check=_named_with(),
             timeout=240),
    ]
