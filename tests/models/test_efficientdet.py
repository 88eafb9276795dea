import numpy as np
import paddle

from ppdlx.models import MODELS
from ppdlx.models.detection import EfficientDetLoss, generate_anchors
from ppdlx.models.efficientdet import BiFPN, EfficientDet, FusionNode


def _trainable(model):
    return sum(int(np.prod(p.shape)) for p in model.parameters() if not p.stop_gradient)


def test_d0_parameter_count_matches_automl():
    paddle.seed(0)
    model = MODELS.build("efficientdet_d0", num_classes=90)
    assert isinstance(model, EfficientDet)
    assert _trainable(model) == 3_880_067  # google/automl efficientdet-d0 (90 classes)
    assert model.num_classes == 90 and model.image_size == 512
    bias = model.class_net.predict.pointwise.bias.numpy()
    np.testing.assert_allclose(bias, -np.log((1 - 0.01) / 0.01), rtol=1e-6)


def test_bifpn_shapes_at_512():
    paddle.seed(0)
    fpn = BiFPN((40, 112, 320), channels=64, num_cells=3)
    fpn.eval()
    feats = [paddle.randn([1, 40, 64, 64]), paddle.randn([1, 112, 32, 32]), paddle.randn([1, 320, 16, 16])]
    with paddle.no_grad():
        outs = fpn(feats)
    assert [o.shape for o in outs] == [[1, 64, s, s] for s in (64, 32, 16, 8, 4)]
    # Each cell: 8 nodes; first-cell P3/P4/P5 inputs get their own 1x1 conv per consuming node.
    assert [len(c.nodes) for c in fpn.cells] == [8, 8, 8]
    convs = sum(1 for n in fpn.cells[0].nodes for r in n.resample if r.conv is not None)
    assert convs == 5 and sum(1 for c in fpn.cells[1:] for n in c.nodes for r in n.resample if r.conv) == 0


def test_fusion_weights_are_made_non_negative():
    paddle.seed(0)
    node = FusionNode(4, (0, 1), [4, 4], [8, 8], 8)
    node.eval()
    node.fusion_weights.set_value(paddle.to_tensor([-3.0, 2.0]))
    a, b = paddle.randn([1, 8, 4, 4]), paddle.randn([1, 8, 4, 4])
    with paddle.no_grad():
        out1 = node([a, b])
        out2 = node([a * 5 + 7, b])  # ReLU zeroes the first weight: its input must not matter
        ref = node.bn(node.conv(node.act(b * (2.0 / (2.0 + 1e-4)))))
    assert float((out1 - out2).abs().max()) == 0.0
    assert float((out1 - ref).abs().max()) < 1e-5


def test_head_output_shapes_match_anchor_count_odd_size():
    paddle.seed(0)
    model = MODELS.build("efficientdet_d0", num_classes=3, image_size=100)
    model.eval()
    with paddle.no_grad():
        cls_out, box_out = model(paddle.randn([1, 3, 100, 100]))
    sizes = [13, 7, 4, 2, 1]
    assert [o.shape for o in cls_out] == [[1, 27, s, s] for s in sizes]
    assert [o.shape for o in box_out] == [[1, 36, s, s] for s in sizes]
    assert sum(9 * s * s for s in sizes) == len(generate_anchors(100))


def test_forward_backward_128_finite_and_loss_decreases():
    paddle.seed(0)
    np.random.seed(0)
    model = MODELS.build("efficientdet_d0", num_classes=4, image_size=128)
    model.train()
    loss_fn = EfficientDetLoss.from_model(model)
    images = paddle.randn([2, 3, 128, 128])
    gt_boxes = paddle.to_tensor([[[10, 12, 60, 70], [0, 0, 0, 0], [0, 0, 0, 0]],
                                 [[30, 40, 100, 120], [5, 5, 40, 30], [64, 64, 127, 127]]], dtype="float32")
    gt_classes = paddle.to_tensor([[1, -1, -1], [0, 3, 2]], dtype="int64")
    opt = paddle.optimizer.Adam(1e-3, parameters=model.parameters())
    losses = []
    for step in range(4):
        out = loss_fn(model(images), gt_boxes, gt_classes)
        out["total"].backward()
        if step == 0:
            grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
            assert all(np.isfinite(g.numpy()).all() for g in grads.values())
            assert float(model.backbone.stem.conv.weight.grad.abs().sum()) > 0
            assert float(model.fpn.cells[0].nodes[0].fusion_weights.grad.abs().sum()) > 0
            assert float(out["num_positives"]) >= 4  # every gt gets at least its forced anchor
            np.testing.assert_allclose(float(out["total"]), float(out["cls"]) + 50 * float(out["box"]), rtol=1e-5)
        opt.step()
        opt.clear_grad()
        losses.append(float(out["total"]))
    assert np.isfinite(losses).all()
    assert losses[-1] < 0.9 * losses[0], losses


def test_nhwc_matches_nchw():
    from ppdlx.models.detection import flatten_head_outputs
    paddle.seed(0)
    a = MODELS.build("efficientdet_d0", num_classes=2, image_size=64)
    b = MODELS.build("efficientdet_d0", num_classes=2, image_size=64, data_format="NHWC")
    b.set_state_dict(a.state_dict())
    a.eval(), b.eval()
    x = paddle.randn([1, 3, 64, 64])
    with paddle.no_grad():
        ca, ba = flatten_head_outputs(*a(x), 2, "NCHW")
        cb, bb = flatten_head_outputs(*b(x.transpose([0, 2, 3, 1])), 2, "NHWC")
    assert ca.shape == [1, 774, 2]
    assert float((ca - cb).abs().max()) < 1e-4 and float((ba - bb).abs().max()) < 1e-4
