import numpy as np
import paddle

from ppdlx.models.detection.box_coder import decode_boxes, decode_boxes_np, encode_boxes, encode_boxes_np


def _random_boxes(rng, n):
    yx = rng.uniform(0, 400, (n, 2))
    hw = rng.uniform(2, 200, (n, 2))
    return np.concatenate([yx, yx + hw], 1).astype(np.float32)


def test_encode_hand_computed():
    anchors = np.array([[0, 0, 10, 10]], np.float32)
    boxes = np.array([[2, 4, 12, 24]], np.float32)  # centre (7, 14), h 10, w 20
    np.testing.assert_allclose(encode_boxes_np(boxes, anchors), [[0.2, 0.9, 0.0, np.log(2.0)]], atol=1e-6)
    np.testing.assert_allclose(encode_boxes(paddle.to_tensor(boxes), paddle.to_tensor(anchors)).numpy(),
                               [[0.2, 0.9, 0.0, np.log(2.0)]], atol=1e-6)


def test_round_trip_paddle_and_numpy():
    rng = np.random.default_rng(0)
    boxes, anchors = _random_boxes(rng, 1000), _random_boxes(rng, 1000)
    codes = encode_boxes(paddle.to_tensor(boxes), paddle.to_tensor(anchors))
    back = decode_boxes(codes, paddle.to_tensor(anchors)).numpy()
    assert np.abs(back - boxes).max() < 1e-4
    codes_np = encode_boxes_np(boxes, anchors)
    assert np.abs(codes_np - codes.numpy()).max() < 1e-5
    assert np.abs(decode_boxes_np(codes_np, anchors) - boxes).max() < 1e-4
    # batched: [N, A, 4] boxes against [A, 4] anchors; Paddle's broadcasting kernels round a few
    # ulps differently from the unbatched ones on some CPUs (seen on an Intel Xeon with AVX-512)
    batched = encode_boxes(paddle.to_tensor(np.stack([boxes, boxes])), paddle.to_tensor(anchors))
    assert batched.shape == [2, 1000, 4] and np.abs(batched.numpy()[1] - codes.numpy()).max() < 1e-5
