"""COCO evaluation: our path (arrays -> results JSON -> COCOeval) equals pycocotools run directly;
sharded evaluation counts every image once."""
import contextlib
import io
import json

import numpy as np
import paddle
import pytest

from ppdlx.data.coco import coco_from_dict
from ppdlx.evaluation.coco import STAT_KEYS, coco_evaluate, detections_to_coco, merge_shards
from ppdlx.evaluation.precise_bn import recompute_bn_stats
from ppdlx.models.qat import activation_quanters, quantize_model

CATS = [{"id": 2, "name": "a"}, {"id": 5, "name": "b"}, {"id": 9, "name": "c"}]


def _gt():
    """3 images, 3 categories (ids 2, 5, 9), one crowd box, boxes of every COCO area range."""
    images = [{"id": i, "file_name": f"{i}.jpg", "width": 640, "height": 480} for i in (11, 12, 13)]
    anns = []

    def add(img, cat, box, crowd=0):
        anns.append({"id": len(anns) + 1, "image_id": img, "category_id": cat, "bbox": box,
                     "area": float(box[2] * box[3]), "iscrowd": crowd})
    add(11, 2, [10, 20, 100, 80])
    add(11, 5, [300, 200, 20, 25])        # small
    add(11, 9, [50, 300, 300, 150])       # large
    add(12, 2, [0, 0, 60, 60])
    add(12, 2, [200, 100, 70, 90])
    add(12, 9, [400, 300, 100, 100], crowd=1)
    add(13, 5, [100, 100, 200, 200])
    return {"images": images, "annotations": anns, "categories": CATS}


# network-side detections: class indices 0..2 (= ids 2, 5, 9), x1y1x2y2 original pixels
_DETS = {
    11: [(0, [12, 18, 108, 102], 0.9), (1, [302, 201, 321, 224], 0.8), (2, [60, 290, 340, 455], 0.7),
         (0, [300, 200, 320, 225], 0.3), (2, [0, 0, 50, 50], 0.2)],
    12: [(0, [1, 2, 58, 61], 0.95), (0, [210, 115, 270, 185], 0.6), (2, [405, 305, 495, 395], 0.5),
         (1, [0, 0, 60, 60], 0.4)],
    13: [(1, [90, 110, 310, 290], 0.85), (1, [100, 100, 150, 150], 0.1)],
}


def _arrays(ids, d=100):
    n = len(ids)
    boxes = np.zeros((n, d, 4), np.float32)
    scores = np.zeros((n, d), np.float32)
    classes = np.full((n, d), -1, np.int64)
    counts = np.zeros(n, np.int32)
    for i, image_id in enumerate(ids):
        for j, (c, b, s) in enumerate(_DETS[image_id]):
            boxes[i, j], scores[i, j], classes[i, j] = b, s, c
        counts[i] = len(_DETS[image_id])
    return boxes, scores, classes, counts


