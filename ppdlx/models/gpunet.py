"""GPUNet (NVIDIA DeepLearningExamples, PyTorch/Classification/GPUNet) built from its JSON format.

The 7 released architectures ship as package data in ``ppdlx/models/gpunet_archs/*.json``
(byte-identical copies of the upstream ``configs/batch1/GV100/*.json``); ``gpunet_json`` builds a
user's file in the same format.

The JSON is a list of layer dicts executed strictly in order. Entry 0 is
``{"layer_type": "data", "img_resolution": R, "distill": bool}``; ``distill`` selects one of the
two module families of the reference builder (it is *not* the training recipe: P0/P1 were trained
with distillation but use ``distill: false``):

* ``distill: false`` (``GPUNet_Builder._get_model``, timm-style modules, BN eps 1e-3):
  ``head`` (Prologue, act from ``act``, default swish), ``conv`` (ConvBnAct, never residual),
  ``irb`` (InvertedResidual, ``mid = make_divisible(in*exp, 8)``, optional SE),
  ``fused_irb`` (EdgeResidual, same ``mid``; **stride-2 fused IRBs have padding 0** because
  the reference's ``pad_type="same"`` falls back to a dropped "dynamic same" pad), ``tail``
  (Epilogue: 1x1 conv, BN, ReLU, pool, dropout, linear).
* ``distill: true`` (``_get_distill_model``, ReLU-only modules, BN eps 1e-5): ``head``
  (PrologueD), ``head_large`` (PrologueLargeD), ``irb`` (Inverted_Residual_Block,
  ``mid = in*exp`` unrounded, ``groups`` on the 1x1 convs, no SE), ``fused_irb`` (Fused_IRB,
  BN eps 1e-3), ``tail`` (EpilogueD: 1x1 conv to 1152, BN, ReLU, pool, 1x1 conv to ``out``
  without bias/BN, ReLU, dropout, linear).

A block is residual iff ``num_in_channels == num_out_channels and stride == 1`` (irb/fused_irb).
Stochastic depth (drop-path) follows the reference ramp ``rate_i = drop_path_rate * i /
(len(config) - 1)`` for JSON entry ``i`` and is applied per sample, in training only, on
residual blocks. The reference hard-codes base 0.2 for the non-distill family and 0.0 for the
distill family; those are the factory defaults here.

Layer names: ``model.network`` is a ``Sequential`` whose children are named by their JSON entry
index (``network.4.conv_exp.weight`` is entry 4); inside a block the sub-layer names are the
reference's (``conv_pw/bn1/conv_dw/bn2/se/conv_pwl/bn3``, ``net.N``, ``body.N``), so a reference
checkpoint maps by position of the top-level module plus the usual torch->paddle renames
(``running_mean -> _mean``, ``running_var -> _variance``, Linear weight transposed).

Initialisation follows PyTorch's defaults (the reference does no custom init): conv and linear
weights and biases ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), BN gamma 1 / beta 0. BN momentum 0.9
(paddle convention) == PyTorch's 0.1.
"""
from __future__ import annotations

import difflib
import json
import math
import os
from typing import Any, Dict, List, Optional

import paddle
import paddle.nn as nn

from ppdlx.errors import ConfigError
from ppdlx.registry import MODELS

ARCH_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpunet_archs")

BN_MOMENTUM = 0.9  # paddle's running = m*running + (1-m)*batch; == PyTorch momentum 0.1
ACTIVATIONS = ("relu", "swish")


# --------------------------------------------------------------------------- helpers
def make_divisible(v, divisor=8, min_value=None, round_limit=0.9):
    """timm's make_divisible: nearest multiple of ``divisor`` (min ``divisor``), +divisor if < 90 %."""
    min_value = min_value or divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < round_limit * v:
        new_v += divisor
    return new_v


def symmetric_padding(kernel_size, stride=1, dilation=1):
    """The reference's ``get_padding``: ``((stride - 1) + dilation * (kernel_size - 1)) // 2``."""
    return ((stride - 1) + dilation * (kernel_size - 1)) // 2


