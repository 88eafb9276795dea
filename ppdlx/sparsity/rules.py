"""Which weights get an n:m mask: explicit, configurable eligibility rules.

A weight is pruned when all of these hold (the first failing rule is the reason
shown in the per-layer table):

1. its layer is a ``paddle.nn.Conv2D`` or ``paddle.nn.Linear`` listed in
   ``layer_types`` (other layers -- BN, Conv2DTranspose, custom parameters -- are
   never pruned);
2. a conv is not grouped or depthwise (``groups == 1``: TensorRT's sparse kernels
   are plain GEMM-style convs);
3. its input-channel count (Cin of ``[Cout, Cin, kh, kw]``; ``in`` of a Linear's
   ``[in, out]``) is a multiple of ``m`` (skips e.g. the 3-channel RGB stem);
4. it is not the classifier, unless ``prune_classifier`` -- the classifier is the
   last Linear (or conv) whose output width is ``model.num_classes`` (the last
   Linear if the model has no ``num_classes``);
5. neither the layer name nor the parameter name matches an ``exclude`` pattern
   (``fnmatch``, e.g. ``"stages.0.*"``, ``"*.shortcut.conv"``).
"""
from __future__ import annotations

import fnmatch
from dataclasses import asdict, dataclass, field
from typing import List, Optional, Tuple

import paddle.nn as nn
from paddle.nn.quant.qat import QuantedConv2D, QuantedLinear

from ppdlx.errors import ConfigError

from ppdlx.sparsity.masks import ALGOS, KINDS

# A quantization-aware-trained model's layers (paddle.quantization.QAT) hold the same weight parameters.
CONV_LAYERS = (nn.Conv2D, QuantedConv2D)
LINEAR_LAYERS = (nn.Linear, QuantedLinear)


@dataclass(frozen=True)
class SparsityRules:
    n: int = 2
    m: int = 4
    mask_algo: str = "mask_1d"
    exclude: Tuple[str, ...] = ()
    prune_classifier: bool = False
    layer_types: Tuple[str, ...] = KINDS

    def __post_init__(self):
        if not 0 < self.n < self.m:
            raise ValueError(f"asp: need 0 < n < m, got n={self.n}, m={self.m}")
        if self.mask_algo not in ALGOS:
            raise ValueError(f"asp.mask_algo={self.mask_algo!r}: known {', '.join(ALGOS)}")
        bad = [t for t in self.layer_types if t not in KINDS]
        if bad:
            raise ValueError(f"asp.layer_types: unknown {bad} (known: {', '.join(KINDS)})")
        object.__setattr__(self, "exclude", tuple(self.exclude))
        object.__setattr__(self, "layer_types", tuple(self.layer_types))

    @classmethod
    def from_config(cls, asp_cfg) -> "SparsityRules":
        if asp_cfg.n >= asp_cfg.m:
            raise ConfigError(f"asp.n={asp_cfg.n}, asp.m={asp_cfg.m}: an n:m pattern keeps n of every m weights, "
                              f"so n must be smaller than m (TensorRT's pattern is n=2, m=4)")
        return cls(n=asp_cfg.n, m=asp_cfg.m, mask_algo=asp_cfg.mask_algo, exclude=tuple(asp_cfg.exclude),
                   prune_classifier=asp_cfg.prune_classifier,
                   layer_types=tuple(getattr(asp_cfg, "layer_types", KINDS)))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["exclude"], d["layer_types"] = list(self.exclude), list(self.layer_types)
        return d

    @property
    def pattern(self) -> str:
        return f"{self.n}:{self.m}"

    def excluded(self, *names: str) -> Optional[str]:
        for pattern in self.exclude:
            if any(fnmatch.fnmatchcase(name, pattern) for name in names):
                return pattern
        return None


@dataclass
class LayerEntry:
    """One Conv2D / Linear weight and the verdict of the rules."""
    param: str                 # structured parameter name (state_dict key), e.g. "stages.0.0.conv1.conv.weight"
    layer: str                 # layer name, e.g. "stages.0.0.conv1.conv"
    kind: str                  # "conv2d" | "linear"
    shape: List[int]
    in_channels: int           # per group for convs
    prune: bool
    reason: str = ""           # why not pruned
    tensor: object = field(default=None, repr=False)  # the paddle parameter


def _classifier_layer(model) -> Optional[str]:
    num_classes = getattr(model, "num_classes", None)
    last_linear, last_match = None, None
    for name, layer in model.named_sublayers():
        if isinstance(layer, LINEAR_LAYERS):
            last_linear = name
            if num_classes is not None and layer.weight.shape[1] == num_classes:
                last_match = name
        elif isinstance(layer, CONV_LAYERS) and num_classes is not None and layer.weight.shape[0] == num_classes:
            last_match = name
    return last_match if last_match is not None else (last_linear if num_classes is None else None)


def scan_model(model, rules: SparsityRules) -> List[LayerEntry]:
    """Every Conv2D / Linear weight of ``model`` with its verdict, in registration order."""
    classifier = _classifier_layer(model)
    entries = []
    for lname, layer in model.named_sublayers():
        if isinstance(layer, CONV_LAYERS):  # Conv2DTranspose is not a Conv2D subclass
            kind = "conv2d"
        elif isinstance(layer, LINEAR_LAYERS):
            kind = "linear"
        else:
            continue
        w = layer.weight
        if w is None:
            continue
        shape = [int(s) for s in w.shape]
        cin = shape[1] if kind == "conv2d" else shape[0]
        entry = LayerEntry(param=f"{lname}.weight", layer=lname, kind=kind, shape=shape, in_channels=cin,
                           prune=False, tensor=w)
        groups = int(getattr(layer, "_groups", 1) or 1) if kind == "conv2d" else 1
        pattern = rules.excluded(lname, entry.param)
        if kind not in rules.layer_types:
            entry.reason = f"layer type {kind} not in asp.layer_types"
        elif groups > 1:
            entry.reason = "depthwise conv" if cin == 1 else f"grouped conv (groups={groups})"
        elif cin % rules.m:
            entry.reason = f"{cin} input channels not a multiple of {rules.m}"
        elif lname == classifier and not rules.prune_classifier:
            entry.reason = "classifier (asp.prune_classifier=false)"
        elif pattern is not None:
            entry.reason = f"excluded by pattern '{pattern}'"
        else:
            entry.prune = True
        entries.append(entry)
    return entries
