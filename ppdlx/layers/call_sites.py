"""Quantization points per call site of a shared layer.

A detector head runs the same convolutions on every pyramid level, whose activations differ by orders of
magnitude. Quantization-aware training gives each quantized convolution one input range, a moving average over
its calls, so a shared convolution's range would follow whichever levels ran last: the largest levels clipped,
the smallest rounded to zero. A layer that shares convolutions over call sites places a quantization point
(``paddle.nn.quant.Stub``: the identity until QAT fills it with a quanter) before each convolution at each site
and says which stubs feed which convolution; the QAT config (``ppdlx.models.qat``) then gives those convolutions
no input quanter of their own, and the export writes one input range per call.
"""
from __future__ import annotations

from typing import List, Tuple

import paddle.nn as nn


class CallSiteQuantized:
    """Mixin of a layer whose convolutions run at several call sites, each input quantized at its site."""

    def site_inputs(self) -> List[Tuple[nn.Layer, List[nn.Layer]]]:
        """``(convolution, [its input stub at each call, in call order])`` for every shared convolution."""
        raise NotImplementedError


def site_quantized_convs(model: nn.Layer) -> List[Tuple[nn.Layer, List[nn.Layer]]]:
    """Every ``(convolution, input stubs)`` pair of the model's :class:`CallSiteQuantized` layers."""
    return [pair for layer in model.sublayers(include_self=True) if isinstance(layer, CallSiteQuantized)
            for pair in layer.site_inputs()]
