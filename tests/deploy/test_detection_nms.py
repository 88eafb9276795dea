"""The deploy package's numpy NMS (run after a detection ONNX graph, which stops before NMS) keeps
exactly the boxes Paddle's multiclass_nms3 keeps in the exported program: same boxes, scores,
classes, order and count, including score ties, keep_top_k truncation, overlapping boxes of
different classes and boxes an untrained head decodes to infinity."""
import importlib

import numpy as np
import paddle
import pytest

from benchmarks.infer import load_deploy_module
from ppdlx.models.detection.nms import multiclass_hard_nms

load_deploy_module()
P = importlib.import_module("ppdlx_deploy.postprocess")


def candidates(seed: int, k: int = 300, num_classes: int = 4):
    rng = np.random.default_rng(seed)
    centre = rng.uniform(0, 64, (k, 2))
    size = rng.uniform(2, 30, (k, 2))
    boxes = np.concatenate([centre - size / 2, centre + size / 2], 1).astype(np.float32)
    boxes[rng.random(k) < 0.05] = np.inf                             # an untrained head overflows exp()
    scores = np.round(rng.uniform(0, 1, k) * 20) / 20                 # ties on purpose
    scores = np.sort(scores.astype(np.float32))[::-1].copy()          # top-k order, as the graph feeds NMS
    scores[-20:] = 0.0005                                             # below the score threshold
    classes = rng.integers(0, num_classes, k).astype(np.int64)
    return boxes, scores, classes


@pytest.mark.parametrize("seed,keep_top_k,iou", [(0, 100, 0.5), (1, 12, 0.5), (2, 100, 0.3), (3, 5, 0.7)])
def test_numpy_nms_keeps_what_paddles_multiclass_nms3_keeps(seed, keep_top_k, iou):
    boxes, scores, classes = candidates(seed)
    expected = [t.numpy() for t in multiclass_hard_nms(paddle.to_tensor(boxes[None]), paddle.to_tensor(scores[None]),
                                                       paddle.to_tensor(classes[None]), 4, iou, 0.001, keep_top_k)]
    got_boxes, got_scores, got_classes, got_count = P.multiclass_nms(boxes, scores, classes, 0.001, iou, keep_top_k)
    count = int(expected[3][0])
    assert got_count == count > 0
    assert got_classes.tolist() == expected[2][0].tolist()   # the order, ties included
    np.testing.assert_array_equal(got_scores, np.abs(expected[1][0]))  # the graph pads with -0.0
    np.testing.assert_array_equal(got_boxes[:count], expected[0][0][:count])
    assert np.all(got_classes[count:] == -1) and np.all(got_boxes[count:] == 0)


def test_onnx_candidates_are_completed_into_the_programs_outputs():
    """complete_outputs turns an ONNX graph's candidates into the Paddle program's four outputs,
    boxes scaled by the image_scale feed; a Paddle backend's outputs pass through unchanged."""
    boxes, scores, classes = candidates(7, k=50)
    boxes[~np.isfinite(boxes)] = 1.0
    meta = {"inputs": [{"name": "image", "role": "image"}, {"name": "image_scale", "role": "scale"}],
            "outputs": [{"name": "b", "role": "boxes"}, {"name": "s", "role": "scores"},
                        {"name": "c", "role": "classes"}, {"name": "n", "role": "count"}],
            "onnx": {"outputs": [{"name": "cb", "role": "candidate_boxes"}, {"name": "cs", "role": "candidate_scores"},
                                 {"name": "cc", "role": "candidate_classes"}],
                     "nms": {"score_threshold": 0.001, "iou_threshold": 0.5, "keep_top_k": 10}}}
    feeds = {"image_scale": np.asarray([2.0, 0.5], np.float32)}
    outputs = [np.stack([boxes, boxes]), np.stack([scores, scores]), np.stack([classes, classes])]
    done = P.complete_outputs(meta, "onnx", outputs, feeds)
    single = P.multiclass_nms(boxes, scores, classes, 0.001, 0.5, 10)
    assert [o.shape for o in done] == [(2, 10, 4), (2, 10), (2, 10), (2,)]
    np.testing.assert_array_equal(done[0][0], single[0] * 2.0)
    np.testing.assert_array_equal(done[0][1], single[0] * 0.5)
    assert done[3].tolist() == [single[3]] * 2 and done[3].dtype == np.int32
    assert P.complete_outputs(meta, "program", outputs, feeds) is outputs


