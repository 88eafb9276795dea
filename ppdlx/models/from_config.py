"""The model a config names: ``model.name`` built from ``MODELS`` with ``model.args`` checked against the
builder's signature (an unknown argument is one line with "did you mean"), at ``model.data_format``."""
from __future__ import annotations

import difflib
import inspect

from ppdlx.errors import ConfigError, UnsupportedError
from ppdlx.models.qat import quantize_model
from ppdlx.registry import MODELS


def check_builder_args(name: str, args: dict) -> None:
    builder = MODELS.get(name)
    params = inspect.signature(builder).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return
    allowed = [k for k in params if k not in ("num_classes", "data_format")]
    for key in args:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.5)
            hint = f"did you mean 'model.args.{close[0]}'?" if close else \
                f"'{name}' takes: {', '.join(allowed) or 'no extra arguments'}"
            raise ConfigError(f"model.args.{key}: unknown argument for model '{name}' "
                              f"(value {args[key]!r}); {hint}")


def build_model(cfg, num_classes=None):
    """``cfg.model`` built (``num_classes`` overrides ``model.num_classes``); every family is registered by
    ``ppdlx.models``, which Python imports before this module."""
    m = cfg.model
    MODELS.get(m.name)  # unknown name -> one line with "did you mean"
    check_builder_args(m.name, m.args)
    return with_quantization(cfg, build_registered(m.name, num_classes or m.num_classes,
                                                   {"data_format": m.data_format, **m.args}))


def with_quantization(cfg, model):
    """``model`` in its quantization-aware-training form when ``qat.enabled``. Decided here, where every
    model is built, so training in every graph mode, evaluation and export all get the same layers."""
    if cfg.qat.enabled:
        counts = quantize_model(model, cfg.qat.moving_rate)
        if not counts["conv"] and not counts["linear"]:
            raise UnsupportedError(f"qat.enabled: model.name={cfg.model.name} has no paddle.nn.Conv2D or Linear "
                                   f"layer to quantize")
    return model


def build_registered(name: str, num_classes: int, args: dict):
    """``MODELS.build`` that records ``(name, args)`` as ``model.build_spec``: what importing a foreign
    checkpoint needs to build the same architecture at other class counts (``checkpoint.load_weights``)."""
    model = MODELS.build(name, num_classes=num_classes, **args)
    model.build_spec = (name, dict(args))
    return model
