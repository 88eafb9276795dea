"""Per-category detection analysis against pycocotools itself, on the synthetic COCO shapes (val split) with
seeded imperfect predictions (dropped, shifted, mislabelled boxes and false positives), and the error ranking
of detections.png on planted mistakes."""
import contextlib
import io
import json
import os

import numpy as np
import pytest
from PIL import Image
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from ppdlx.analysis import detection_analysis, per_category_ap
from ppdlx.analysis.detection import image_errors, pr_curves
from ppdlx.data.synthetic_coco import make_synthetic_coco


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("shapes"))
    paths = make_synthetic_coco(root, num_train=1, num_val=24)
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(paths["val"])
    return {"gt": gt, "image_dir": os.path.join(root, "val")}


def evaluated(gt, detections, cat_ids=None):
    with contextlib.redirect_stdout(io.StringIO()):
        ev = COCOeval(gt, gt.loadRes(detections), iouType="bbox")
        if cat_ids is not None:
            ev.params.catIds = cat_ids
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return ev


def noisy_detections(gt, seed=0):
    rng = np.random.default_rng(seed)
    cats = sorted(gt.getCatIds())
    out = []
    for ann in gt.loadAnns(gt.getAnnIds()):
        if rng.uniform() < 0.15:
            continue  # missed
        x, y, w, h = ann["bbox"]
        shift = rng.normal(0.0, 0.12, 4) * [w, h, w, h]
        others = [c for c in cats if c != ann["category_id"]]
        cat = ann["category_id"] if rng.uniform() > 0.1 else int(rng.choice(others))
        out.append({"image_id": ann["image_id"], "category_id": cat, "score": float(rng.uniform(0.3, 1.0)),
                    "bbox": [x + shift[0], y + shift[1], max(2.0, w + shift[2]), max(2.0, h + shift[3])]})
    for image_id in gt.getImgIds():
        info = gt.imgs[image_id]
        if rng.uniform() < 0.5:
            out.append({"image_id": image_id, "category_id": int(rng.choice(cats)), "score": float(rng.uniform(0, 0.6)),
                        "bbox": [float(rng.uniform(0, info["width"] / 2)), float(rng.uniform(0, info["height"] / 2)),
                                 info["width"] / 4, info["height"] / 4]})
    return out


def test_per_category_ap_equals_pycocotools_per_category(shapes):
    gt = shapes["gt"]
    ev = evaluated(gt, noisy_detections(gt))
    rows = per_category_ap(ev)
    assert [r["category_id"] for r in rows] == [1, 3, 7]
    assert [r["name"] for r in rows] == ["circle", "square", "triangle"]
    for row in rows:
        alone = evaluated(gt, noisy_detections(gt), cat_ids=[row["category_id"]]).stats
        assert (row["AP"], row["AP50"], row["AP75"], row["AR100"]) == pytest.approx(
            (alone[0], alone[1], alone[2], alone[8]), abs=1e-12)
        assert (row["APs"], row["APm"], row["APl"]) == pytest.approx((alone[3], alone[4], alone[5]), abs=1e-12)
        assert row["gt"] == len(gt.getAnnIds(catIds=[row["category_id"]]))
        assert 0.0 < row["AP"] < 1.0
    assert np.mean([r["AP"] for r in rows]) == pytest.approx(ev.stats[0], abs=1e-12)
    curves = pr_curves(ev)
    precision = ev.eval["precision"]
    for k, curve in enumerate(curves["curves"]):
        expected = np.where(precision[0, :, k, 0, 2] > -1, precision[0, :, k, 0, 2], np.nan)
        np.testing.assert_array_equal(curve["iou 0.50"], expected)
    np.testing.assert_array_equal(curves["recall"], np.linspace(0, 1, 101))


