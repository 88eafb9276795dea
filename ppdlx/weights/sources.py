"""Name mappings from published checkpoint layouts onto ppdlx's parameter names.

One ``Source`` per layout. ``rename(key, ctx)`` answers for one source tensor: the ppdlx
state_dict key it fills, ``Drop(reason)`` for a tensor that is deliberately not a weight, or
``None`` when the key is not part of the layout (it is then reported as left over). For
PyTorch layouts the caller has already turned ``running_mean``/``running_var`` into
``_mean``/``_variance`` and dropped ``num_batches_tracked``; Linear weights are transposed by
the caller too (paddle stores ``[in, out]``). The version strings are written into every
converted checkpoint: bump one when its mapping changes meaning.

Layouts (facts from the reference code; see docs/weights.md):

* ``torchvision`` / ``timm`` ResNet: ``conv1``, ``bn1``, ``layer{1-4}.{b}.conv{1-3}/bn{1-3}``,
  ``downsample.0/1``, ``fc``. ``timm`` EfficientNet (``tf_efficientnet_*`` for TF padding):
  ``conv_stem``, ``bn1``, ``blocks.{s}.{b}.*``, ``conv_head``, ``bn2``, ``classifier``.
* ``dle-paddle-rn50``: ``paddle.static.save`` of DLE's Paddle RN50 v1.5, auto-generated names
  ``conv2d_{i}.w_0``, ``batch_norm_{i}.{w_0,b_0,w_1,w_2}`` (scale, offset, mean, variance),
  ``linear_0.{w_0,b_0}`` numbered in construction order (= ppdlx's layer order).
* ``dle-gpunet``: ``GPUNet_Builder`` modules ``network.<name>.*`` where ``<name>`` carries the
  JSON entry (``head: 2``, ``stage: 1 layer3``, `` layer15``; distill ``head:``, ``stage: 0 irb3``,
  ``tail:``): the number after ``layer``/``irb`` is entry + 1.
* ``effdet``: ``tf_efficientdet_d0`` -- ``backbone.*`` (timm EfficientNet), ``fpn.resample.3``
  (P6), ``fpn.cell.{c}.fnode.{n}.combine.{edge_weights,resample.{input}}``, ``after_combine``,
  ``{class,box}_net.{conv_rep,bn_rep,predict}``.
* ``lukemelas``: EfficientNet-PyTorch (``_conv_stem``, ``_bn0``, ``_blocks.{i}``, ``_conv_head``,
  ``_bn1``, ``_fc``); the blocks are numbered flat over all stages.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import paddle.nn as nn

from ppdlx.models.efficientdet import BIFPN_NODES, EfficientDet
from ppdlx.models.efficientnet import EfficientNet
from ppdlx.models.gpunet import GPUNet
from ppdlx.models.resnet import ResNet


@dataclass(frozen=True)
class Drop:
    reason: str


class MappingContext:
    """What a rename may look at: the source keys, the target model (a probe instance)."""

    def __init__(self, source_keys, model):
        self.source_keys = set(source_keys)
        self.model = model
        self._cache = {}

    def layers(self, kinds) -> list:
        """Target sub-layer names of the given types, in construction order."""
        key = ("layers", kinds)
        if key not in self._cache:
            self._cache[key] = [name for name, layer in self.model.named_sublayers() if isinstance(layer, kinds)]
        return self._cache[key]

    def stage_lengths(self, prefix="") -> list:
        key = ("stages", prefix)
        if key not in self._cache:
            stages = self.model.backbone.stages if prefix else self.model.stages
            self._cache[key] = [len(stage) for stage in stages]
        return self._cache[key]

    def source_indices(self, pattern) -> list:
        key = ("indices", pattern)
        if key not in self._cache:
            found = {int(m.group(1)) for k in self.source_keys for m in [re.match(pattern, k)] if m}
            self._cache[key] = sorted(found)
        return self._cache[key]


@dataclass(frozen=True)
class Source:
    name: str
    framework: str  # "torch" or "paddle"
    model_types: Tuple[type, ...]
    version: str
    summary: str
    rename: Callable[[str, MappingContext], object]
    # (source key, array, target shape) -> array, for the few layout quirks beyond renaming
    adapt: Optional[Callable] = None


def _sub(rules, key):
    for pattern, template in rules:
        m = re.fullmatch(pattern, key)
        if m:
            return m.expand(template)
    return None


# ------------------------------------------------------------------------------------ ResNet
_RESNET_RULES = (
    (r"conv1\.weight", r"stem.conv.weight"),
    (r"bn1\.(\w+)", r"stem.bn.\1"),
    (r"fc\.(weight|bias)", r"fc.\1"),
    (r"layer(\d)\.(\d+)\.conv([123])\.weight", r"stages.{s}.\2.conv\3.conv.weight"),
    (r"layer(\d)\.(\d+)\.bn([123])\.(\w+)", r"stages.{s}.\2.conv\3.bn.\4"),
    (r"layer(\d)\.(\d+)\.downsample\.0\.weight", r"stages.{s}.\2.shortcut.conv.weight"),
    (r"layer(\d)\.(\d+)\.downsample\.1\.(\w+)", r"stages.{s}.\2.shortcut.bn.\3"),
)


def rename_torch_resnet(key, ctx):
    m = re.match(r"layer(\d)\.", key)
    rules = [(p, t.replace("{s}", str(int(m.group(1)) - 1)) if m else t) for p, t in _RESNET_RULES]
    return _sub(rules, key)


# ------------------------------------------------------------------------------- EfficientNet
_DS_BLOCK = {"conv_dw": "depthwise.conv", "bn1": "depthwise.bn", "se.conv_reduce": "se.reduce",
             "se.conv_expand": "se.expand", "conv_pw": "project.conv", "bn2": "project.bn"}
_IR_BLOCK = {"conv_pw": "expand.conv", "bn1": "expand.bn", "conv_dw": "depthwise.conv", "bn2": "depthwise.bn",
             "se.conv_reduce": "se.reduce", "se.conv_expand": "se.expand", "conv_pwl": "project.conv",
             "bn3": "project.bn"}
_TIMM_TOP = {"conv_stem": "stem.conv", "bn1": "stem.bn", "conv_head": "head.conv", "bn2": "head.bn",
             "classifier": "fc"}


def _split_param(key):
    layer, _, param = key.rpartition(".")
    return layer, param


def rename_timm_efficientnet(key, ctx, prefix=""):
    """timm EfficientNet (also effdet's backbone under ``prefix='backbone.'``)."""
    if not key.startswith(prefix):
        return None
    rest = key[len(prefix):]
    m = re.fullmatch(r"blocks\.(\d+)\.(\d+)\.(.+)", rest)
    if m:
        stage, block, inner = m.groups()
        layer, param = _split_param(inner)
        # depthwise-separable blocks (expand ratio 1) have no conv_pwl; their conv_pw projects
        block_src = f"{prefix}blocks.{stage}.{block}"
        table = _IR_BLOCK if f"{block_src}.conv_pwl.weight" in ctx.source_keys else _DS_BLOCK
        return f"{prefix}stages.{stage}.{block}.{table[layer]}.{param}" if layer in table else None
    layer, param = _split_param(rest)
    if layer in _TIMM_TOP and (prefix == "" or layer in ("conv_stem", "bn1")):
        return f"{prefix}{_TIMM_TOP[layer]}.{param}"
    return None


def rename_timm(key, ctx):
    if isinstance(ctx.model, ResNet):
        return rename_torch_resnet(key, ctx)
    return rename_timm_efficientnet(key, ctx)


_LUKEMELAS_BLOCK = {"_expand_conv": "expand.conv", "_bn0": "expand.bn", "_depthwise_conv": "depthwise.conv",
                    "_bn1": "depthwise.bn", "_se_reduce": "se.reduce", "_se_expand": "se.expand",
                    "_project_conv": "project.conv", "_bn2": "project.bn"}
_LUKEMELAS_TOP = {"_conv_stem": "stem.conv", "_bn0": "stem.bn", "_conv_head": "head.conv", "_bn1": "head.bn",
                  "_fc": "fc"}


def rename_lukemelas(key, ctx):
    m = re.fullmatch(r"_blocks\.(\d+)\.(.+)", key)
    if m is None:
        layer, param = _split_param(key)
        return f"{_LUKEMELAS_TOP[layer]}.{param}" if layer in _LUKEMELAS_TOP else None
    flat, (layer, param) = int(m.group(1)), _split_param(m.group(2))
    for stage, length in enumerate(ctx.stage_lengths()):
        if flat < length:
            return f"stages.{stage}.{flat}.{_LUKEMELAS_BLOCK[layer]}.{param}" if layer in _LUKEMELAS_BLOCK else None
        flat -= length
    return None


# ----------------------------------------------------------------------------- DLE Paddle RN50
_STATIC_PARAM = {"conv2d": {"w_0": "weight"}, "batch_norm": {"w_0": "weight", "b_0": "bias", "w_1": "_mean",
                                                            "w_2": "_variance"},
                 "linear": {"w_0": "weight", "b_0": "bias"}}
_STATIC_LAYER_TYPES = {"conv2d": nn.Conv2D, "batch_norm": (nn.BatchNorm, nn.BatchNorm2D), "linear": nn.Linear}


def rename_paddle_static(key, ctx):
    """``<type>_<i>.<w|b>_<j>``: the i-th layer of that type (by rank of i) in construction order."""
    m = re.fullmatch(r"(conv2d|batch_norm|linear)_(\d+)\.([wb]_\d+)", key)
    if m is None:
        return None
    kind, index, slot = m.group(1), int(m.group(2)), m.group(3)
    param = _STATIC_PARAM[kind].get(slot)
    ranks = ctx.source_indices(rf"{kind}_(\d+)\.")
    layers = ctx.layers(_STATIC_LAYER_TYPES[kind])
    rank = ranks.index(index)
    if param is None or rank >= len(layers):
        return None
    return f"{layers[rank]}.{param}"


def adapt_dle_stem(key, array, target_shape):
    """DLE trains on 4-channel input whose 4th channel is zero padding (DALI ``pad_output``):
    its weights never see a non-zero value, so a 3-channel model keeps the first three."""
    if (array.ndim == 4 and len(target_shape) == 4 and array.shape[1] == 4 and target_shape[1] == 3
            and array.shape[0] == target_shape[0] and array.shape[2:] == tuple(target_shape[2:])):
        return array[:, :3], "stem conv: the zero-padding 4th input channel of DLE's 4-channel input dropped"
    return array, None


# ------------------------------------------------------------------------------------ GPUNet
def rename_gpunet(key, ctx):
    m = re.fullmatch(r"network\.([^.]+)\.(.+)", key)
    if m is None:
        return None
    module, rest = m.group(1).strip(), m.group(2)
    config = ctx.model.config
    if module.startswith("head"):
        entry = next(i for i, e in enumerate(config) if e["layer_type"].startswith("head"))
    elif module.startswith("tail"):
        entry = len(config) - 1
    else:
        number = re.search(r"(?:layer|irb)(\d+)$", module)
        if number is None:
            return None
        entry = int(number.group(1)) - 1  # the builder counts the data entry as 1
    return f"network.{entry}.{rest}"


# ------------------------------------------------------------------------------- EfficientDet
def rename_effdet(key, ctx):
    if key.startswith("backbone."):
        return rename_timm_efficientnet(key, ctx, prefix="backbone.")
    rules = (
        (r"fpn\.resample\.3\.conv\.conv\.(\w+)", r"fpn.p6.conv.\1"),
        (r"fpn\.resample\.3\.conv\.bn\.(\w+)", r"fpn.p6.bn.\1"),
        (r"fpn\.cell\.(\d+)\.fnode\.(\d+)\.combine\.edge_weights", r"fpn.cells.\1.nodes.\2.fusion_weights"),
        (r"fpn\.cell\.(\d+)\.fnode\.(\d+)\.after_combine\.conv\.conv_dw\.weight",
         r"fpn.cells.\1.nodes.\2.conv.depthwise.weight"),
        (r"fpn\.cell\.(\d+)\.fnode\.(\d+)\.after_combine\.conv\.conv_pw\.(\w+)",
         r"fpn.cells.\1.nodes.\2.conv.pointwise.\3"),
        (r"fpn\.cell\.(\d+)\.fnode\.(\d+)\.after_combine\.conv\.bn\.(\w+)", r"fpn.cells.\1.nodes.\2.bn.\3"),
        (r"(class_net|box_net)\.conv_rep\.(\d+)\.conv_dw\.weight", r"\1.convs.\2.depthwise.weight"),
        (r"(class_net|box_net)\.conv_rep\.(\d+)\.conv_pw\.(\w+)", r"\1.convs.\2.pointwise.\3"),
        (r"(class_net|box_net)\.bn_rep\.(\d+)\.(\d+)\.bn\.(\w+)", r"\1.bns.\2.\3.\4"),
        (r"(class_net|box_net)\.predict\.conv_dw\.weight", r"\1.predict.depthwise.weight"),
        (r"(class_net|box_net)\.predict\.conv_pw\.(\w+)", r"\1.predict.pointwise.\2"),
    )
    m = re.fullmatch(r"fpn\.cell\.(\d+)\.fnode\.(\d+)\.combine\.resample\.(\d+)\.conv\.(conv|bn)\.(\w+)", key)
    if m:  # resample modules are keyed by input id; ppdlx lists them in the node's input order
        cell, node, input_id, part, param = m.groups()
        inputs = BIFPN_NODES[int(node)][1]
        if int(input_id) not in inputs:
            return None
        return f"fpn.cells.{cell}.nodes.{node}.resample.{inputs.index(int(input_id))}.{part}.{param}"
    return _sub(rules, key)


SOURCES = {s.name: s for s in (
    Source("torchvision", "torch", (ResNet,), "torchvision-resnet/1",
           "torchvision ResNet state_dict (resnet50-*.pth)", rename_torch_resnet),
    Source("timm", "torch", (ResNet, EfficientNet), "timm/1",
           "timm ResNet or EfficientNet (tf_efficientnet_* for TF 'same' padding); .pth or .safetensors",
           rename_timm),
    Source("dle-paddle-rn50", "paddle", (ResNet,), "dle-paddle-rn50/1",
           "NVIDIA DeepLearningExamples PaddlePaddle RN50 v1.5 (paddle.static.save .pdparams)",
           rename_paddle_static, adapt_dle_stem),
    Source("dle-gpunet", "torch", (GPUNet,), "dle-gpunet/1",
           "NVIDIA DeepLearningExamples PyTorch GPUNet (GPUNet_Builder state_dict, .pth.tar)", rename_gpunet),
    Source("effdet", "torch", (EfficientDet,), "effdet-d0/1",
           "rwightman/efficientdet-pytorch tf_efficientdet_d0", rename_effdet),
    Source("lukemelas", "torch", (EfficientNet,), "lukemelas-efficientnet/1",
           "lukemelas EfficientNet-PyTorch (efficientnet-b0/-lite0 .pth)", rename_lukemelas),
)}


# Key signatures for "which layout is this file": (source, keys that must all be present).
_SIGNATURES = (
    ("dle-gpunet", lambda keys: any(k.startswith("network.") and ":" in k for k in keys)),
    ("dle-paddle-rn50", lambda keys: "conv2d_0.w_0" in keys or any(k.startswith("batch_norm_") for k in keys)),
    ("effdet", lambda keys: "backbone.conv_stem.weight" in keys and any(k.startswith("fpn.") for k in keys)),
    ("lukemelas", lambda keys: "_conv_stem.weight" in keys),
    ("timm", lambda keys: "conv_stem.weight" in keys),
    ("torchvision", lambda keys: "conv1.weight" in keys and any(k.startswith("layer1.") for k in keys)),
)


def detect_source(keys) -> Optional[str]:
    """The source whose layout these (wrapper-stripped) state_dict keys follow, or None (e.g. ppdlx's own)."""
    keys = set(keys)
    return next((name for name, matches in _SIGNATURES if matches(keys)), None)
