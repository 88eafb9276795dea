"""EfficientDet-D0: EfficientNet-B0 backbone -> P6/P7 resampling -> 3 BiFPN cells -> shared heads.

``forward(images)`` returns ``(class_outputs, box_outputs)``: lists over levels P3..P7 of
``[N, A*C, H, W]`` class logits and ``[N, A*4, H, W]`` box deltas (``[N, H, W, .]`` in NHWC),
A = 9 anchors, channel = anchor * C + class, matching ``detection.anchors`` order. Loss
(``detection.EfficientDetLoss``) and post-processing (``detection.EfficientDetPostProcess``)
are separate callables. Images must already be normalised (no second normalisation).

Differences from the NVIDIA TF2 reference, on purpose: fast-attention fusion weights go
through ReLU (as upstream automl) so they stay non-negative; ``num_classes`` comes from the
dataset instead of a hard-coded 90/91.
"""
from __future__ import annotations

import math

import paddle
import paddle.nn as nn
import paddle.nn.functional as F

from ppdlx.layers import BatchNormAct2D, CallSiteQuantized, Conv2D, MaxPool2D
from ppdlx.models.detection.anchors import DEFAULT_ASPECT_RATIOS
from ppdlx.models.efficientnet import BN_EPS, BN_MOMENTUM, efficientnet_b0
from ppdlx.models.model_cfg import check_num_classes, detection_cfg
from ppdlx.registry import MODELS

# BiFPN node topology: (level, input ids); ids 0..4 are the P3..P7 inputs, node i gets id 5 + i.
BIFPN_NODES = (
    (6, (3, 4)),      # P6'  <- P6, P7
    (5, (2, 5)),      # P5'  <- P5, P6'
    (4, (1, 6)),      # P4'  <- P4, P5'
    (3, (0, 7)),      # P3'' <- P3, P4'
    (4, (1, 7, 8)),   # P4'' <- P4, P4', P3''
    (5, (2, 6, 9)),   # P5'' <- P5, P5', P4''
    (6, (3, 5, 10)),  # P6'' <- P6, P6', P5''
    (7, (4, 11)),     # P7'' <- P7, P6''
)


def _bn(ch, data_format, act=None):
    return BatchNormAct2D(ch, act, eps=BN_EPS, momentum=BN_MOMENTUM, data_format=data_format)


class SeparableConv(nn.Layer):
    """Depthwise kxk (no bias) -> pointwise 1x1 (with bias), 'SAME' padding (Keras SeparableConv2D)."""

    def __init__(self, in_ch, out_ch, kernel_size=3, data_format="NCHW", init=None, bias_init=0.0):
        super().__init__()
        self.init = init or nn.initializer.XavierUniform
        self.bias_init = bias_init
        self.depthwise = Conv2D(in_ch, in_ch, kernel_size, padding="SAME", groups=in_ch, bias_attr=False,
                                   data_format=data_format, weight_attr=paddle.ParamAttr(initializer=self.init()))
        self.pointwise = self._pointwise(in_ch, out_ch, data_format)

    def _pointwise(self, in_ch, out_ch, data_format):
        return Conv2D(in_ch, out_ch, 1, data_format=data_format,
                         weight_attr=paddle.ParamAttr(initializer=self.init()),
                         bias_attr=paddle.ParamAttr(initializer=nn.initializer.Constant(self.bias_init)))

    def reset_outputs(self, out_ch):
        """A new, freshly initialised pointwise conv with ``out_ch`` outputs (the depthwise is kept)."""
        self.pointwise = self._pointwise(self.pointwise._in_channels, out_ch, self.pointwise._data_format)

    def forward(self, x, depthwise_input=None, pointwise_input=None):
        """``depthwise_input`` / ``pointwise_input``: the call site's quantization stubs (``HeadNet``)."""
        if depthwise_input is not None:
            x = depthwise_input(x)
        x = self.depthwise(x)
        if pointwise_input is not None:
            x = pointwise_input(x)
        return self.pointwise(x)


class ResampleFeatureMap(nn.Layer):
    """Match channels (1x1 conv with bias + BN, only if they differ), then change resolution:
    ``level_diff > 0`` max-pools (k = 2^d + 1, stride 2^d, 'SAME'); ``< 0`` nearest-upsamples
    to the size of ``target``."""

    def __init__(self, in_ch, out_ch, level_diff=0, data_format="NCHW"):
        super().__init__()
        self.data_format = data_format
        self.conv = self.bn = None
        if in_ch != out_ch:
            self.conv = Conv2D(in_ch, out_ch, 1, data_format=data_format,
                                  weight_attr=paddle.ParamAttr(initializer=nn.initializer.XavierUniform()))
            self.bn = _bn(out_ch, data_format)
        self.level_diff = level_diff
        self.pool = None
        if level_diff > 0:
            stride = 2 ** level_diff
            self.pool = MaxPool2D(stride + 1, stride, padding="SAME", data_format=data_format)

    def forward(self, x, target=None):
        if self.conv is not None:
            x = self.bn(self.conv(x))
        if self.pool is not None:
            x = self.pool(x)
        elif self.level_diff < 0:
            x = nearest_upsample(x, 2 ** (-self.level_diff), target, self.data_format)
        return x


