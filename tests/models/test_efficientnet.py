import numpy as np
import paddle

from ppdlx.models import MODELS
from ppdlx.models.efficientnet import EfficientNet, efficientnet_b0


def _trainable(model):
    return sum(int(np.prod(p.shape)) for p in model.parameters() if not p.stop_gradient)


def test_b0_parameter_count_matches_keras():
    paddle.seed(0)
    model = MODELS.build("efficientnet_b0", num_classes=1000)
    assert isinstance(model, EfficientNet)
    assert _trainable(model) == 5_288_548  # tf.keras.applications.EfficientNetB0
    assert model.num_classes == 1000 and model.data_format == "NCHW"


def test_classifier_and_backbone_shapes_with_same_padding():
    paddle.seed(0)
    model = efficientnet_b0(num_classes=7)
    model.eval()
    with paddle.no_grad():
        logits = model(paddle.randn([2, 3, 64, 64]))
    assert logits.shape == [2, 7] and np.isfinite(logits.numpy()).all()

    backbone = efficientnet_b0(features_only=True)
    backbone.eval()
    assert backbone.feature_channels == (40, 112, 320) and backbone.feature_strides == (8, 16, 32)
    assert not hasattr(backbone, "fc")
    with paddle.no_grad():
        feats = backbone(paddle.randn([1, 3, 65, 65]))
    # TF 'SAME': 65 -> 33 -> 17 -> 9 -> 5 -> 3 ((s - 1) // 2 + 1 at every stride-2 step)
    assert [f.shape for f in feats] == [[1, 40, 9, 9], [1, 112, 5, 5], [1, 320, 3, 3]]


def test_nhwc_matches_nchw_with_shared_weights():
    paddle.seed(0)
    a = efficientnet_b0(num_classes=5, dropout=0.0)
    b = efficientnet_b0(num_classes=5, dropout=0.0, data_format="NHWC")
    b.set_state_dict(a.state_dict())
    a.eval(), b.eval()
    x = paddle.randn([2, 3, 32, 32])
    with paddle.no_grad():
        diff = (a(x) - b(x.transpose([0, 2, 3, 1]))).abs().max()
    assert float(diff) < 1e-4
