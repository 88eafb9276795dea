"""EfficientNet-Lite0's genuine ImageNet weights (tests/weights/lite0.py) through every route a user takes with
``configs/efficientnet_lite0.yaml``, on the 7 real photos: train-time evaluation, ``tools/infer.py``,
``tools/export_model.py`` and ``deploy/python/infer.py`` on that export with ppdlx blocked. Each route must put every
photo's top-1 on its ImageNet class, all routes on the same class, and agree on its softmax score within
``SCORE_ATOL``.

Evaluation data: labels are the indices of the sorted class folders, and an evaluation split must hold images of
every class (``build_classification_loader`` refuses empty class folders), while only 7 of ImageNet's 1000 classes
have a photo here. So train-time evaluation is checked twice:

* ``tools/eval.py`` evaluates the genuine weights with the classifier restricted to the photos' 7 classes (columns
  in the order of the folder names, the zero-padded ImageNet indices): its logits are the 1000-class model's at
  those indices, so top-1 = 1.0 says each photo's class beats the other 6;
* the evaluator training runs (``ClassificationEvaluator`` over an ``ImageFolder`` with the config's evaluation
  transform, in process) scores the 1000-class model on a tree of all 1000 index folders, 7 holding a photo,
  giving each photo's top-1 of 1000 and its score (built directly: the loader's empty-folder refusal is the one
  step left out).

One export (1000 classes), reused by the deploy run.
"""
import csv
import json
import os
import re
import subprocess
import sys

import paddle
import pytest
import yaml

from ppdlx.checkpoint import load_weights
from ppdlx.config import load_config
from ppdlx.data.image_folder import ImageFolder
from ppdlx.data.loader import ImageFolderLoader
from ppdlx.data.loader_common import split_batch_sampler
from ppdlx.data.transforms import EvalTransform
from ppdlx.evaluation.classification import ClassificationEvaluator
from ppdlx.models.from_config import build_model
from tests.deploy.test_package import RUN_CLI, _without_ppdlx
from tests.weights.lite0 import (EXPECTED, IMAGENET, convert_lite0, expected_indices, imagenet_like_names, photos,
                                 png_name, save_photo)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "efficientnet_lite0.yaml")
DEPLOY_INFER = os.path.join(ROOT, "deploy", "python", "infer.py")
# top-1 softmax probability, absolute, against the evaluator's: tools/infer.py writes 6 decimals and runs the same
# dynamic model (rounding <= 5e-7); deploy prints 4 decimals (<= 5e-5) and runs the exported program
SCORE_ATOL = {"tools/infer.py": 2e-6, "deploy/python/infer.py": 1e-4}
# the folder each photo is filed under: its ImageNet class (chelsea: tiger cat, its highest-scoring cat class)
CLASS_OF = {"coffee": IMAGENET["espresso"], "chelsea": IMAGENET["tiger cat"], "rocket": IMAGENET["missile"],
            "stereo_motorcycle": IMAGENET["moped"], "china.jpg": IMAGENET["palace"], "flower.jpg": IMAGENET["daisy"],
            "grace_hopper.jpg": IMAGENET["academic gown"]}
# the in-process evaluator below is the paddle.io one (PIL): the tools must agree with it to 2e-6
CPU = ["amp.enabled=false", "global.device=cpu", "data.workers=0", "eval.batch_size=7", "data.backend=paddle"]


