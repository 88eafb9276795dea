import numpy as np
import paddle

from ppdlx.models import build_model
from ppdlx.models.info import count_trainable_params


def test_resnet50_parameter_count():
    assert count_trainable_params(build_model("resnet50", num_classes=1000)) == 25_557_032


def test_downsampling_stride_is_on_the_3x3_conv():
    model = build_model("resnet50", num_classes=10)
    for stage_index, stage in enumerate(model.stages):
        first = stage[0]
        expected = 1 if stage_index == 0 else 2
        assert first.conv1.conv._stride == [1, 1]
        assert first.conv2.conv._kernel_size == [3, 3]
        assert first.conv2.conv._stride == [expected, expected]
        assert first.shortcut.conv._stride == [expected, expected]


def test_output_spatial_sizes_and_logits_shape():
    model = build_model("resnet50", num_classes=7)
    model.eval()
    x = paddle.randn([2, 3, 64, 64])
    assert model.forward_features(x).shape == [2, 2048, 2, 2]
    assert model(x).shape == [2, 7]


def test_nhwc_matches_nchw_with_the_same_weights():
    paddle.seed(0)
    nchw = build_model("resnet50", num_classes=10, data_format="NCHW")
    nhwc = build_model("resnet50", num_classes=10, data_format="NHWC")
    nhwc.set_state_dict(nchw.state_dict())
    nchw.eval()
    nhwc.eval()
    x = np.random.default_rng(0).standard_normal((2, 3, 64, 64)).astype(np.float32)
    a = nchw(paddle.to_tensor(x)).numpy()
    b = nhwc(paddle.to_tensor(x.transpose(0, 2, 3, 1))).numpy()
    assert np.abs(a - b).max() < 1e-4


def test_zero_init_last_bn_makes_blocks_start_as_identity_residuals():
    model = build_model("resnet50", num_classes=10, zero_init_last_bn=True)
    gammas = [float(paddle.abs(b.conv3.bn.weight).max()) for s in model.stages for b in s]
    assert len(gammas) == 16 and max(gammas) == 0.0
    plain = build_model("resnet50", num_classes=10)
    assert float(plain.stages[0][0].conv3.bn.weight.min()) == 1.0
