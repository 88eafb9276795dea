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

The modules live in ``gpunet_blocks`` (built from ``ppdlx.layers``), the JSON validation in
``gpunet_config``.
"""
from __future__ import annotations

import os
from typing import Optional

import paddle.nn as nn

from ppdlx.errors import ConfigError
from ppdlx.models.gpunet_blocks import (ConvBnAct, EdgeResidual, Epilogue, EpilogueD, FusedIRBD, InvertedResidual,
                                        InvertedResidualBlockD, Prologue, PrologueD, PrologueLargeD)
from ppdlx.models.gpunet_config import load_config, read_json, validate_config
from ppdlx.models.model_cfg import check_num_classes, classification_cfg
from ppdlx.registry import MODELS

__all__ = ["GPUNET_NAMES", "GPUNet", "arch_path", "load_config", "read_json", "validate_config"]

ARCH_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpunet_archs")


class GPUNet(nn.Layer):
    """A GPUNet built from a validated JSON layer list (see the module docstring)."""

    def __init__(self, config, num_classes: Optional[int] = None, data_format: str = "NCHW",
                 drop_path_rate: Optional[float] = None, dropout: float = 0.2, source: str = "<gpunet config>",
                 crop_pct: float = 1.0):
        super().__init__()
        if data_format not in ("NCHW", "NHWC"):
            raise ConfigError(f"data_format must be 'NCHW' or 'NHWC', got {data_format!r}")
        config = validate_config(config, source)
        if num_classes is not None:
            check_num_classes(num_classes)
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
        classifier = f"network.{n}.{self.network[-1].classifier_name}"
        self.default_cfg = classification_cfg(self.img_resolution, crop_pct, "bicubic", classifier=classifier)

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

    def reset_classifier(self, num_classes):
        """A new, freshly initialised linear layer at the end of the tail with ``num_classes`` outputs;
        every other weight is kept."""
        self.num_classes = check_num_classes(num_classes)
        self.network[-1].reset_classifier(num_classes)

    def forward_features(self, x):
        """Everything before the tail: the last feature map (``num_features`` channels)."""
        children = list(self.network.children())
        for layer in children[:-1]:
            x = layer(x)
        return x

    def forward_head(self, features):
        """The tail: 1x1 conv, BN, ReLU, pooling, [1x1 conv, ReLU,] dropout, linear."""
        return self.network[-1](features)

    def forward(self, x):
        return self.network(x)


def arch_path(name: str) -> str:
    """Path of a shipped architecture JSON, e.g. ``arch_path("gpunet_0")``."""
    return os.path.join(ARCH_DIR, f"{name}.json")


# Evaluation crop of the NVIDIA recipes (the configs/gpunet/*.yaml crop_pct); 1.0 for the others.
EVAL_CROP_PCT = {"gpunet_p0": 0.875, "gpunet_p1": 0.875}


def _build(name, num_classes, data_format, drop_path_rate, dropout):
    return GPUNet.from_json(arch_path(name), num_classes=num_classes, data_format=data_format,
                            drop_path_rate=drop_path_rate, dropout=dropout, crop_pct=EVAL_CROP_PCT.get(name, 1.0))


# The published architectures: (eval resolution and GV100 latency, default drop_path_rate). The distill family's
# reference has no stochastic depth, so its default is 0.
ARCHITECTURES = {
    "gpunet_0": ("GPUNet-0 (0.65 ms GV100), 320 px.", 0.2),
    "gpunet_1": ("GPUNet-1 (0.85 ms GV100), 288 px.", 0.2),
    "gpunet_2": ("GPUNet-2 (1.75 ms GV100), 384 px.", 0.2),
    "gpunet_p0": ("GPUNet-P0 (0.5 ms GV100), 224 px; non-distill module family.", 0.2),
    "gpunet_p1": ("GPUNet-P1 (0.8 ms GV100), 224 px; non-distill module family.", 0.2),
    "gpunet_d1": ("GPUNet-D1 (1.25 ms GV100), 456 px; distill family.", 0.0),
    "gpunet_d2": ("GPUNet-D2 (2.25 ms GV100), 528 px; distill family.", 0.0),
}


def _register(name: str, doc: str, drop_path_default: float):
    def build(num_classes=1000, data_format="NCHW", drop_path_rate=drop_path_default, dropout=0.2):
        return _build(name, num_classes, data_format, drop_path_rate, dropout)
    build.__name__, build.__qualname__, build.__doc__ = name, name, doc
    return MODELS.register(name)(build)


for _name, (_doc, _drop_path) in ARCHITECTURES.items():
    _register(_name, _doc, _drop_path)


@MODELS.register("gpunet_json")
def gpunet_json(json_path, num_classes=None, data_format="NCHW", drop_path_rate=None, dropout=0.2):
    """A GPUNet from a user's JSON file in the reference format.

    ``num_classes=None`` keeps the tail's ``num_classes``; ``drop_path_rate=None`` is the
    reference's hard-coded base (0.2 non-distill, 0.0 distill).
    """
    return GPUNet.from_json(json_path, num_classes=num_classes, data_format=data_format,
                            drop_path_rate=drop_path_rate, dropout=dropout)


GPUNET_NAMES = tuple(ARCHITECTURES)
