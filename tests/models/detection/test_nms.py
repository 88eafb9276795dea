import numpy as np
import paddle

from ppdlx.models.detection.nms import multiclass_hard_nms, multiclass_soft_nms_np, soft_nms_np

# image 0: B overlaps A (IoU 81/119 = 0.68) with the same class -> suppressed; C = B's box with
# another class -> kept; D far away -> kept. image 1: a single box + candidates under the threshold.
BOXES = np.array([[[0, 0, 10, 10], [1, 1, 11, 11], [1, 1, 11, 11], [50, 50, 60, 60]],
                  [[5, 5, 20, 20], [0, 0, 3, 3], [0, 0, 4, 4], [30, 30, 31, 31]]], np.float32)
SCORES = np.array([[0.9, 0.8, 0.7, 0.6], [0.5, 0.0005, 0.0002, 0.0001]], np.float32)
CLASSES = np.array([[0, 0, 1, 0], [2, 1, 1, 0]], np.int64)


def test_multiclass_hard_nms_batched_padded():
    boxes, scores, classes, count = multiclass_hard_nms(
        paddle.to_tensor(BOXES), paddle.to_tensor(SCORES), paddle.to_tensor(CLASSES), num_classes=3,
        iou_threshold=0.5, score_threshold=0.001, max_detections=5)
    assert boxes.shape == [2, 5, 4] and scores.shape == [2, 5] and classes.shape == [2, 5]
    assert count.numpy().tolist() == [3, 1]
    np.testing.assert_allclose(scores.numpy(), [[0.9, 0.7, 0.6, 0, 0], [0.5, 0, 0, 0, 0]], atol=1e-6)
    np.testing.assert_array_equal(classes.numpy(), [[0, 1, 0, -1, -1], [2, -1, -1, -1, -1]])
    np.testing.assert_allclose(boxes.numpy()[0, :3], BOXES[0, [0, 2, 3]])
    np.testing.assert_allclose(boxes.numpy()[1, 0], BOXES[1, 0])
    assert np.abs(boxes.numpy()[0, 3:]).max() == 0 and np.abs(boxes.numpy()[1, 1:]).max() == 0


def test_hard_nms_no_detections_and_max_detections_cap():
    boxes, scores, classes, count = multiclass_hard_nms(
        paddle.to_tensor(BOXES), paddle.to_tensor(SCORES * 0), paddle.to_tensor(CLASSES), 3, max_detections=4)
    assert count.numpy().tolist() == [0, 0] and (classes.numpy() == -1).all() and float(scores.sum()) == 0
    _, scores, _, count = multiclass_hard_nms(paddle.to_tensor(BOXES), paddle.to_tensor(SCORES),
                                              paddle.to_tensor(CLASSES), 3, max_detections=2)
    assert count.numpy().tolist() == [2, 1]
    np.testing.assert_allclose(scores.numpy(), [[0.9, 0.7], [0.5, 0]], atol=1e-6)


def test_soft_nms_gaussian_decay_plus_one_areas():
    boxes, scores = soft_nms_np(BOXES[0, :2], SCORES[0, :2], sigma=0.5)
    iou = (10 * 10) / (2 * 11 * 11 - 10 * 10)  # +1 pixel convention: inter (10-1+1)^2, areas 11^2
    np.testing.assert_allclose(scores, [0.9, 0.8 * np.exp(-iou ** 2 / 0.5)], rtol=1e-5)
    np.testing.assert_allclose(boxes, BOXES[0, :2])
    b, s, c, n = multiclass_soft_nms_np(BOXES[0], SCORES[0], CLASSES[0], max_detections=5)
    assert n == 4
    np.testing.assert_allclose(s, [0.9, 0.7, 0.6, 0.8 * np.exp(-iou ** 2 / 0.5), 0], rtol=1e-5)
    np.testing.assert_array_equal(c, [0, 1, 0, 0, -1])
    _, s1, c1, n1 = multiclass_soft_nms_np(BOXES[1], SCORES[1], CLASSES[1], max_detections=3)
    assert n1 == 1 and c1.tolist() == [2, -1, -1]