def _tool(script, *args):
    proc = subprocess.run([sys.executable, script, *map(str, args)], capture_output=True, text=True, timeout=900,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _photo_of(path):
    return next(name for name in EXPECTED if png_name(name) == os.path.basename(path))


def evaluate_in_process(prefix, root):
    """The training loop's evaluator on ``root/val`` (1000 folders): ``{photo: (top-1, its probability)}``."""
    cfg = load_config(CONFIG, [f"model.weights={prefix}", f"data.root={root}", *CPU])
    dataset = ImageFolder(root, cfg.data.val_split, EvalTransform(cfg.data.transforms, cfg.model.data_format))
    sampler = split_batch_sampler(False, len(dataset), 7, 0, 1, cfg.global_.seed, shuffle=True,
                                  source=dataset.split_dir)
    model = build_model(cfg)
    assert load_weights(model, prefix) == []
    evaluator = ClassificationEvaluator(ImageFolderLoader(dataset, sampler, 0), cfg.eval.topk, keep_predictions=True)
    metrics = evaluator(model)
    kept = evaluator.last_predictions
    probs = paddle.nn.functional.softmax(paddle.to_tensor(kept["logits"]), axis=-1).numpy()
    assert (metrics["images"], metrics["top1"]) == (7, 1.0)
    assert [int(label) for label in kept["labels"]] == [CLASS_OF[_photo_of(p)] for p in kept["paths"]]
    return {_photo_of(path): (int(p.argmax()), float(p.max())) for path, p in zip(kept["paths"], probs)}


def restricted_checkpoint(prefix, out, classes):
    """The genuine weights with the classifier's columns ``classes`` only (a 7-class Lite0)."""
    state = paddle.load(prefix + ".pdparams")
    state["fc.weight"] = paddle.to_tensor(state["fc.weight"].numpy()[:, classes])
    state["fc.bias"] = paddle.to_tensor(state["fc.bias"].numpy()[classes])
    paddle.save(state, out + ".pdparams")
    return out


@pytest.fixture(scope="module")
def routes(tmp_path_factory):
    base = tmp_path_factory.mktemp("lite0_e2e")
    prefix = convert_lite0(base / "lite0")
    root = base / "data"
    for k in range(1000):
        (root / "val" / f"{k:03d}").mkdir(parents=True)
    listing = []
    for name, rgb in photos().items():
        save_photo(root / "val" / f"{CLASS_OF[name]:03d}", name, rgb)
        listing.append(save_photo(root / "val7" / f"{CLASS_OF[name]:03d}", name, rgb))
    results = {"evaluator": evaluate_in_process(prefix, str(root))}

    seven = sorted(CLASS_OF.values())
    restricted = restricted_checkpoint(prefix, str(base / "lite0_7"), seven)
    _tool(os.path.join(ROOT, "tools", "eval.py"), "-c", CONFIG, "-o", f"model.weights={restricted}",
          "model.num_classes=7", f"data.root={root}", "data.val_split=val7", f"global.output_dir={base / 'eval'}",
          *CPU, "--report", base / "eval.json")
    results["eval_cli"] = json.loads((base / "eval.json").read_text())

    (base / "photos.txt").write_text("\n".join(listing) + "\n")
    _tool(os.path.join(ROOT, "tools", "infer.py"), "-c", CONFIG, "-o", f"model.weights={prefix}", *CPU,
          "--image", base / "photos.txt", "--top-k", 1, "--output", base / "infer.csv")
    with open(base / "infer.csv", newline="", encoding="utf-8") as f:
        results["tools/infer.py"] = {_photo_of(r["image"]): (int(r["class_id"]), float(r["score"]))
                                     for r in csv.DictReader(f)}

    names = imagenet_like_names()
    (base / "names.txt").write_text("\n".join(names) + "\n")
    export_dir = base / "export"
    _tool(os.path.join(ROOT, "tools", "export_model.py"), "-c", CONFIG, "-o", f"model.weights={prefix}",
          f"data.root={root}", f"global.output_dir={base / 'out'}", *CPU, "--output-dir", export_dir,
          "--labels", base / "names.txt", "--report", base / "export.json")
    results["export"] = json.loads((base / "export.json").read_text())
    results["inference.yml"] = yaml.safe_load((export_dir / "inference.yml").read_text())

    proc = _without_ppdlx(RUN_CLI, base, INFER=DEPLOY_INFER, ARGS=["--model-dir", str(export_dir), "--input",
                                                                  str(root / "val7"), "--topk", "1",
                                                                  "--batch-size", "7"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    deployed = {}
    for line in proc.stdout.splitlines():
        path, label, index, score = re.fullmatch(r"(.+): (.+) \(id (\d+)\) ([0-9.]+)", line).groups()
        assert label == names[int(index)]
        deployed[_photo_of(path)] = (int(index), float(score))
    results["deploy/python/infer.py"] = deployed
    return results


def test_eval_cli_scores_every_photo_on_its_class(routes):
    report = routes["eval_cli"]
    assert (report["images"], report["top1"], report["top5"]) == (7, 1.0, 1.0)


def test_export_carries_the_weights_preprocessing(routes):
    meta = routes["inference.yml"]
    assert meta["preprocess"] == {"type": "resize_short_center_crop", "resize_short": 256, "crop_size": 224,
                                  "interpolation": "bicubic", "mean": [127.0] * 3, "std": [128.0] * 3,
                                  "color": "RGB"}
    assert meta["model"]["num_classes"] == 1000 and len(meta["labels"]) == 1000
    assert max(routes["export"]["checks"].values()) < 1e-4


@pytest.mark.parametrize("route", ["evaluator", "tools/infer.py", "deploy/python/infer.py"])
def test_route_puts_each_photo_top1_on_its_imagenet_class(routes, route):
    predicted = routes[route]
    assert sorted(predicted) == sorted(EXPECTED)
    for photo, (index, score) in predicted.items():
        assert index in expected_indices(photo), (route, photo, index, score)
        assert score > 0.2, (route, photo, score)


def test_routes_agree_on_top1_and_score(routes):
    reference = routes["evaluator"]
    for route, atol in SCORE_ATOL.items():
        for photo, (index, score) in routes[route].items():
            assert index == reference[photo][0], (route, photo)
            assert abs(score - reference[photo][1]) <= atol, (route, photo, score, reference[photo][1])
    spreads = {r: max(abs(routes[r][p][1] - reference[p][1]) for p in reference) for r in SCORE_ATOL}
    print("top-1 per photo (evaluator):", {p: (i, round(s, 4)) for p, (i, s) in reference.items()},
          "largest score difference from the evaluator:", {r: f"{d:.1e}" for r, d in spreads.items()})