@paddle.jit.not_to_static  # a plain Python branch on the mode: converting it breaks tracing of 1x1 maps
def nearest_upsample(x, factor, target, data_format="NCHW"):
    """Nearest-neighbour upsampling by an integer ``factor``, cropped to ``target``'s spatial size
    (source index = floor(dst / factor), like ``F.interpolate(mode="nearest")``).

    Built from expand/flatten/slice: an ``interpolate`` with a tensor size exports fine but the
    oneDNN inference executor rejects its attributes.
    """
    h_axis = 2 if data_format == "NCHW" else 1
    for axis in (h_axis + 1, h_axis):  # width, then height
        shape = [-1] * (x.ndim + 1)
        shape[axis + 1] = factor
        x = x.unsqueeze(axis + 1).expand(shape).flatten(axis, axis + 1)
    if paddle.in_dynamic_mode():
        th, tw = target.shape[h_axis], target.shape[h_axis + 1]
        if x.shape[h_axis] == th and x.shape[h_axis + 1] == tw:
            return x
    else:
        th, tw = paddle.shape(target)[h_axis], paddle.shape(target)[h_axis + 1]
    return paddle.slice(x, axes=[h_axis, h_axis + 1], starts=[0, 0], ends=[th, tw])


class FusionNode(nn.Layer):
    """Fast normalised fusion ``sum(relu(w_i) x_i) / (sum(relu(w_i)) + 1e-4)`` -> swish ->
    separable conv 3x3 -> BN."""

    def __init__(self, level, input_ids, input_levels, input_channels, channels, data_format="NCHW"):
        super().__init__()
        self.level = level
        self.input_ids = tuple(input_ids)
        self.same_level = [input_levels[i] for i in input_ids].index(level)
        self.resample = nn.LayerList([
            ResampleFeatureMap(input_channels[i], channels, level - input_levels[i], data_format)
            for i in input_ids])
        self.fusion_weights = self.create_parameter([len(input_ids)], default_initializer=nn.initializer.Constant(1.0))
        self.act = nn.Silu()
        self.conv = SeparableConv(channels, channels, 3, data_format)
        self.bn = _bn(channels, data_format)

    def forward(self, feats):
        target = feats[self.input_ids[self.same_level]]
        w = F.relu(self.fusion_weights)
        w = w / (w.sum() + 1e-4)
        out = None
        for j, (i, resample) in enumerate(zip(self.input_ids, self.resample)):
            x = resample(feats[i], target) * w[j]
            out = x if out is None else out + x
        return self.bn(self.conv(self.act(out)))


class BiFPNCell(nn.Layer):
    def __init__(self, input_channels, channels, min_level=3, data_format="NCHW"):
        super().__init__()
        levels = [min_level + i for i in range(len(input_channels))]
        chans = list(input_channels)
        nodes = []
        for level, ids in BIFPN_NODES:
            nodes.append(FusionNode(level, ids, levels, chans, channels, data_format))
            levels.append(level)
            chans.append(channels)
        self.nodes = nn.LayerList(nodes)
        # Output per level = the last node at that level.
        self.out_ids = [max(i for i, lv in enumerate(levels) if lv == level)
                        for level in range(min_level, min_level + len(input_channels))]

    def forward(self, feats):
        feats = list(feats)
        for node in self.nodes:
            feats.append(node(feats))
        return [feats[i] for i in self.out_ids]


class BiFPN(nn.Layer):
    """Backbone C3..C5 -> P3..P7 (P6 = 1x1 conv + BN + max-pool of C5, P7 = max-pool of P6)
    -> ``num_cells`` BiFPN cells; returns five ``channels``-wide maps."""

    def __init__(self, backbone_channels=(40, 112, 320), channels=64, num_cells=3, min_level=3,
                 data_format="NCHW"):
        super().__init__()
        self.p6 = ResampleFeatureMap(backbone_channels[-1], channels, 1, data_format)
        self.p7 = ResampleFeatureMap(channels, channels, 1, data_format)
        in_ch = tuple(backbone_channels) + (channels, channels)
        cells = []
        for _ in range(num_cells):
            cells.append(BiFPNCell(in_ch, channels, min_level, data_format))
            in_ch = (channels,) * 5
        self.cells = nn.LayerList(cells)

    def forward(self, feats):
        feats = list(feats)
        feats.append(self.p6(feats[-1]))
        feats.append(self.p7(feats[-1]))
        for cell in self.cells:
            feats = cell(feats)
        return feats


