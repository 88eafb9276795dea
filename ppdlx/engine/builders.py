"""Compose the pieces a run needs from a validated config (the only place that does)."""
from __future__ import annotations

import difflib
import inspect
import logging
import os
import random

import numpy as np
import paddle

from ppdlx.errors import ConfigError, UnsupportedError
from ppdlx.quantization.qat import quantize_model
from ppdlx.registry import MODELS

log = logging.getLogger("ppdlx")


def resolve_device(device: str) -> str:
    has_gpu = paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0
    if device == "gpu" and not has_gpu:
        raise UnsupportedError("global.device=gpu: this Paddle build has no CUDA device "
                               "(paddle.is_compiled_with_cuda() is %s); use global.device=cpu"
                               % paddle.is_compiled_with_cuda())
    if device == "auto":
        device = "gpu" if has_gpu else "cpu"
    if device == "gpu":
        return f"gpu:{int(os.environ.get('FLAGS_selected_gpus', '0').split(',')[0])}"
    return "cpu"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    paddle.seed(seed)


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
    import ppdlx.models  # noqa: F401  (registers every family)
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


def count_trainable_params(model) -> int:
    """The parameters the optimizer updates (frozen ones and BN statistics left out); ppdlx.models.info.count_params
    counts every weight, frozen or not."""
    return int(sum(int(np.prod(p.shape)) for p in model.parameters() if not p.stop_gradient))