def test_onnx_completion_clips_kept_boxes_to_the_input_as_the_program_does():
    """With ``clip_to_input_hw`` (written by exports whose program clips after NMS) the completed ONNX outputs
    equal the Paddle post-processing's: the same NMS on the unclipped candidates, then boxes clipped to the
    64 x 48 input and scaled; an export without the key keeps its unclipped boxes (its program does not clip)."""
    from ppdlx.models.detection.det_postprocess import EfficientDetPostProcess
    boxes, scores, classes = candidates(11, k=120)
    boxes[~np.isfinite(boxes)] = 1.0
    boxes = (boxes - 32.0) * 4.0  # a quarter of the coordinates beyond the input on either side
    nms = {"score_threshold": 0.001, "iou_threshold": 0.5, "keep_top_k": 20, "clip_to_input_hw": [48, 64]}
    meta = {"inputs": [{"name": "image", "role": "image"}, {"name": "image_scale", "role": "scale"}],
            "outputs": [{"name": "b", "role": "boxes"}, {"name": "s", "role": "scores"},
                        {"name": "c", "role": "classes"}, {"name": "n", "role": "count"}],
            "onnx": {"outputs": [{"name": "cb", "role": "candidate_boxes"}, {"name": "cs", "role": "candidate_scores"},
                                 {"name": "cc", "role": "candidate_classes"}], "nms": nms}}
    scales = np.asarray([3.0], np.float32)
    done = P.complete_outputs(meta, "onnx", [boxes[None], scores[None], classes[None]], {"image_scale": scales})
    pp = EfficientDetPostProcess(num_classes=4, image_size=(48, 64), iou_threshold=0.5, max_detections=20)
    kept_yxyx, kept_scores, kept_classes, count = multiclass_hard_nms(
        paddle.to_tensor(boxes[None][..., [1, 0, 3, 2]]), paddle.to_tensor(scores[None]),
        paddle.to_tensor(classes[None]), 4, 0.5, 0.001, 20)
    expected = pp._to_original(kept_yxyx, paddle.to_tensor(scales)).numpy()
    n = int(count.numpy()[0])
    assert done[3].tolist() == [n] and n > 5
    assert done[2][0].tolist() == kept_classes.numpy()[0].tolist()
    np.testing.assert_allclose(done[0], expected, rtol=1e-6, atol=1e-4)
    assert done[0].min() == 0.0 and done[0][..., 0::2].max() == 64 * 3.0 and done[0][..., 1::2].max() == 48 * 3.0
    del nms["clip_to_input_hw"]
    unclipped = P.complete_outputs(meta, "onnx", [boxes[None], scores[None], classes[None]],
                                   {"image_scale": scales})
    assert unclipped[0].min() < 0.0 and unclipped[3].tolist() == [n]


def test_detections_are_clipped_to_each_image_as_the_evaluator_clips_its_coco_results():
    """The graph clips to the square network input; the deploy pipeline clips each image's boxes to that
    image (``clip_to_images``), as ``detections_to_coco`` does for the evaluator: a 67 x 69 image's box
    reaching x = 69 ends at 67. Classification outputs pass unchanged."""
    from ppdlx.evaluation.coco import detections_to_coco
    meta = {"model": {"family": "detection"},
            "outputs": [{"name": "b", "role": "boxes"}, {"name": "s", "role": "scores"},
                        {"name": "c", "role": "classes"}, {"name": "n", "role": "count"}]}
    boxes = np.asarray([[[66.7, 28.7, 69.0, 55.7], [-3.0, 60.0, 20.0, 69.0]],
                        [[10.0, 10.0, 30.0, 30.0], [50.0, -1.0, 80.0, 90.0]]], np.float32)
    outputs = [boxes, np.full((2, 2), 0.9, np.float32), np.zeros((2, 2), np.int64), np.asarray([2, 2], np.int32)]
    clipped = P.clip_to_images(meta, outputs, [(67, 69), (64, 48)])
    expected = np.asarray([[[66.7, 28.7, 67.0, 55.7], [0.0, 60.0, 20.0, 69.0]],
                           [[10.0, 10.0, 30.0, 30.0], [50.0, 0.0, 64.0, 48.0]]], np.float32)
    assert np.array_equal(clipped[0], expected)
    assert clipped[0].dtype == np.float32 and all(a is b for a, b in zip(clipped[1:], outputs[1:]))
    coco = detections_to_coco([1, 2], boxes, outputs[1], outputs[2], outputs[3], [7], {1: (67, 69), 2: (64, 48)})
    as_xyxy = [[b[0], b[1], b[0] + b[2], b[1] + b[3]] for b in (r["bbox"] for r in coco)]
    np.testing.assert_allclose(as_xyxy, clipped[0].reshape(-1, 4), atol=1e-3)
    logits = [np.ones((2, 10), np.float32)]
    assert P.clip_to_images({"model": {"family": "classification"}}, logits, [(5, 5), (5, 5)]) is logits


