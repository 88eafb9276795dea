import numpy as np
import paddle

from ppdlx.models.detection.anchors import feature_sizes, flatten_head_outputs, generate_anchors


def test_anchor_count_and_feature_sizes_512():
    anchors = generate_anchors(512)
    assert anchors.shape == (49_104, 4) and anchors.dtype == np.float32
    assert feature_sizes(512)[3:] == [(64, 64), (32, 32), (16, 16), (8, 8), (4, 4)]
    assert feature_sizes((100, 60))[3:] == [(13, 8), (7, 4), (4, 2), (2, 1), (1, 1)]


def test_level3_and_level_boundaries_hand_computed():
    a = generate_anchors(512)
    r = 2 ** (1 / 3)
    expected = np.array([
        [-12, -12, 20, 20],                     # (y0, x0), octave 0, aspect (1, 1): 32 x 32 at (4, 4)
        [-7.2, -18.4, 15.2, 26.4],              # aspect (1.4, 0.7): w 44.8, h 22.4
        [-18.4, -7.2, 26.4, 15.2],              # aspect (0.7, 1.4)
        [4 - 16 * r, 4 - 16 * r, 4 + 16 * r, 4 + 16 * r],  # octave 1, aspect (1, 1)
    ])
    np.testing.assert_allclose(a[:4], expected, atol=1e-4)
    np.testing.assert_allclose(a[9], [-12, -4, 20, 28], atol=1e-5)        # next x (stride 8)
    np.testing.assert_allclose(a[9 * 64], [-4, -12, 28, 20], atol=1e-5)   # next y
    np.testing.assert_allclose(a[64 * 64 * 9], [-24, -24, 40, 40], atol=1e-5)  # level 4 first: 64 x 64 at (8, 8)
    base = 4 * 128 * 2 ** (2 / 3)  # level 7 last: (3, 3) centre 448, octave 2, aspect (0.7, 1.4)
    np.testing.assert_allclose(a[-1], [448 - 0.7 * base, 448 - 0.35 * base, 448 + 0.7 * base, 448 + 0.35 * base],
                               rtol=1e-5)


def test_flatten_head_outputs_follows_anchor_order():
    n, num_a, c, h, w = 2, 9, 3, 2, 3
    # value = ((y * W + x) * A + a) * C + cls: the flat index of (location, anchor, class)
    idx = np.arange(h * w * num_a * c, dtype=np.float32).reshape(h, w, num_a * c)
    cls_nchw = paddle.to_tensor(np.broadcast_to(idx.transpose(2, 0, 1), (n, num_a * c, h, w)).copy())
    box = np.arange(h * w * num_a * 4, dtype=np.float32).reshape(h, w, num_a * 4)
    box_nchw = paddle.to_tensor(np.broadcast_to(box.transpose(2, 0, 1), (n, num_a * 4, h, w)).copy())
    cls_flat, box_flat = flatten_head_outputs([cls_nchw, cls_nchw], [box_nchw, box_nchw], c)
    assert cls_flat.shape == [n, 2 * h * w * num_a, c] and box_flat.shape == [n, 2 * h * w * num_a, 4]
    expect = np.arange(h * w * num_a * c).reshape(-1, c)
    np.testing.assert_array_equal(cls_flat.numpy()[1, :h * w * num_a], expect)
    np.testing.assert_array_equal(box_flat.numpy()[0, h * w * num_a:], np.arange(box.size).reshape(-1, 4))
    cls_nhwc, _ = flatten_head_outputs([cls_nchw.transpose([0, 2, 3, 1])], [box_nchw.transpose([0, 2, 3, 1])],
                                       c, "NHWC")
    np.testing.assert_array_equal(cls_nhwc.numpy()[0], expect)
