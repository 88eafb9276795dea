"""ppdlx.analysis wired into training and evaluation: the start-of-training data check (one line per split,
exit 2 in one line when the data cannot train), curves.png and the final analysis at the end of a run,
and ``tools/eval.py --analysis`` (classification: scikit-learn's numbers on the same predictions;
detection: pycocotools' per-category AP)."""
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import paddle
import pytest

from ppdlx.config import load_config
from tests.engine.test_training import tiny_overrides

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml")
DET_DEMO = os.path.join(ROOT, "configs", "demo", "efficientdet_demo.yaml")


def tool(name, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "tools", name), "-c", DEMO, *args],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)


@pytest.fixture(scope="module")
def trained(tiny_tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("wired") / "run"
    report = out.parent / "train.json"
    proc = tool("train.py", "--report", str(report), "-o", *tiny_overrides(tiny_tree, out, "train.epochs=1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc, json.loads(report.read_text())


def test_training_checks_the_data_and_writes_curves_and_the_final_analysis(trained, tiny_tree):
    out, proc, report = trained
    pytest.importorskip("matplotlib")
    assert f"data: train 64 images, 4 classes (16..16 each, imbalance 1.00) in {tiny_tree}/train" in proc.stdout
    assert f"data: val 16 images, 4 classes (4..4 each, imbalance 1.00) in {tiny_tree}/val" in proc.stdout
    assert os.path.getsize(out / "curves.png") > 10_000
    analysis = report["analysis"]
    assert sorted(analysis["files"]) == ["analysis.md", "confusion.png", "errors.png"]
    assert os.path.isfile(out / "analysis" / "confusion.png")
    assert sum(c["support"] for c in analysis["per_class"].values()) == 16
    assert abs(analysis["accuracy"] - report["top1"]) < 1e-9  # the final evaluation's own predictions


def test_a_class_without_images_stops_training_in_one_line(tiny_tree, tmp_path):
    root = tmp_path / "digits"
    shutil.copytree(tiny_tree, root)
    for split in ("train", "val"):
        os.makedirs(root / split / "zz_empty")
    proc = tool("train.py", "-o", *tiny_overrides(root, tmp_path / "out", "train.epochs=1", "model.num_classes=5"))
    assert proc.returncode == 2, proc.stdout[-2000:]
    # the val folder too: a val class without images would leave the class out of the accuracy
    fix = "add images to that folder or remove it from every split (class indices follow the sorted folder names)"
    assert proc.stderr.strip().splitlines()[-1] == (f"error: {root}/train: 1 class without images ('zz_empty'); {fix}; "
                                                    f"{root}/val: 1 class without images ('zz_empty'); {fix}")
    assert "Traceback" not in proc.stderr and proc.stderr.count("error:") == 1


def _predictions(cfg):
    """Every val image's logits and label, computed here, independently of the evaluator."""
    from ppdlx.data.loader import build_classification_loader
    from ppdlx.models.from_config import build_model
    from ppdlx.checkpoint import load_weights
    from ppdlx.tasks.preprocess import resolve_preprocessing
    cfg = resolve_preprocessing(cfg)  # as evaluate() reads it
    model = build_model(cfg)
    load_weights(model, cfg.model.weights)
    model.eval()
    logits, labels = [], []
    with paddle.no_grad():
        for images, y in build_classification_loader(cfg, "val", batch_size=5):
            logits.append(model(images).numpy())
            labels.append(y.numpy().reshape(-1))
    return np.concatenate(labels), np.concatenate(logits)


def test_eval_analysis_per_class_numbers_equal_scikit_learn(trained, tiny_tree, tmp_path):
    metrics = pytest.importorskip("sklearn.metrics")
    pytest.importorskip("matplotlib")
    out, _, _ = trained
    overrides = tiny_overrides(tiny_tree, tmp_path / "eval", f"model.weights={out}/latest")
    proc = tool("eval.py", "--analysis", str(tmp_path / "an"), "--report", str(tmp_path / "r.json"), "-o", *overrides)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "r.json").read_text())["analysis"]
    assert os.path.getsize(tmp_path / "an" / "confusion.png") > 5_000
    markdown = (tmp_path / "an" / "analysis.md").read_text()

    labels, logits = _predictions(load_config(DEMO, overrides))
    preds = logits.argmax(1)
    precision, recall, f1, support = metrics.precision_recall_fscore_support(labels, preds, labels=range(4),
                                                                             zero_division=0)
    names = sorted(os.listdir(os.path.join(tiny_tree, "val")))
    for k, name in enumerate(names):
        row = result["per_class"][name]
        assert (row["precision"], row["recall"], row["f1"], row["support"]) == pytest.approx(
            (precision[k], recall[k], f1[k], support[k]), abs=1e-6)
        assert name in markdown
    assert np.array_equal(np.asarray(result["confusion_matrix"]), metrics.confusion_matrix(labels, preds))
    # paths aligned with the predictions: every named error is an image of its true class
    for error in result["most_confident_errors"]:
        assert os.path.basename(os.path.dirname(error["path"])) == error["true"]


def test_eval_analysis_of_a_detector_has_pycocotools_per_category_ap(short_detector_run, tmp_path):
    """The evaluation's per-category analysis (``evaluate(cfg, analysis_dir)``, what tools/eval.py --analysis
    runs) of the session's short detector run (conftest ``short_detector_run``)."""
    pytest.importorskip("matplotlib")
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    from ppdlx.engine.run import evaluate
    root, run = short_detector_run["root"], short_detector_run["run"]
    ev_dir = str(tmp_path / "ev")
    report = evaluate(load_config(DET_DEMO, short_detector_run["overrides"] + [f"global.output_dir={ev_dir}",
                                                                               f"model.weights={run}/latest"]),
                      str(tmp_path / "an"))
    per_category = report["analysis"]["per_category"]
    assert sorted(per_category) == ["circle", "square", "triangle"]
    assert os.path.isfile(tmp_path / "an" / "pr_curves.png") and os.path.isfile(tmp_path / "an" / "analysis.md")

    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(os.path.join(root, "annotations", "instances_val.json"))
        dt = gt.loadRes(os.path.join(ev_dir, "detections_val.json"))
        for cat in gt.loadCats(gt.getCatIds()):
            ev = COCOeval(gt, dt, iouType="bbox")
            ev.params.catIds = [cat["id"]]
            ev.evaluate()
            ev.accumulate()
            ev.summarize()
            assert per_category[cat["name"]]["AP"] == pytest.approx(ev.stats[0], abs=1e-9)
            assert per_category[cat["name"]]["AP50"] == pytest.approx(ev.stats[1], abs=1e-9)
    assert any(per_category[name]["AP"] > 0 for name in per_category)


def save_far_box_detector(tmp):
    """Synthetic shapes in ``tmp`` and an EfficientDet-D0 whose heads answer like an under-trained one can:
    every anchor scores 'circle' at sigmoid(3) with a box exp(25) times its anchor (~1e12 px across); weights
    in a checkpoint file. Returns ``{"root", "base" (overrides), "weights"}``."""
    from ppdlx.data.synthetic_coco import make_synthetic_coco
    from ppdlx.tasks import task_of
    root = str(tmp / "shapes")
    make_synthetic_coco(root, num_train=8, num_val=4, seed=1, size_range=(56, 80), max_objects=2)
    base = [f"data.root={root}", "data.workers=0", "data.batch_size=4", "eval.batch_size=4",
            "detection.pre_nms_top_k=300", "detection.precise_bn_batches=0"]
    cfg = load_config(DET_DEMO, base)
    paddle.seed(0)
    model = task_of(cfg).build_model(cfg, 3)
    state = model.state_dict()
    for head, bias in (("class_net", np.tile([3.0, -10.0, -10.0], 9)), ("box_net", np.tile([0.0, 0.0, 25.0, 25.0], 9))):
        state[f"{head}.predict.pointwise.weight"].set_value(np.zeros(state[f"{head}.predict.pointwise.weight"].shape,
                                                                     np.float32))
        state[f"{head}.predict.pointwise.bias"].set_value(bias.astype(np.float32))
    paddle.save(model.state_dict(), str(tmp / "far.pdparams"))
    return {"root": root, "base": base, "weights": str(tmp / "far")}


@pytest.fixture(scope="module")
def far_box_detector(tmp_path_factory):
    return save_far_box_detector(tmp_path_factory.mktemp("far_boxes"))


def _det_tool(name, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "tools", name), "-c", DET_DEMO, *args],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)


