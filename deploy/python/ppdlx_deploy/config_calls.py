"""``paddle.inference.Config`` calls as data: a plan is a list of ``{"call", "args", "kwargs"}``
that can be inspected and tested without building a predictor, and applied to a real ``Config``."""
from __future__ import annotations

import os
from typing import Sequence


def plan_call(name, *args, **kwargs) -> dict:
    """One ``Config`` method call as data: ``{"call", "args", "kwargs"}``."""
    return {"call": name, "args": list(args), "kwargs": dict(kwargs)}


# Paddle releases before the oneDNN renaming spell these methods "mkldnn".
_ALIASES = {"enable_onednn": "enable_mkldnn", "enable_onednn_bfloat16": "enable_mkldnn_bfloat16",
            "enable_onednn_int8": "enable_mkldnn_int8"}


def apply_plan(config, calls: Sequence[dict]):
    """Apply plan calls to a ``paddle.inference.Config`` (resolving precision names and the
    onednn/mkldnn method names of older Paddle releases)."""
    from paddle.inference import PrecisionType  # paddle loads on use (see the package's docstring)
    for step in calls:
        name = step["call"]
        if not hasattr(config, name) and name in _ALIASES:
            name = _ALIASES[name]
        kwargs = dict(step["kwargs"])
        for key in ("precision_mode", "inference_precision"):
            if key in kwargs:
                kwargs[key] = getattr(PrecisionType, kwargs[key])
        args = list(step["args"])
        if name == "set_optim_cache_dir":
            # Paddle creates only the last folder of the path (a single mkdir) and fails without its parent
            os.makedirs(args[0], exist_ok=True)
        if name in ("enable_onednn_int8", "enable_mkldnn_int8") and args:
            args[0] = set(args[0])  # plans are plain data (lists); pybind takes only a set here
        getattr(config, name)(*args, **kwargs)
    return config