def test_images_with_most_errors_and_figures(shapes, tmp_path):
    gt = shapes["gt"]
    ids = sorted(gt.getImgIds())
    two_boxes = next(i for i in ids if len(gt.getAnnIds(imgIds=[i])) == 2)
    with_false = next(i for i in ids if i != two_boxes)
    detections = [{"image_id": a["image_id"], "category_id": a["category_id"], "bbox": a["bbox"], "score": 0.9}
                  for a in gt.loadAnns(gt.getAnnIds()) if a["image_id"] != two_boxes]
    # three confident boxes matching nothing, one below the score threshold (not an error at 0.3)
    detections += [{"image_id": with_false, "category_id": 1, "bbox": [1.0 + 6 * j, 1.0, 3.0, 3.0], "score": 0.8}
                   for j in range(3)]
    detections.append({"image_id": with_false, "category_id": 1, "bbox": [30.0, 1.0, 3.0, 3.0], "score": 0.1})
    ev = evaluated(gt, detections)
    errors = image_errors(ev, score_threshold=0.3)
    assert errors == {i: {two_boxes: 2, with_false: 3}.get(i, 0) for i in ids}

    pytest.importorskip("matplotlib")
    result = detection_analysis(ev, str(tmp_path), image_dir=shapes["image_dir"], max_images=4)
    assert [s["image_id"] for s in result["images_shown"][:2]] == [with_false, two_boxes]
    assert [s["errors_at_iou_0.5"] for s in result["images_shown"]] == [3, 2, 0, 0]
    assert result["stats"]["AP"] == pytest.approx(ev.stats[0], abs=1e-12)
    assert sorted(result["files"]) == ["analysis.md", "detections.png", "pr_curves.png"]
    assert json.loads(json.dumps(result)) == result  # the eval --report content
    md = (tmp_path / "analysis.md").read_text()
    circle = result["per_category"]["circle"]
    assert f"| circle | 1 | {circle['AP']:.4f} | {circle['AP50']:.4f} |" in md
    with Image.open(tmp_path / "pr_curves.png") as img:
        assert img.size == (3 * 320, 50 + 260)  # 3 categories in one row
        assert np.asarray(img.convert("L"), np.float32).var() > 100.0
    with Image.open(tmp_path / "detections.png") as img:
        assert img.size == (4 * 260, 60 + 2 * 260)  # 4 images: 2 (truth, prediction) pairs per row, 60 px title
        assert np.asarray(img.convert("L"), np.float32).var() > 100.0


def test_needs_an_accumulated_evaluation(shapes):
    ev = COCOeval(shapes["gt"], shapes["gt"].loadRes([{"image_id": 1, "category_id": 1, "bbox": [0, 0, 5, 5],
                                                       "score": 0.5}]), iouType="bbox")
    with pytest.raises(ValueError, match=r"call evaluate\(\) and accumulate\(\) first"):
        per_category_ap(ev)


def far_box_detections(gt):
    """What an under-trained detector wrote to detections_val.json before boxes were clipped: boxes around
    +-1e11 px (one per image, confident) beside a small box on each image."""
    out = []
    for image_id in sorted(gt.getImgIds()):
        out.append({"image_id": image_id, "category_id": 1, "score": 0.9, "bbox": [-1.3e11, -0.7e11, 2.9e11, 1.5e11]})
        out.append({"image_id": image_id, "category_id": 3, "score": 0.8, "bbox": [3.0, 4.0, 10.0, 12.0]})
    return out


def test_boxes_far_outside_the_image_are_drawn_cut_to_it(shapes):
    """draw_boxes cuts each box to the image the axes show and puts its label inside the axes (the label at
    -1e11 px overflowed FreeType's rasteriser: 'FT_Render_Glyph ... raster overflow')."""
    pytest.importorskip("matplotlib")
    from ppdlx.analysis.figures import draw_boxes, new_figure, show_image
    fig = new_figure(200, 150)
    ax = fig.subplots()
    show_image(ax, np.zeros((30, 40, 3), np.uint8))  # pixel edges at -0.5 .. 39.5 x -0.5 .. 29.5
    draw_boxes(ax, [[-1.3e11, -0.7e11, 2.9e11, 1.5e11], [3.0, 4.0, 10.0, 12.0], [50.0, 5.0, 5.0, 5.0],
                    [float("inf"), 0.0, 5.0, 5.0]], ["far", "small", "outside", "inf"], [(1, 0, 0)] * 4,
               scores=[0.9, 0.8, 0.7, 0.6])
    rects = [tuple(p.get_extents().bounds) for c in ax.collections for p in c.get_paths()]
    assert rects == [(-0.5, -0.5, 40.0, 30.0), (3.0, 4.0, 10.0, 12.0)]  # wholly outside / not finite: not drawn
    labels = {t.get_text(): t.get_position() for t in ax.texts}
    assert labels == {"far 0.90": (-0.5, -0.5), "small 0.80": (3.0, 4.0)}
    assert [t.get_va() for t in ax.texts] == ["top", "top"]  # no room above either box: inside its top edge
    fig.canvas.draw()  # renders the labels