def _boxes_on_their_images(root, detections_json):
    with open(os.path.join(root, "annotations", "instances_val.json"), encoding="utf-8") as f:
        sizes = {im["id"]: (im["width"], im["height"]) for im in json.load(f)["images"]}
    with open(detections_json, encoding="utf-8") as f:
        detections = json.load(f)
    assert len(detections) >= len(sizes)
    for d in detections:
        x, y, w, h = d["bbox"]
        width, height = sizes[d["image_id"]]
        assert 0 <= x <= x + w <= width and 0 <= y <= y + h <= height, (d, width, height)
    # the confident far boxes became their whole image
    assert {d["image_id"]: d["bbox"] for d in detections if d["score"] > 0.9} == {
        i: [0.0, 0.0, float(w), float(h)] for i, (w, h) in sizes.items()}


def test_far_boxes_of_an_under_trained_detector_end_training_and_eval_with_exit_0(far_box_detector, tmp_path):
    """The audit's journey: training ended with a matplotlib traceback and exit code 1 after a successful run
    (labels drawn at +-1e11 px), with no analysis.md, and tools/eval.py --analysis failed the same way. The
    detections are now clipped to their images and the figures drawn."""
    pytest.importorskip("matplotlib")
    det = far_box_detector
    run = tmp_path / "run"
    proc = _det_tool("train.py", "-o", *det["base"], f"global.output_dir={run}", f"model.weights={det['weights']}",
                     "train.epochs=1", "eval.interval=1", "lr.base_lr=1e-9", "lr.warmup_epochs=0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "not drawn" not in proc.stderr
    assert sorted(os.listdir(run / "analysis")) == ["analysis.md", "detections.png", "pr_curves.png"]
    _boxes_on_their_images(det["root"], run / "detections_val.json")

    ev_dir, analysis = tmp_path / "ev", tmp_path / "an"
    proc = _det_tool("eval.py", "-o", *det["base"], f"global.output_dir={ev_dir}", f"model.weights={det['weights']}",
                     "--analysis", str(analysis))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"analysis: {analysis / 'pr_curves.png'}, {analysis / 'detections.png'}, {analysis / 'analysis.md'}" \
        in proc.stdout
    _boxes_on_their_images(det["root"], ev_dir / "detections_val.json")
