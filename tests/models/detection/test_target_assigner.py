import numpy as np
import paddle
import pytest

from ppdlx.models.detection.anchors import generate_anchors
from ppdlx.models.detection.box_coder import encode_boxes_np
from ppdlx.models.detection.target_assigner import assign_targets, assign_targets_np, box_iou

ANCHORS = np.array([[0, 0, 10, 10],      # IoU 1 with gt0
                    [0, 5, 10, 15],      # IoU 1/3 with gt0
                    [0, 2, 10, 12],      # IoU 8/12 = 0.667 with gt0
                    [50, 50, 60, 60],    # nothing
                    [100, 100, 120, 120],  # best (IoU 0.25) for the small gt1 -> forced
                    [0, 1, 10, 11]], np.float32)  # IoU 0.818 with gt0
GT_BOXES = np.array([[[0, 0, 10, 10], [100, 100, 110, 110], [0, 0, 0, 0]]], np.float32)
GT_CLASSES = np.array([[3, 7, -1]], np.int64)


def test_iou_hand_computed():
    iou = box_iou(paddle.to_tensor(GT_BOXES[0, :2]), paddle.to_tensor(ANCHORS)).numpy()
    np.testing.assert_allclose(iou[0], [1, 1 / 3, 8 / 12, 0, 0, 9 / 11], atol=1e-6)
    np.testing.assert_allclose(iou[1], [0, 0, 0, 0, 0.25, 0], atol=1e-6)


@pytest.mark.parametrize("backend", ["paddle", "numpy"])
def test_argmax_matcher_with_force_match_and_padding(backend):
    cls, box, npos = assign_targets(paddle.to_tensor(ANCHORS), paddle.to_tensor(GT_BOXES),
                                    paddle.to_tensor(GT_CLASSES), backend=backend)
    np.testing.assert_array_equal(cls.numpy(), [[3, -1, 3, -1, 7, 3]])
    assert npos.numpy().tolist() == [4.0]
    expected = np.zeros((6, 4), np.float32)
    pos = [0, 2, 4, 5]
    expected[pos] = encode_boxes_np(GT_BOXES[0, [0, 0, 1, 0]], ANCHORS[pos])
    np.testing.assert_allclose(box.numpy()[0], expected, atol=1e-6)
    # ignore band: thresholds 0.7 / 0.5 -> anchor 2 (IoU 0.667) is ignored (-2)
    cls2, _, npos2 = assign_targets(paddle.to_tensor(ANCHORS), paddle.to_tensor(GT_BOXES),
                                    paddle.to_tensor(GT_CLASSES), 0.7, 0.5, backend=backend)
    np.testing.assert_array_equal(cls2.numpy(), [[3, -1, -2, -1, 7, 3]])
    c_np, b_np, n_np = assign_targets_np(ANCHORS, GT_BOXES[0], GT_CLASSES[0], 0.7, 0.5)
    np.testing.assert_array_equal(c_np, cls2.numpy()[0])
    assert n_np == 3


def test_batched_paddle_equals_numpy_per_image():
    rng = np.random.default_rng(1)
    anchors = generate_anchors(128)
    n, m = 3, 6
    yx = rng.uniform(0, 100, (n, m, 2))
    hw = rng.uniform(4, 60, (n, m, 2))
    boxes = np.concatenate([yx, yx + hw], -1).astype(np.float32)
    classes = rng.integers(0, 5, (n, m))
    classes[0, 2:] = -1
    classes[1, :] = -1  # an image without objects
    cls, box, npos = assign_targets(paddle.to_tensor(anchors), paddle.to_tensor(boxes), paddle.to_tensor(classes),
                                    backend="paddle")
    assert cls.dtype == paddle.int64 and box.shape == [n, len(anchors), 4] and npos.shape == [n]
    for i in range(n):
        c_np, b_np, n_np = assign_targets_np(anchors, boxes[i], classes[i])
        np.testing.assert_array_equal(cls.numpy()[i], c_np)
        assert np.abs(box.numpy()[i] - b_np).max() < 1e-5
        assert float(npos.numpy()[i]) == n_np
    assert npos.numpy()[1] == 0 and (cls.numpy()[1] == -1).all()
    assert (npos.numpy()[[0, 2]] >= 1).all()
    cls2, box2, npos2 = assign_targets(paddle.to_tensor(anchors), paddle.to_tensor(boxes), paddle.to_tensor(classes))
    assert np.array_equal(cls2.numpy(), cls.numpy()) and np.abs(box2.numpy() - box.numpy()).max() < 1e-5
    assert np.array_equal(npos2.numpy(), npos.numpy()) and cls2.dtype == paddle.int64