def test_an_image_with_a_thousand_boxes_outlines_all_and_labels_the_largest(shapes):
    """Before: a text per box; tools/check_data.py on an image set with 1,000 boxes per image spent minutes drawing
    data_samples.png (100,000 annotations: not finished after 240 s)."""
    pytest.importorskip("matplotlib")
    from ppdlx.analysis.figures import MAX_BOX_LABELS, draw_boxes, new_figure, show_image
    fig = new_figure(200, 150)
    ax = fig.subplots()
    show_image(ax, np.zeros((100, 100, 3), np.uint8))
    boxes = [[i % 90, (i // 90) % 90, 1 + i % 10, 1 + i % 7] for i in range(1000)]
    assert draw_boxes(ax, boxes, [f"b{i}" for i in range(1000)], [(0, 0, 1)] * 1000) == MAX_BOX_LABELS == 25
    assert sum(len(c.get_paths()) for c in ax.collections) == 1000 and len(ax.texts) == 25
    area = {f"b{i}": w * h for i, (_, _, w, h) in enumerate(boxes)}
    labelled = {t.get_text() for t in ax.texts}
    assert min(area[n] for n in labelled) >= max(a for n, a in area.items() if n not in labelled)


def test_analysis_of_far_boxes_writes_its_report_and_figures(shapes, tmp_path):
    pytest.importorskip("matplotlib")
    gt = shapes["gt"]
    ev = evaluated(gt, far_box_detections(gt))
    result = detection_analysis(ev, str(tmp_path), image_dir=shapes["image_dir"], max_images=4)
    assert sorted(result["files"]) == ["analysis.md", "detections.png", "pr_curves.png"]
    assert "figures_skipped" not in result
    assert result["per_category"]["circle"]["detections"] == 24 and result["per_category"]["circle"]["AP"] == 0.0
    md = (tmp_path / "analysis.md").read_text()
    assert "![detections.png](detections.png)" in md and "not drawn" not in md
    with Image.open(tmp_path / "detections.png") as img:
        assert img.size == (4 * 260, 60 + 2 * 260)


def test_a_figure_that_cannot_be_drawn_is_skipped_with_one_warning(shapes, tmp_path, ppdlx_caplog):
    """Whatever fails while a figure is drawn or saved (here: a directory stands where detections.png goes)
    leaves that figure out with one warning naming it and the error; the other figure and analysis.md
    are still written and the caller gets its result, not the exception."""
    pytest.importorskip("matplotlib")
    gt = shapes["gt"]
    ev = evaluated(gt, noisy_detections(gt))
    os.makedirs(tmp_path / "detections.png")
    with ppdlx_caplog.at_level("WARNING", logger="ppdlx"):
        result = detection_analysis(ev, str(tmp_path), image_dir=shapes["image_dir"], max_images=4)
    assert sorted(result["files"]) == ["analysis.md", "pr_curves.png"]
    reason = result["figures_skipped"]["detections.png"]
    assert reason.startswith("IsADirectoryError: [Errno 21] Is a directory")
    warnings = [r.getMessage() for r in ppdlx_caplog.records if r.levelname == "WARNING"]
    assert warnings == [f"detections.png not drawn: {reason}"]
    md = (tmp_path / "analysis.md").read_text()
    assert f"`detections.png` not drawn: {reason}" in md and "![pr_curves.png](pr_curves.png)" in md
    assert "| circle | 1 |" in md and "![detections.png]" not in md
    assert sorted(os.listdir(tmp_path)) == ["analysis.md", "detections.png", "pr_curves.png"]  # no temporary file left
