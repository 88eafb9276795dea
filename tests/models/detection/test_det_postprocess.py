import numpy as np
import paddle

from ppdlx.models.detection.anchors import generate_anchors
from ppdlx.models.detection.det_postprocess import EfficientDetPostProcess

SIZES = [8, 4, 2, 1, 1]  # 64 px input: 774 anchors


def _hand_built_outputs(num_classes=3, batch=1):
    """All logits -10 except: anchor 0 (box [-12,-12,20,20]) class 1 logit 3; anchor 9 (the next
    location, IoU 0.6 with anchor 0) class 1 logit 2 and class 2 logit 1. Box deltas 0 except
    anchor 9's x offset 0.25 (shifts it by 8 px -> IoU with anchor 0 drops to 0.33)."""
    cls, box = [], []
    for s in SIZES:
        cls.append(np.full((batch, 9, num_classes, s, s), -10.0, np.float32))
        box.append(np.zeros((batch, 9, 4, s, s), np.float32))
    cls[0][:, 0, 1, 0, 0] = 3.0
    cls[0][:, 0, 1, 0, 1] = 2.0
    cls[0][:, 0, 2, 0, 1] = 1.0
    as_tensors = lambda arrs: [paddle.to_tensor(a.reshape(batch, -1, *a.shape[-2:])) for a in arrs]
    return cls, box, as_tensors


def test_hard_nms_postprocess_on_hand_built_logits():
    cls, box, tt = _hand_built_outputs()
    pp = EfficientDetPostProcess(num_classes=3, image_size=64)
    boxes, scores, classes, count = pp(tt(cls), tt(box), paddle.to_tensor([2.0]))
    assert boxes.shape == [1, 100, 4] and count.numpy().tolist() == [2]
    sig = lambda x: 1 / (1 + np.exp(-x))
    np.testing.assert_allclose(scores.numpy()[0, :2], [sig(3.0), sig(1.0)], rtol=1e-5)
    assert classes.numpy()[0, :3].tolist() == [1, 2, -1]
    # [x1, y1, x2, y2] in original pixels = input pixels (after NMS clipped to the 64 px input) x 2
    np.testing.assert_allclose(boxes.numpy()[0, :2], [[0, 0, 40, 40], [0, 0, 56, 40]], atol=1e-4)

    # shifting anchor 9's box by +8 px in x (tx = 0.25 * 32) lowers the IoU to 0.33: both class-1 boxes stay
    box[0][:, 0, 1, 0, 1] = 0.25
    boxes, scores, classes, count = pp(tt(cls), tt(box))
    assert count.numpy().tolist() == [3] and classes.numpy()[0, :3].tolist() == [1, 1, 2]
    np.testing.assert_allclose(boxes.numpy()[0, 1], [4, 0, 36, 20], atol=1e-4)


def test_soft_nms_postprocess_and_top_k():
    cls, box, tt = _hand_built_outputs(batch=2)
    pp = EfficientDetPostProcess(num_classes=3, image_size=64, pre_nms_top_k=5)
    _, scores_k, classes_k = pp.select_and_decode(tt(cls), tt(box))
    assert scores_k.shape == [2, 5] and classes_k.numpy()[0, :3].tolist() == [1, 1, 2]
    boxes, scores, classes, count = pp.soft_nms(tt(cls), tt(box), image_scales=[1.0, 0.5])
    assert count.tolist() == [3, 3] and classes[0, :3].tolist() == [1, 2, 1]
    sig = lambda x: 1 / (1 + np.exp(-x))
    iou = (33 * 25) / (2 * 33 * 33 - 33 * 25)  # +1 pixel areas, anchors 0 and 9
    np.testing.assert_allclose(scores[0, :3], [sig(3.0), sig(1.0), sig(2.0) * np.exp(-iou ** 2 / 0.5)], rtol=1e-5)
    np.testing.assert_allclose(boxes[1, 0], np.array([0, 0, 20, 20]) * 0.5, atol=1e-4)


def test_postprocess_exports_with_dynamic_batch(tmp_path):
    cls, box, tt = _hand_built_outputs(batch=2)
    pp = EfficientDetPostProcess(num_classes=3, image_size=64)

    class Wrap(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.pp = pp

        def forward(self, c3, c4, c5, c6, c7, b3, b4, b5, b6, b7, scales):
            return self.pp([c3, c4, c5, c6, c7], [b3, b4, b5, b6, b7], scales)

    c, b = tt(cls), tt(box)
    spec = [paddle.static.InputSpec([None] + t.shape[1:], "float32") for t in c + b]
    spec.append(paddle.static.InputSpec([None], "float32"))
    path = str(tmp_path / "pp")
    paddle.jit.save(paddle.jit.to_static(Wrap(), input_spec=spec, full_graph=True), path)
    loaded = paddle.jit.load(path)
    scales = paddle.to_tensor([1.0, 3.0])
    ref = pp(c, b, scales)
    got = loaded(*c, *b, scales)
    for r, g in zip(ref, got):
        assert r.shape == g.shape and float((r.astype("float32") - g.astype("float32")).abs().max()) < 1e-5
    got1 = loaded(*[t[:1] for t in c + b], scales[:1])
    assert got1[0].shape == [1, 100, 4] and got1[3].numpy().tolist() == [2]
    assert len(generate_anchors(64)) == pp.num_anchors == 774


def test_boxes_far_outside_the_input_are_clipped_to_it_after_nms():
    """An under-trained head's box deltas (exp(25) x the anchor: ~1e12 px) decode to boxes that NMS sees as
    they are (the candidates an ONNX graph outputs), and that come out of the hard-NMS program and the
    soft-NMS evaluation clipped to the 64 px input (x image_scale in original pixels), not at +-1e12."""
    cls, box, tt = _hand_built_outputs(batch=2)
    box[0][:, 0, 2:, 0, 0] = 25.0   # anchor 0: th, tw -> a box ~2e12 px across around (4, 4)
    box[0][:, 0, 0, 0, 1] = 1e6     # anchor 9: ty -> its centre 3e7 px below the input
    pp = EfficientDetPostProcess(num_classes=3, image_size=64)
    candidates = pp.select_and_decode(tt(cls), tt(box))[0].numpy()
    assert candidates.min() < -1e12 and candidates.max() > 3e7  # NMS's input is unchanged
    # anchor 9 no longer overlaps anchor 0 (IoU ~0): both class-1 boxes stay, by score
    boxes, scores, classes, count = (t.numpy() for t in pp(tt(cls), tt(box), paddle.to_tensor([2.0, 0.5])))
    assert count.tolist() == [3, 3] and classes[:, :3].tolist() == [[1, 1, 2]] * 2
    np.testing.assert_array_equal(boxes[0, :3], [[0, 0, 128, 128], [0, 128, 56, 128], [0, 128, 56, 128]])
    np.testing.assert_array_equal(boxes[1, :2], [[0, 0, 32, 32], [0, 32, 14, 32]])
    assert np.all(boxes[:, 3:] == 0)  # padding stays zero
    soft_boxes, _, soft_classes, soft_count = pp.soft_nms(tt(cls), tt(box), image_scales=[2.0, 0.5])
    assert soft_count.tolist() == [3, 3] and soft_classes[:, :3].tolist() == [[1, 1, 2]] * 2
    np.testing.assert_array_equal(soft_boxes[:, :3], boxes[:, :3])