def _pycocotools_direct(gt, image_ids):
    """The reference: hand-written COCO results + COCOeval, no ppdlx code involved."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval
    ids = [c["id"] for c in CATS]
    results = [{"image_id": im, "category_id": ids[c], "bbox": [b[0], b[1], b[2] - b[0], b[3] - b[1]], "score": s}
               for im in image_ids for c, b, s in _DETS[im]]
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO()
        coco.dataset = json.loads(json.dumps(gt))
        coco.createIndex()
        ev = COCOeval(coco, coco.loadRes(results), "bbox")
        ev.params.imgIds = sorted(image_ids)
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return ev.stats


def test_ap_equals_pycocotools_run_directly(tmp_path):
    gt = _gt()
    ids = [11, 12, 13]
    dets = detections_to_coco(np.asarray(ids), *_arrays(ids), cat_ids=[2, 5, 9])
    assert len(dets) == 11
    # class index -> the dataset's category id, x1y1x2y2 -> xywh
    first = dets[0]
    assert first["image_id"] == 11 and first["category_id"] == 2 and first["bbox"] == [12, 18, 96, 84]
    assert {d["category_id"] for d in dets} == {2, 5, 9}
    path = tmp_path / "results.json"
    path.write_text(json.dumps(dets))
    ours = coco_evaluate(coco_from_dict(gt), json.loads(path.read_text()), ids)
    ref = _pycocotools_direct(gt, ids)
    assert list(ours) == list(STAT_KEYS)
    np.testing.assert_allclose([ours[k] for k in STAT_KEYS], ref, rtol=0, atol=1e-12)
    assert 0.3 < ours["AP"] < 0.9 and ours["AP50"] > ours["AP75"]  # a non-trivial score
    # restricted to a subset of images, as a shard would evaluate
    sub = coco_evaluate(coco_from_dict(gt), [d for d in dets if d["image_id"] != 12], [11, 13])
    np.testing.assert_allclose([sub[k] for k in STAT_KEYS], _pycocotools_direct(gt, [11, 13]), atol=1e-12)


def test_perfect_detections_score_one():
    gt = _gt()
    dets = [{"image_id": a["image_id"], "category_id": a["category_id"], "bbox": a["bbox"], "score": 1.0}
            for a in gt["annotations"] if not a["iscrowd"]]
    m = coco_evaluate(coco_from_dict(gt), dets, [11, 12, 13])
    assert m["AP"] == pytest.approx(1.0) and m["AP50"] == pytest.approx(1.0)


def test_no_detections_gives_zero_not_a_crash():
    assert coco_evaluate(coco_from_dict(_gt()), [], [11, 12])["AP"] == 0.0


def test_merge_shards_counts_every_image_once():
    gt = _gt()
    ids = [11, 12, 13]
    all_dets = detections_to_coco(np.asarray(ids), *_arrays(ids), cat_ids=[2, 5, 9])
    by_image = lambda keep: [d for d in all_dets if d["image_id"] in keep]  # noqa: E731
    # rank 0 evaluated 11 and 13, rank 1 evaluated 12 and (a padded repeat of) 13
    merged, merged_ids = merge_shards([(by_image({11, 13}), [11, 13]), (by_image({12, 13}), [12, 13])])
    assert merged_ids == [11, 12, 13]
    assert len(merged) == len(all_dets)
    single = coco_evaluate(coco_from_dict(gt), all_dets, ids)
    sharded = coco_evaluate(coco_from_dict(gt), merged, merged_ids)
    assert [single[k] for k in STAT_KEYS] == [sharded[k] for k in STAT_KEYS]


def test_precise_bn_sets_running_stats_to_the_average_batch_stats():
    import paddle
    from ppdlx.evaluation.precise_bn import recompute_bn_stats
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Conv2D(3, 4, 1), paddle.nn.BatchNorm2D(4, momentum=0.99))
    batches = [(paddle.randn([5, 3, 4, 4]) * (i + 1) + i,) for i in range(3)]
    model.eval()
    assert recompute_bn_stats(model, batches, 2) == 2
    assert not model.training and model[1]._momentum == 0.99
    with paddle.no_grad():
        feats = [model[0](b[0]).numpy() for b in batches[:2]]
    mean = np.mean([f.mean(axis=(0, 2, 3)) for f in feats], axis=0)
    np.testing.assert_allclose(model[1]._mean.numpy(), mean, rtol=1e-4, atol=1e-5)
    var = np.mean([f.var(axis=(0, 2, 3)) for f in feats], axis=0)
    np.testing.assert_allclose(model[1]._variance.numpy(), var, rtol=0.1)  # biased or unbiased estimate


def test_precise_bn_of_a_qat_model_keeps_its_activation_ranges():
    """Only BatchNorm trains during precise BN: a quantization-aware model's activation ranges stay the trained
    ones (before: its quanters ran in training mode and moved every range towards the precise-BN batches', so an
    evaluation changed the model it scored), and the statistics are those of the fake-quantized forward."""
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Conv2D(3, 4, 1), paddle.nn.BatchNorm2D(4), paddle.nn.Conv2D(4, 4, 1))
    quantize_model(model)
    with paddle.no_grad():
        model.train()
        model(paddle.randn([5, 3, 4, 4]))  # trained ranges: those of N(0, 1) inputs
    model.eval()
    ranges = [q.scales().numpy().copy() for _, q in activation_quanters(model)]
    batches = [(paddle.randn([5, 3, 4, 4]) * 10,) for _ in range(2)]  # ten times wider than the trained range
    assert recompute_bn_stats(model, batches, 2) == 2
    assert [q.scales().numpy().tolist() for _, q in activation_quanters(model)] == [r.tolist() for r in ranges]
    assert not model.training
    with paddle.no_grad():
        feats = [model[0](b[0]).numpy() for b in batches]  # eval: the input clipped to the trained range
    mean = np.mean([f.mean(axis=(0, 2, 3)) for f in feats], axis=0)
    np.testing.assert_allclose(model[1]._mean.numpy(), mean, rtol=1e-4, atol=1e-5)


class _FarBoxHead(paddle.nn.Layer):
    """A detector head as an under-trained one can be: every anchor scores class 0 (index) at sigmoid(3)
    and decodes to a box exp(25) x its anchor, ~1e12 px across (64 px input, levels 3-7, 9 anchors)."""

    def forward(self, images):
        n = images.shape[0]
        cls, box = [], []
        for s in (8, 4, 2, 1, 1):
            logits = np.full((n, 9, 3, s, s), -10.0, np.float32)
            logits[:, :, 0] = 3.0
            deltas = np.zeros((n, 9, 4, s, s), np.float32)
            deltas[:, :, 2:] = 25.0
            cls.append(paddle.to_tensor(logits.reshape(n, 27, s, s)))
            box.append(paddle.to_tensor(deltas.reshape(n, 36, s, s)))
        return cls, box


@pytest.mark.parametrize("nms", ["soft", "hard"])
def test_evaluator_clips_far_boxes_to_each_image(nms):
    """The evaluator's detections (detections_val.json, pycocotools' input) lie on their image: the
    post-processing clips to the 64 px input (x image_scale 10 = 640 x 640 original pixels, the padding
    included) and the conversion to COCO to the image's own 640 x 480."""
    from ppdlx.evaluation.coco import CocoEvaluator
    from ppdlx.models.detection.det_postprocess import EfficientDetPostProcess
    coco_gt = coco_from_dict(_gt())
    batch = (paddle.zeros([2, 3, 64, 64]), None, None, np.asarray([11, 13]), paddle.to_tensor([10.0, 10.0]))
    evaluator = CocoEvaluator([batch], EfficientDetPostProcess(num_classes=3, image_size=64, pre_nms_top_k=50),
                              coco_gt, cat_ids=[2, 5, 9], nms=nms)
    detections, image_ids = evaluator.predict(_FarBoxHead())
    assert image_ids == [11, 13] and detections
    assert {(d["image_id"], d["category_id"]) for d in detections} == {(11, 2), (13, 2)}
    for d in detections:
        assert d["bbox"] == [0.0, 0.0, 640.0, 480.0], d
    metrics = evaluator(_FarBoxHead())
    assert metrics["detections"] == len(detections) and 0.0 <= metrics["AP"] <= 1.0


