import numpy as np
import paddle

from ppdlx.layers import BatchNormAct2D
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


def test_lite0_is_b0_without_squeeze_excite_with_relu6_and_fixed_stem_and_head():
    paddle.seed(0)
    lite = MODELS.build("efficientnet_lite0")
    b0 = MODELS.build("efficientnet_b0")
    assert _trainable(lite) == 4_652_008  # TF EfficientNet-Lite0
    assert not [name for name, _ in lite.named_sublayers() if name.endswith(".se")]
    assert all(block.se is None for stage in lite.stages for block in stage)
    lite_keys = {k: v.shape for k, v in lite.state_dict().items()}
    b0_keys = {k: v.shape for k, v in b0.state_dict().items() if ".se." not in k}
    assert lite_keys == b0_keys  # same stage table, stem 32 and head 1280 channels
    assert lite.stem.conv.weight.shape == [32, 3, 3, 3] and lite.head.conv.weight.shape == [1280, 320, 1, 1]
    acts = [type(layer.act).__name__ for layer in lite.sublayers() if isinstance(layer, BatchNormAct2D)]
    assert set(acts) == {"ReLU6", "Identity"} and acts.count("Identity") == 16  # every block's projection
    assert not any(isinstance(layer, paddle.nn.Silu) for layer in lite.sublayers())
    lite.eval()
    with paddle.no_grad():
        assert lite(paddle.randn([1, 3, 64, 64])).shape == [1, 1000]
