import numpy as np
import paddle

from ppdlx.models.detection.det_loss import EfficientDetLoss, focal_loss, huber_loss


def _focal_np(logits, y, alpha=0.25, gamma=1.5):
    p = 1 / (1 + np.exp(-logits))
    p_t = y * p + (1 - y) * (1 - p)
    alpha_t = y * alpha + (1 - y) * (1 - alpha)
    ce = -(y * np.log(p) + (1 - y) * np.log(1 - p))
    return alpha_t * (1 - p_t) ** gamma * ce


def _huber_np(x, delta=0.1):
    a = np.abs(x)
    return np.where(a <= delta, 0.5 * a * a, delta * a - 0.5 * delta * delta)


def test_focal_and_huber_match_numpy():
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, (4, 50, 6)).astype(np.float64)
    y = (rng.uniform(size=logits.shape) < 0.2).astype(np.float64)
    got = focal_loss(paddle.to_tensor(logits, "float32"), paddle.to_tensor(y, "float32")).numpy()
    np.testing.assert_allclose(got, _focal_np(logits, y), rtol=1e-4, atol=1e-6)
    x = rng.normal(0, 0.2, (100,))
    got = huber_loss(paddle.to_tensor(x, "float32"), paddle.zeros([100])).numpy()
    np.testing.assert_allclose(got, _huber_np(x), rtol=1e-5, atol=1e-7)


def test_loss_from_targets_matches_numpy_with_ignored_and_normaliser():
    rng = np.random.default_rng(1)
    n, a, c = 2, 30, 4
    cls_out = rng.normal(-2, 2, (n, a, c)).astype(np.float32)
    box_out = rng.normal(0, 0.3, (n, a, 4)).astype(np.float32)
    cls_t = rng.choice([-2, -1, -1, -1, 0, 1, 2, 3], size=(n, a)).astype(np.int64)
    box_t = rng.normal(0, 0.3, (n, a, 4)).astype(np.float32) * (cls_t >= 0)[..., None]
    npos = float((cls_t >= 0).sum())
    fn = EfficientDetLoss(num_classes=c)
    out = fn.loss_from_targets(paddle.to_tensor(cls_out), paddle.to_tensor(box_out), paddle.to_tensor(cls_t),
                               paddle.to_tensor(box_t), paddle.to_tensor(npos))
    onehot = np.eye(c)[np.clip(cls_t, 0, None)] * (cls_t >= 0)[..., None]
    cls_ref = (_focal_np(cls_out.astype(np.float64), onehot) * (cls_t != -2)[..., None]).sum() / (npos + 1)
    box_ref = (_huber_np(box_out - box_t) * (cls_t >= 0)[..., None]).sum() / ((npos + 1) * 4)
    np.testing.assert_allclose(float(out["cls"]), cls_ref, rtol=1e-4)
    np.testing.assert_allclose(float(out["box"]), box_ref, rtol=1e-4)
    np.testing.assert_allclose(float(out["total"]), cls_ref + 50 * box_ref, rtol=1e-4)


def test_perfect_prediction_has_small_box_loss_and_xyxy_input():
    from ppdlx.models.detection.anchors import generate_anchors
    from ppdlx.models.detection.target_assigner import assign_targets
    anchors = generate_anchors(64)
    gt_yxyx = np.array([[[8, 4, 40, 30], [0, 0, 0, 0]]], np.float32)
    gt_cls = np.array([[1, -1]], np.int64)
    _, box_t, _ = assign_targets(paddle.to_tensor(anchors), paddle.to_tensor(gt_yxyx), paddle.to_tensor(gt_cls))
    # build per-level NCHW outputs whose flattened boxes equal the targets
    sizes, a, c = [8, 4, 2, 1, 1], 9, 2
    outs_box, outs_cls, start = [], [], 0
    for s in sizes:
        k = s * s * a
        lvl = box_t.numpy()[:, start:start + k].reshape(1, s, s, a * 4).transpose(0, 3, 1, 2)
        outs_box.append(paddle.to_tensor(np.ascontiguousarray(lvl)))
        outs_cls.append(paddle.zeros([1, a * c, s, s]))
        start += k
    for fmt, gt in (("yxyx", gt_yxyx), ("xyxy", gt_yxyx[..., [1, 0, 3, 2]])):
        fn = EfficientDetLoss(num_classes=c, image_size=64, gt_box_format=fmt)
        out = fn((outs_cls, outs_box), paddle.to_tensor(gt), paddle.to_tensor(gt_cls))
        assert float(out["box"]) < 1e-9 and float(out["num_positives"]) >= 1


def test_wrong_image_size_is_a_config_error():
    import pytest
    from ppdlx.errors import ConfigError
    outs_cls = [paddle.zeros([1, 18, s, s]) for s in (8, 4, 2, 1, 1)]
    outs_box = [paddle.zeros([1, 36, s, s]) for s in (8, 4, 2, 1, 1)]
    fn = EfficientDetLoss(num_classes=2, image_size=128)
    with pytest.raises(ConfigError, match="image_size"):
        fn((outs_cls, outs_box), np.zeros((1, 1, 4), np.float32), np.full((1, 1), -1))
    out = fn((outs_cls, outs_box), np.zeros((1, 1, 4), np.float32), np.full((1, 1), -1), image_size=64)
    # no objects: normaliser 1, every one of 774 x 2 logits at 0 -> 0.75 * 0.5^1.5 * log 2 each
    np.testing.assert_allclose(float(out["cls"]), 774 * 2 * 0.75 * 0.5 ** 1.5 * np.log(2), rtol=1e-5)
    assert float(out["box"]) == 0.0 and float(out["num_positives"]) == 0.0