def test_detections_to_coco_clips_to_the_given_image_sizes():
    boxes = np.asarray([[[-5.0, -7.0, 700.0, 300.0], [600.0, 470.0, 650.0, 500.0]]], np.float32)
    dets = detections_to_coco(np.asarray([11]), boxes, np.asarray([[0.9, 0.8]]), np.asarray([[0, 2]]),
                              np.asarray([2]), cat_ids=[2, 5, 9], image_sizes={11: (640, 480)})
    assert [d["bbox"] for d in dets] == [[0.0, 0.0, 640.0, 300.0], [600.0, 470.0, 40.0, 10.0]]
    unclipped = detections_to_coco(np.asarray([11]), boxes, np.asarray([[0.9, 0.8]]), np.asarray([[0, 2]]),
                                   np.asarray([2]), cat_ids=[2, 5, 9])
    assert unclipped[0]["bbox"] == [-5.0, -7.0, 705.0, 307.0]


def test_clip_to_image_keeps_the_dtype_and_flags_boxes_left_without_area():
    from ppdlx.evaluation.coco import clip_to_image
    boxes = np.asarray([[-2.5, 1.0, 70.25, 20.0], [3.0, 33.0, 9.0, 40.0], [5.0, 5.0, 5.0, 9.0]], np.float64)
    clipped, has_area = clip_to_image(boxes, 64, 32)
    assert clipped.dtype == np.float64 and clipped.tolist() == [[0, 1, 64, 20], [3, 32, 9, 32], [5, 5, 5, 9]]
    assert has_area.tolist() == [True, False, False]