def same_padding_static(kernel_size, stride=1, dilation=1):
    """Padding of the reference's ``create_conv2d(..., padding="same")``.

    Static "same" (stride 1, odd effective kernel) -> symmetric padding; otherwise the reference
    computes padding 0 and drops the dynamic-pad flag, i.e. VALID padding.
    """
    if stride == 1 and (dilation * (kernel_size - 1)) % 2 == 0:
        return symmetric_padding(kernel_size, stride, dilation)
    return 0


def make_act(name):
    if name == "relu":
        return nn.ReLU()
    if name == "swish":
        return nn.Silu()
    raise ValueError(f"unknown GPUNet activation {name!r} (known: relu, swish)")


def _torch_uniform(fan_in):
    bound = 1.0 / math.sqrt(fan_in)
    return paddle.ParamAttr(initializer=nn.initializer.Uniform(-bound, bound))


def conv2d(in_ch, out_ch, kernel_size, stride=1, padding=0, groups=1, bias=False, data_format="NCHW"):
    fan_in = (in_ch // groups) * kernel_size * kernel_size
    return nn.Conv2D(in_ch, out_ch, kernel_size, stride=stride, padding=padding, groups=groups,
                     data_format=data_format, weight_attr=_torch_uniform(fan_in),
                     bias_attr=_torch_uniform(fan_in) if bias else False)


def batch_norm(ch, eps, data_format):
    return nn.BatchNorm2D(ch, momentum=BN_MOMENTUM, epsilon=eps, data_format=data_format)


def linear(in_f, out_f):
    return nn.Linear(in_f, out_f, weight_attr=_torch_uniform(in_f), bias_attr=_torch_uniform(in_f))


def drop_path(x, drop_prob: float = 0.0, training: bool = False):
    """Per-sample stochastic depth: ``x / keep * floor(keep + U[0, 1))``."""
    if drop_prob == 0.0 or not training:
        return x
    keep = 1.0 - drop_prob
    shape = [x.shape[0]] + [1] * (x.ndim - 1)
    mask = paddle.floor(keep + paddle.rand(shape, dtype=x.dtype))
    return x / keep * mask


class _Block(nn.Layer):
    """Common attributes: ``has_residual`` and the (stored) ``drop_path_rate`` of the block."""

    has_residual = False
    drop_path_rate = 0.0

    @property
    def effective_drop_path_rate(self):
        return self.drop_path_rate if self.has_residual else 0.0

    def _residual(self, x, shortcut):
        if self.has_residual:
            if self.drop_path_rate > 0.0:
                x = drop_path(x, self.drop_path_rate, self.training)
            x = x + shortcut
        return x


# --------------------------------------------------------------- non-distill family
class SqueezeExcite(nn.Layer):
    """mean -> conv1x1(bias) -> act -> conv1x1(bias) -> sigmoid -> multiply."""

    def __init__(self, in_chs, rd_ratio=0.25, act="relu", data_format="NCHW"):
        super().__init__()
        rd = round(in_chs * rd_ratio)  # python round, as the reference
        self.spatial_axes = [2, 3] if data_format == "NCHW" else [1, 2]
        self.conv_reduce = conv2d(in_chs, rd, 1, bias=True, data_format=data_format)
        self.act1 = make_act(act)
        self.conv_expand = conv2d(rd, in_chs, 1, bias=True, data_format=data_format)
        self.gate = nn.Sigmoid()
        self.rd_channels = rd

    def forward(self, x):
        s = x.mean(axis=self.spatial_axes, keepdim=True)
        s = self.conv_expand(self.act1(self.conv_reduce(s)))
        return x * self.gate(s)


class Prologue(_Block):
    """head: conv3x3 s2 p1 -> BN(1e-3) -> act."""

    def __init__(self, in_ch, out_ch, act="swish", data_format="NCHW"):
        super().__init__()
        self.net = nn.Sequential(conv2d(in_ch, out_ch, 3, stride=2, padding=1, data_format=data_format),
                                 batch_norm(out_ch, 1e-3, data_format), make_act(act))

    def forward(self, x):
        return self.net(x)


class ConvBnAct(_Block):
    """conv: conv (symmetric pad) -> BN(1e-3) -> act; the reference builds it with skip=False."""

    def __init__(self, in_ch, out_ch, kernel_size, stride=1, act="relu", drop_path_rate=0.0,
                 data_format="NCHW"):
        super().__init__()
        self.drop_path_rate = drop_path_rate
        self.conv = conv2d(in_ch, out_ch, kernel_size, stride=stride,
                           padding=symmetric_padding(kernel_size, stride), data_format=data_format)
        self.bn1 = batch_norm(out_ch, 1e-3, data_format)
        self.act1 = make_act(act)

    def forward(self, x):
        return self.act1(self.bn1(self.conv(x)))


class InvertedResidual(_Block):
    """irb: 1x1 expand -> BN -> act -> kxk depthwise -> BN -> act -> [SE] -> 1x1 project -> BN."""

    def __init__(self, in_ch, out_ch, kernel_size=3, stride=1, exp_ratio=1.0, use_se=False, act="relu",
                 drop_path_rate=0.0, data_format="NCHW"):
        super().__init__()
        mid = make_divisible(in_ch * exp_ratio)
        self.mid_channels = mid
        self.has_residual = in_ch == out_ch and stride == 1
        self.drop_path_rate = drop_path_rate
        self.conv_pw = conv2d(in_ch, mid, 1, data_format=data_format)
        self.bn1 = batch_norm(mid, 1e-3, data_format)
        self.act1 = make_act(act)
        self.conv_dw = conv2d(mid, mid, kernel_size, stride=stride, padding=symmetric_padding(kernel_size, stride),
                              groups=mid, data_format=data_format)
        self.bn2 = batch_norm(mid, 1e-3, data_format)
        self.act2 = make_act(act)
        self.se = (SqueezeExcite(mid, rd_ratio=0.25 / exp_ratio, act=act, data_format=data_format)
                   if use_se else nn.Identity())
        self.conv_pwl = conv2d(mid, out_ch, 1, data_format=data_format)
        self.bn3 = batch_norm(out_ch, 1e-3, data_format)

    def forward(self, x):
        shortcut = x
        x = self.act1(self.bn1(self.conv_pw(x)))
        x = self.act2(self.bn2(self.conv_dw(x)))
        x = self.bn3(self.conv_pwl(self.se(x)))
        return self._residual(x, shortcut)


class EdgeResidual(_Block):
    """fused_irb: kxk conv (stride, "same" pad quirk) -> BN -> act -> [SE] -> 1x1 project -> BN."""

    def __init__(self, in_ch, out_ch, kernel_size=3, stride=1, exp_ratio=1.0, use_se=False, act="relu",
                 drop_path_rate=0.0, data_format="NCHW"):
        super().__init__()
        mid = make_divisible(in_ch * exp_ratio)
        self.mid_channels = mid
        self.has_residual = in_ch == out_ch and stride == 1
        self.drop_path_rate = drop_path_rate
        self.conv_exp = conv2d(in_ch, mid, kernel_size, stride=stride,
                               padding=same_padding_static(kernel_size, stride), data_format=data_format)
        self.bn1 = batch_norm(mid, 1e-3, data_format)
        self.act1 = make_act(act)
        self.se = (SqueezeExcite(mid, rd_ratio=0.25 / exp_ratio, act=act, data_format=data_format)
                   if use_se else nn.Identity())
        self.conv_pwl = conv2d(mid, out_ch, 1, data_format=data_format)
        self.bn2 = batch_norm(out_ch, 1e-3, data_format)

    def forward(self, x):
        shortcut = x
        x = self.act1(self.bn1(self.conv_exp(x)))
        x = self.bn2(self.conv_pwl(self.se(x)))
        return self._residual(x, shortcut)


class Epilogue(_Block):
    """tail: conv1x1 -> BN(1e-3) -> ReLU -> avgpool -> flatten -> dropout -> linear."""

    def __init__(self, in_ch, out_ch, num_classes, dropout=0.2, data_format="NCHW"):
        super().__init__()
        self.net = nn.Sequential(conv2d(in_ch, out_ch, 1, data_format=data_format),
                                 batch_norm(out_ch, 1e-3, data_format), nn.ReLU(),
                                 nn.AdaptiveAvgPool2D(1, data_format=data_format), nn.Flatten(),
                                 nn.Dropout(p=dropout), linear(out_ch, num_classes))

    def forward(self, x):
        return self.net(x)


# ------------------------------------------------------------------- distill family
class PrologueD(_Block):
    """head (distill): conv3x3 s2 p1 -> BN(1e-5) -> ReLU."""

    def __init__(self, in_ch, out_ch, data_format="NCHW"):
        super().__init__()
        self.net = nn.Sequential(conv2d(in_ch, out_ch, 3, stride=2, padding=1, data_format=data_format),
                                 batch_norm(out_ch, 1e-5, data_format), nn.ReLU())

    def forward(self, x):
        return self.net(x)


class PrologueLargeD(_Block):
    """head_large (distill): PrologueD + 2 x [conv3x3 s1 p1 -> BN -> ReLU]."""

    def __init__(self, in_ch, out_ch, data_format="NCHW"):
        super().__init__()
        layers = []
        for i, stride in enumerate((2, 1, 1)):
            layers += [conv2d(in_ch if i == 0 else out_ch, out_ch, 3, stride=stride, padding=1,
                              data_format=data_format),
                       batch_norm(out_ch, 1e-5, data_format), nn.ReLU()]
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


class InvertedResidualBlockD(_Block):
    """irb (distill): 1x1(groups) -> BN -> ReLU -> kxk dw (pad k//2) -> BN -> ReLU -> 1x1(groups) -> BN."""

    def __init__(self, in_ch, out_ch, kernel_size, stride, expansion, groups=1, drop_path_rate=0.0,
                 data_format="NCHW"):
        super().__init__()
        mid = in_ch * expansion
        self.mid_channels = mid
        self.has_residual = stride == 1 and in_ch == out_ch
        self.drop_path_rate = drop_path_rate
        self.body = nn.Sequential(
            conv2d(in_ch, mid, 1, groups=groups, data_format=data_format),
            batch_norm(mid, 1e-5, data_format), nn.ReLU(),
            conv2d(mid, mid, kernel_size, stride=stride, padding=kernel_size // 2, groups=mid,
                   data_format=data_format),
            batch_norm(mid, 1e-5, data_format), nn.ReLU(),
            conv2d(mid, out_ch, 1, groups=groups, data_format=data_format),
            batch_norm(out_ch, 1e-5, data_format))

    def forward(self, x):
        return self._residual(self.body(x), x)


class FusedIRBD(_Block):
    """fused_irb (distill): kxk conv (pad k//2) -> BN(1e-3) -> ReLU -> 1x1 -> BN(1e-3)."""

    def __init__(self, in_ch, out_ch, kernel_size, stride, expansion, drop_path_rate=0.0, data_format="NCHW"):
        super().__init__()
        mid = in_ch * expansion
        self.mid_channels = mid
        self.has_residual = stride == 1 and in_ch == out_ch
        self.drop_path_rate = drop_path_rate
        self.body = nn.Sequential(
            conv2d(in_ch, mid, kernel_size, stride=stride, padding=kernel_size // 2, data_format=data_format),
            batch_norm(mid, 1e-3, data_format), nn.ReLU(),
            conv2d(mid, out_ch, 1, data_format=data_format),
            batch_norm(out_ch, 1e-3, data_format))

    def forward(self, x):
        return self._residual(self.body(x), x)


class EpilogueD(_Block):
    """tail (distill): conv1x1 ->1152 -> BN -> ReLU -> pool -> conv1x1 1152->out -> ReLU -> dropout -> linear."""

    width = 1152

    def __init__(self, in_ch, out_ch, num_classes, dropout=0.2, data_format="NCHW"):
        super().__init__()
        w = self.width
        self.net = nn.Sequential(conv2d(in_ch, w, 1, data_format=data_format),
                                 batch_norm(w, 1e-5, data_format), nn.ReLU(),
                                 nn.AdaptiveAvgPool2D(1, data_format=data_format),
                                 conv2d(w, out_ch, 1, data_format=data_format), nn.ReLU(),
                                 nn.Flatten(), nn.Dropout(p=dropout), linear(out_ch, num_classes))

    def forward(self, x):
        return self.net(x)


# ------------------------------------------------------------------------ validation
_IO = ("num_in_channels", "num_out_channels")
# keys the reference builder reads for each layer type (``stage`` is a name label only: optional)
REQUIRED_KEYS = {
    False: {
        "head": _IO,
        "conv": _IO + ("kernel_size", "stride", "act"),
        "irb": _IO + ("kernel_size", "stride", "expansion", "use_se", "act"),
        "fused_irb": _IO + ("kernel_size", "stride", "expansion", "use_se", "act"),
        "tail": _IO + ("num_classes",),
    },
    True: {
        "head": _IO,
        "head_large": _IO,
        "irb": _IO + ("kernel_size", "stride", "expansion", "groups"),
        "fused_irb": _IO + ("kernel_size", "stride", "expansion"),
        "tail": _IO + ("num_classes",),
    },
}
_POSITIVE_INT_KEYS = ("num_in_channels", "num_out_channels", "kernel_size", "stride", "groups",
                      "num_classes", "img_resolution")


def _fail(source, msg):
    raise ConfigError(f"{source}: {msg}".replace("\n", " "))


def _check_value(source, where, key, value):
    if key in _POSITIVE_INT_KEYS:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            _fail(source, f"{where}: '{key}' must be a positive integer, got {value!r}")
    elif key == "expansion":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            _fail(source, f"{where}: 'expansion' must be a positive number, got {value!r}")
    elif key in ("use_se", "distill"):
        if not isinstance(value, bool):
            _fail(source, f"{where}: '{key}' must be true or false, got {value!r}")
    elif key == "act":
        if value not in ACTIVATIONS:
            _fail(source, f"{where}: unsupported act {value!r} (GPUNet supports: relu, swish)")


def validate_config(config: Any, source: str = "<gpunet config>") -> List[Dict[str, Any]]:
    """Check a parsed GPUNet JSON; raise ``ConfigError`` (one line: file, entry index, key)."""
    if not isinstance(config, list):
        _fail(source, f"expected a JSON list of layer objects, got {type(config).__name__}")
    if not config:
        _fail(source, "empty layer list; entry 0 must be {\"layer_type\": \"data\", ...}")
    for i, entry in enumerate(config):
        if not isinstance(entry, dict):
            _fail(source, f"entry {i}: expected a JSON object, got {type(entry).__name__}")
        if "layer_type" not in entry:
            _fail(source, f"entry {i}: missing key 'layer_type'")
    data = config[0]
    if data["layer_type"] != "data":
        _fail(source, f"entry 0 must be the 'data' layer, got layer_type {data['layer_type']!r}")
    for key in ("img_resolution", "distill"):
        if key not in data:
            _fail(source, f"entry 0 (data): missing key '{key}'")
        _check_value(source, "entry 0 (data)", key, data[key])
    distill = data["distill"]
    family = REQUIRED_KEYS[distill]
    prev_out = None
    for i, entry in enumerate(config[1:], start=1):
        ltype = entry["layer_type"]
        where = f"entry {i} ({ltype})"
        if not isinstance(ltype, str):
            _fail(source, f"entry {i}: 'layer_type' must be a string, got {ltype!r}")
        if ltype == "data":
            _fail(source, f"entry {i}: 'data' is only allowed as entry 0")
        if ltype not in family:
            if ltype in REQUIRED_KEYS[not distill]:
                _fail(source, f"entry {i}: layer_type {ltype!r} is not supported when the data layer has "
                              f"distill={str(distill).lower()} (supported: {', '.join(family)})")
            close = difflib.get_close_matches(str(ltype), list(family), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            _fail(source, f"entry {i}: unknown layer_type {ltype!r}{hint} (known: {', '.join(family)})")
        for key in family[ltype]:
            if key not in entry:
                _fail(source, f"{where}: missing key '{key}'")
            _check_value(source, where, key, entry[key])
        if "act" in entry and ltype == "head" and not distill:
            _check_value(source, where, "act", entry["act"])
        if prev_out is not None and entry["num_in_channels"] != prev_out:
            _fail(source, f"{where}: num_in_channels {entry['num_in_channels']} does not match the previous "
                          f"layer's num_out_channels {prev_out}")
        prev_out = entry["num_out_channels"]
        if distill and ltype in ("irb", "fused_irb"):
            mid = entry["num_in_channels"] * entry["expansion"]
            if mid != int(mid):
                _fail(source, f"{where}: 'expansion' {entry['expansion']!r} must make num_in_channels*expansion "
                              f"an integer in the distill family (got {mid})")
            if ltype == "irb":  # groups of the two 1x1 convs (read but unused by the distill fused_irb)
                for ch in (entry["num_in_channels"], int(mid), entry["num_out_channels"]):
                    if ch % entry["groups"]:
                        _fail(source, f"{where}: 'groups' {entry['groups']} does not divide channel count {ch}")
        if ltype == "tail" and i != len(config) - 1:
            _fail(source, f"{where}: the tail must be the last entry (found at {i} of {len(config) - 1})")
    if config[-1]["layer_type"] != "tail" or len(config) < 2:
        _fail(source, f"entry {len(config) - 1}: the last entry must be a 'tail' (the classifier)")
    return config


def read_json(json_path: str) -> Any:
    """Parse a JSON file; unreadable or malformed files fail with one line naming the file."""
    try:
        with open(json_path, "r", encoding="utf-8") as f:
            config = json.load(f)
    except FileNotFoundError:
        _fail(json_path, "file not found")
    except (OSError, UnicodeDecodeError) as e:
        _fail(json_path, f"cannot read: {e}")
    except json.JSONDecodeError as e:
        _fail(json_path, f"invalid JSON: {e}")
    return config


def load_config(json_path: str) -> List[Dict[str, Any]]:
    """Read and validate a GPUNet JSON file."""
    return validate_config(read_json(json_path), source=json_path)


# ----------------------------------------------------------------------------- model
class GPUNet(nn.Layer):
    """A GPUNet built from a validated JSON layer list (see the module docstring)."""

    def __init__(self, config, num_classes: Optional[int] = None, data_format: str = "NCHW",
                 drop_path_rate: Optional[float] = None, dropout: float = 0.2, source: str = "<gpunet config>"):
        super().__init__()
        if data_format not in ("NCHW", "NHWC"):
            raise ConfigError(f"data_format must be 'NCHW' or 'NHWC', got {data_format!r}")
        config = validate_config(config, source)
        if num_classes is not None and (isinstance(num_classes, bool) or not isinstance(num_classes, int)
                                        or num_classes < 1):
            raise ConfigError(f"num_classes must be a positive integer, got {num_classes!r}")
        if not 0.0 <= dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1), got {dropout!r}")
        distill = config[0]["distill"]
        if drop_path_rate is None:
            drop_path_rate = 0.0 if distill else 0.2  # what the reference hard-codes
        if not 0.0 <= drop_path_rate < 1.0:
            raise ConfigError(f"drop_path_rate must be in [0, 1), got {drop_path_rate!r}")
        self.config = config
        self.source = source
        self.distill = distill
        self.data_format = data_format
        self.img_resolution = config[0]["img_resolution"]
        self.num_classes = num_classes if num_classes is not None else config[-1]["num_classes"]
        self.drop_path_rate = drop_path_rate
        n = len(config) - 1
        layers = []
        for i, e in enumerate(config[1:], start=1):
            rate = drop_path_rate * i / n
            layers.append((str(i), self._build_layer(e, rate, dropout, data_format)))
        self.network = nn.Sequential(*layers)
        self.num_features = config[-1]["num_in_channels"]

    def _build_layer(self, e, rate, dropout, df):
        t = e["layer_type"]
        io = (e["num_in_channels"], e["num_out_channels"])
        if t == "tail":
            cls = EpilogueD if self.distill else Epilogue
            return cls(*io, num_classes=self.num_classes, dropout=dropout, data_format=df)
        if self.distill:
            if t == "head":
                return PrologueD(*io, data_format=df)
            if t == "head_large":
                return PrologueLargeD(*io, data_format=df)
            exp = int(e["expansion"])
            if t == "irb":
                return InvertedResidualBlockD(*io, e["kernel_size"], e["stride"], exp, groups=e["groups"],
                                              drop_path_rate=rate, data_format=df)
            return FusedIRBD(*io, e["kernel_size"], e["stride"], exp, drop_path_rate=rate, data_format=df)
        if t == "head":
            return Prologue(*io, act=e.get("act", "swish"), data_format=df)
        if t == "conv":
            return ConvBnAct(*io, e["kernel_size"], e["stride"], act=e["act"], drop_path_rate=rate, data_format=df)
        cls = InvertedResidual if t == "irb" else EdgeResidual
        return cls(*io, kernel_size=e["kernel_size"], stride=e["stride"], exp_ratio=e["expansion"],
                   use_se=e["use_se"], act=e["act"], drop_path_rate=rate, data_format=df)

    @classmethod
    def from_json(cls, json_path, **kwargs):
        return cls(read_json(str(json_path)), source=str(json_path), **kwargs)  # validated in __init__

    def block_table(self):
        """``[(entry_index, layer_type, has_residual, effective_drop_path_rate), ...]``."""
        return [(int(name), self.config[int(name)]["layer_type"], layer.has_residual,
                 layer.effective_drop_path_rate) for name, layer in self.network.named_children()]

    def forward_features(self, x):
        """Everything before the tail: the last feature map (``num_features`` channels)."""
        children = list(self.network.children())
        for layer in children[:-1]:
            x = layer(x)
        return x

    def forward(self, x):
        return self.network(x)


def arch_path(name: str) -> str:
    """Path of a shipped architecture JSON, e.g. ``arch_path("gpunet_0")``."""
    return os.path.join(ARCH_DIR, f"{name}.json")


def _build(name, num_classes, data_format, drop_path_rate, dropout):
    return GPUNet.from_json(arch_path(name), num_classes=num_classes, data_format=data_format,
                            drop_path_rate=drop_path_rate, dropout=dropout)


@MODELS.register("gpunet_0")
def gpunet_0(num_classes=1000, data_format="NCHW", drop_path_rate=0.2, dropout=0.2):
    """GPUNet-0 (0.65 ms GV100), 320 px."""
    return _build("gpunet_0", num_classes, data_format, drop_path_rate, dropout)


@MODELS.register("gpunet_1")
def gpunet_1(num_classes=1000, data_format="NCHW", drop_path_rate=0.2, dropout=0.2):
    """GPUNet-1 (0.85 ms GV100), 288 px."""
    return _build("gpunet_1", num_classes, data_format, drop_path_rate, dropout)


@MODELS.register("gpunet_2")
def gpunet_2(num_classes=1000, data_format="NCHW", drop_path_rate=0.2, dropout=0.2):
    """GPUNet-2 (1.75 ms GV100), 384 px."""
    return _build("gpunet_2", num_classes, data_format, drop_path_rate, dropout)


@MODELS.register("gpunet_p0")
def gpunet_p0(num_classes=1000, data_format="NCHW", drop_path_rate=0.2, dropout=0.2):
    """GPUNet-P0 (0.5 ms GV100), 224 px; non-distill module family."""
    return _build("gpunet_p0", num_classes, data_format, drop_path_rate, dropout)


@MODELS.register("gpunet_p1")
def gpunet_p1(num_classes=1000, data_format="NCHW", drop_path_rate=0.2, dropout=0.2):
    """GPUNet-P1 (0.8 ms GV100), 224 px; non-distill module family."""
    return _build("gpunet_p1", num_classes, data_format, drop_path_rate, dropout)


@MODELS.register("gpunet_d1")
def gpunet_d1(num_classes=1000, data_format="NCHW", drop_path_rate=0.0, dropout=0.2):
    """GPUNet-D1 (1.25 ms GV100), 456 px; distill family (reference: no stochastic depth, so default 0)."""
    return _build("gpunet_d1", num_classes, data_format, drop_path_rate, dropout)


@MODELS.register("gpunet_d2")
def gpunet_d2(num_classes=1000, data_format="NCHW", drop_path_rate=0.0, dropout=0.2):
    """GPUNet-D2 (2.25 ms GV100), 528 px; distill family (reference: no stochastic depth, so default 0)."""
    return _build("gpunet_d2", num_classes, data_format, drop_path_rate, dropout)


@MODELS.register("gpunet_json")
def gpunet_json(json_path, num_classes=None, data_format="NCHW", drop_path_rate=None, dropout=0.2):
    """A GPUNet from a user's JSON file in the reference format.

    ``num_classes=None`` keeps the tail's ``num_classes``; ``drop_path_rate=None`` is the
    reference's hard-coded base (0.2 non-distill, 0.0 distill).
    """
    return GPUNet.from_json(json_path, num_classes=num_classes, data_format=data_format,
                            drop_path_rate=drop_path_rate, dropout=dropout)


GPUNET_NAMES = ("gpunet_0", "gpunet_1", "gpunet_2", "gpunet_p0", "gpunet_p1", "gpunet_d1", "gpunet_d2")