class HeadNet(nn.Layer, CallSiteQuantized):
    """``repeats`` x [separable conv (shared over levels) -> BN (one per level) -> swish] ->
    separable-conv predictor with ``num_outputs`` channels. Each convolution's input has a quantization stub per
    level (``level_inputs[level]``, two per separable conv: identities, no parameters, until QAT)."""

    def __init__(self, channels, num_outputs, repeats=3, num_levels=5, bias_init=0.0, data_format="NCHW"):
        super().__init__()
        init = lambda: nn.initializer.KaimingNormal(nonlinearity="linear")  # Keras VarianceScaling(1, fan_in)
        self.convs = nn.LayerList([SeparableConv(channels, channels, 3, data_format, init) for _ in range(repeats)])
        self.bns = nn.LayerList([nn.LayerList([_bn(channels, data_format, "swish") for _ in range(num_levels)])
                                 for _ in range(repeats)])
        self.predict = SeparableConv(channels, num_outputs, 3, data_format, init, bias_init)
        self.level_inputs = nn.LayerList([nn.LayerList([nn.quant.Stub() for _ in range(2 * (repeats + 1))])
                                          for _ in range(num_levels)])

    def forward(self, feats):
        outs = []
        for level, x in enumerate(feats):
            stubs = self.level_inputs[level]
            for i, (conv, bns) in enumerate(zip(self.convs, self.bns)):
                x = bns[level](conv(x, stubs[2 * i], stubs[2 * i + 1]))
            outs.append(self.predict(x, stubs[-2], stubs[-1]))
        return outs

    def site_inputs(self):
        convs = [conv for sep in [*self.convs, self.predict] for conv in (sep.depthwise, sep.pointwise)]
        return [(conv, [stubs[i] for stubs in self.level_inputs]) for i, conv in enumerate(convs)]


class EfficientDet(nn.Layer):
    def __init__(self, num_classes=90, data_format="NCHW", image_size=512, fpn_channels=64, fpn_cells=3,
                 head_repeats=3, num_scales=3, aspect_ratios=DEFAULT_ASPECT_RATIOS, anchor_scale=4.0,
                 min_level=3, max_level=7, backbone_drop_connect_rate=0.0, prior_prob=0.01):
        super().__init__()
        if (min_level, max_level) != (3, 7):
            raise ValueError("EfficientDet here supports levels 3..7 only")
        self.num_classes = num_classes
        self.data_format = data_format
        self.image_size = image_size
        self.anchor_args = dict(min_level=min_level, max_level=max_level, num_scales=num_scales,
                                aspect_ratios=tuple(tuple(a) for a in aspect_ratios), anchor_scale=anchor_scale)
        self.num_anchors = num_scales * len(aspect_ratios)
        self.backbone = efficientnet_b0(data_format=data_format, drop_connect_rate=backbone_drop_connect_rate,
                                        features_only=True)
        self.fpn = BiFPN(self.backbone.feature_channels, fpn_channels, fpn_cells, min_level, data_format)
        levels = max_level - min_level + 1
        self.class_net = HeadNet(fpn_channels, self.num_anchors * num_classes, head_repeats, levels,
                                 -math.log((1.0 - prior_prob) / prior_prob), data_format)
        self.box_net = HeadNet(fpn_channels, self.num_anchors * 4, head_repeats, levels, 0.0, data_format)
        self.default_cfg = detection_cfg(image_size, "bilinear", classifier="class_net.predict.pointwise")

    def reset_classifier(self, num_classes):
        """A new, freshly initialised class predictor (its pointwise conv, prior-probability bias) with
        ``num_anchors * num_classes`` outputs; every other weight is kept."""
        self.num_classes = check_num_classes(num_classes)
        self.class_net.predict.reset_outputs(self.num_anchors * num_classes)

    def forward_features(self, images):
        """The BiFPN's P3..P7 maps (``fpn_channels`` each)."""
        return self.fpn(self.backbone(images))

    def forward_head(self, features):
        return self.class_net(features), self.box_net(features)

    def forward(self, images):
        return self.forward_head(self.forward_features(images))


@MODELS.register("efficientdet_d0")
def efficientdet_d0(num_classes=90, data_format="NCHW", image_size=512, fpn_channels=64, fpn_cells=3,
                    head_repeats=3, num_scales=3, aspect_ratios=DEFAULT_ASPECT_RATIOS, anchor_scale=4.0,
                    backbone_drop_connect_rate=0.0, prior_prob=0.01):
    """EfficientDet-D0; ``num_classes`` from the dataset (COCO: 80 contiguous or 90 category slots)."""
    return EfficientDet(num_classes, data_format, image_size, fpn_channels, fpn_cells, head_repeats, num_scales,
                        aspect_ratios, anchor_scale, 3, 7, backbone_drop_connect_rate, prior_prob)