def test_a_box_wholly_in_the_padding_is_dropped_by_the_pipeline_and_the_evaluator_alike():
    """A 64 x 32 image fills the top of a 64 x 64 input: a box below y = 32 is clipped to no height.
    ``clip_to_images`` drops it, moves the image's later detections up in score order and shrinks its
    count; ``detections_to_coco`` (the evaluator) drops the same box, and ``postprocess`` (what the CLI
    prints) reports the same detections."""
    from ppdlx.evaluation.coco import detections_to_coco
    meta = {"model": {"family": "detection"}, "labels": ["cat", "dog"], "postprocess": {},
            "outputs": [{"name": "b", "role": "boxes"}, {"name": "s", "role": "scores"},
                        {"name": "c", "role": "classes"}, {"name": "n", "role": "count"}]}
    boxes = np.zeros((2, 4, 4), np.float32)
    boxes[0, :3] = [[2, 2, 20, 20], [5, 40, 30, 60], [10, 5, 40, 31]]      # the middle one is in the padding
    boxes[1, :2] = [[0, 0, 10, 10], [1, 1, 5, 5]]
    scores = np.asarray([[0.9, 0.8, 0.7, 0.0], [0.6, 0.5, 0.0, 0.0]], np.float32)
    classes = np.asarray([[0, 1, 1, -1], [1, 0, -1, -1]], np.int64)
    counts = np.asarray([3, 2], np.int32)
    sizes = [(64, 32), (64, 64)]
    out = P.clip_to_images(meta, [boxes, scores, classes, counts], sizes)
    assert out[3].tolist() == [2, 2] and out[3].dtype == np.int32
    np.testing.assert_array_equal(out[0][0, :2], [[2, 2, 20, 20], [10, 5, 40, 31]])
    assert out[1][0].tolist() == pytest.approx([0.9, 0.7, 0.0, 0.0]) and out[2][0].tolist() == [0, 1, -1, -1]
    np.testing.assert_array_equal(out[0][1], boxes[1])  # the second image is untouched
    results = P.postprocess(meta, out, score_threshold=0.0)
    assert [[(b, lab) for b, _, _, lab in r] for r in results] == [
        [([2, 2, 20, 20], "cat"), ([10, 5, 40, 31], "dog")], [([0, 0, 10, 10], "dog"), ([1, 1, 5, 5], "cat")]]
    coco = detections_to_coco([1, 2], boxes, scores, classes, counts, [11, 12], {1: sizes[0], 2: sizes[1]})
    assert [(r["image_id"], r["bbox"], r["category_id"]) for r in coco] == [
        (1, [2, 2, 18, 18], 11), (1, [10, 5, 30, 26], 12), (2, [0, 0, 10, 10], 12), (2, [1, 1, 4, 4], 11)]


def test_clip_to_images_leaves_a_batch_with_no_empty_box_as_it_was():
    meta = {"model": {"family": "detection"},
            "outputs": [{"name": "b", "role": "boxes"}, {"name": "s", "role": "scores"},
                        {"name": "c", "role": "classes"}, {"name": "n", "role": "count"}]}
    boxes = np.asarray([[[1, 1, 5, 5], [0, 0, 0, 0]]], np.float32)  # the padding row has no area: not counted
    outputs = [boxes, np.asarray([[0.5, 0.0]], np.float32), np.asarray([[0, -1]]), np.asarray([1], np.int32)]
    out = P.clip_to_images(meta, outputs, [(8, 8)])
    assert all(a is b for a, b in zip(out[1:], outputs[1:])) and np.array_equal(out[0], boxes)
