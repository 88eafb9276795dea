"""Quantization-aware training: a built model with fake quantization where NVIDIA's QAT has it.

NVIDIA's PaddlePaddle ResNet50 (DeepLearningExamples ``RN50v1.5``, ``--qat``) rewrites its static
program with ``paddle.static.quantization.quant_aware`` through fleet's ``QATOptimizer``: the inputs of
``conv2d``, ``depthwise_conv2d``, ``mul``/``matmul``/``matmul_v2`` get fake quantize-dequantize ops,
weights per output channel (``channel_wise_abs_max``) and activations per tensor with a moving average
of each batch's abs max (``moving_average_abs_max``), and ``AddQuantDequantForResidual`` adds one on the
earlier input of each residual add. Paddle's quant_aware rewrites legacy programs only
(``IrGraph(core.Graph(program.desc))``), so ppdlx builds the same set on the *model* with Paddle's
dygraph API, ``paddle.quantization.QAT``: every ``paddle.nn.Conv2D`` (depthwise too) and ``Linear``
becomes Paddle's ``QuantedConv2D`` / ``QuantedLinear``, and every ``paddle.nn.quant.Stub`` a model
places before a residual add becomes a quanter. The one model then trains in every graph mode: eager,
``to_static`` and the static (PIR) programs are traced from it.

Paddle 3.3.1 ships only a per-tensor quanter for that API (``paddle.quantization.quanters``:
``FakeQuanterWithAbsMaxObserver``), so the per-channel weight quanter is ppdlx's own,
:class:`ChannelWiseAbsMaxQuanterLayer`, built on Paddle's ``fake_channel_wise_quantize_dequantize_abs_max``
op (the one quant_aware inserts for weights), in dynamic, PIR and legacy-IR programs alike.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Dict, Iterator, List, Tuple

import numpy as np
import paddle
import paddle.nn as nn
from paddle import _C_ops
from paddle.base.layer_helper import LayerHelper
from paddle.nn.quant.qat import QuantedConv2D, QuantedLinear
from paddle.nn.quant.stub import QuanterStub, Stub
from paddle.quantization import QAT, BaseQuanter, QuantConfig
from paddle.quantization.factory import QuanterFactory
from paddle.quantization.quanters.abs_max import FakeQuanterWithAbsMaxObserverLayer

from ppdlx.errors import UnsupportedError
from ppdlx.layers.call_sites import site_quantized_convs
from ppdlx.layers.conv import Conv2D

BITS = 8
ROUND_HALF_TO_EVEN = 0  # the fake ops' round_type: as quantize_linear, ONNX, TensorRT and oneDNN round
DEFAULT_MOVING_RATE = 0.9  # quant_aware's default, NVIDIA's QAT config keeps it
# The op types of a Paddle program whose inputs NVIDIA's QAT quantizes (fleet QATOptimizer._gen_qat_config).
NVIDIA_QUANTIZED_OPS = ("conv2d", "depthwise_conv2d", "mul", "matmul", "matmul_v2")
QUANTED_LAYERS = (QuantedConv2D, QuantedLinear)


class ChannelWiseAbsMaxQuanter(QuanterFactory):
    """Factory of :class:`ChannelWiseAbsMaxQuanterLayer` for a ``QuantConfig`` (weights only)."""

    def __init__(self, bit_length: int = BITS):
        super().__init__(bit_length=bit_length)

    def _get_class(self):
        return ChannelWiseAbsMaxQuanterLayer


class ChannelWiseAbsMaxQuanterLayer(BaseQuanter):
    """Fake-quantizes a weight with one abs-max scale per output channel, recomputed from the weight at
    every call (``channel_wise_abs_max``); the scales of the last call are kept in ``_scale``, a
    non-trainable parameter (so checkpoints and the export carry them). Output channels are axis 0 of
    a convolution's ``[out, in/groups, kh, kw]`` weight and axis 1 of a ``Linear``'s ``[in, out]``."""

    def __init__(self, layer: nn.Layer, bit_length: int = BITS):
        super().__init__()
        self._bit_length = bit_length
        self._axis = 1 if isinstance(layer, nn.Linear) else 0
        self._scale = self.create_parameter(
            [layer.weight.shape[self._axis]], dtype="float32",
            attr=paddle.ParamAttr(initializer=nn.initializer.Constant(0.0), trainable=False))
        self._scale.stop_gradient = True

    def forward(self, weight):
        if paddle.in_dynamic_mode() or paddle.base.framework.in_pir_mode():
            out, scale = _C_ops.fake_channel_wise_quantize_dequantize_abs_max(weight, self._bit_length,
                                                                              ROUND_HALF_TO_EVEN, self._axis)
            _C_ops.assign_out_(scale, self._scale)
            return out
        # legacy IR: what the int8 export traces (ppdlx.export.int8), the op quant_aware inserts
        helper = LayerHelper("fake_channel_wise_quantize_dequantize_abs_max")
        out = helper.create_variable_for_type_inference(weight.dtype)
        helper.append_op(type="fake_channel_wise_quantize_dequantize_abs_max", inputs={"X": [weight]},
                         outputs={"Out": [out], "OutScale": [self._scale]},
                         attrs={"bit_length": self._bit_length, "round_type": ROUND_HALF_TO_EVEN,
                                "quant_axis": self._axis})
        return out

    def scales(self):
        return self._scale

    def zero_points(self):
        return None

    def quant_axis(self):
        return self._axis

    def bit_length(self):
        return self._bit_length


class MovingAverageAbsMaxQuanter(QuanterFactory):
    """Factory of :class:`MovingAverageAbsMaxQuanterLayer` (activations)."""

    def __init__(self, moving_rate: float = DEFAULT_MOVING_RATE, bit_length: int = BITS):
        super().__init__(moving_rate=moving_rate, bit_length=bit_length)

    def _get_class(self):
        return MovingAverageAbsMaxQuanterLayer


class MovingAverageAbsMaxQuanterLayer(FakeQuanterWithAbsMaxObserverLayer):
    """Paddle's per-tensor activation quanter (``moving_average_abs_max``: the range is a moving average of
    each batch's abs max), with two changes. It rounds half to even (``round_type`` 0), as the export's
    ``quantize_linear``, ONNX's ``QuantizeLinear``, TensorRT and oneDNN do: Paddle's quanter rounds half
    away from zero, so the exported program moved the activations that sit on a tie by one step, which add
    up over a deep network (docs/int8.md). And its PIR branch leaves the range alone in eval
    mode: Paddle 3.3.1's writes the op's ``OutScale`` back there too, which the op (``is_test``) leaves unset,
    so a ``to_static`` or static evaluation stopped with "Tensor not initialized yet"
    (``paddle/quantization/quanters/abs_max.py:243``)."""

    def __init__(self, layer, moving_rate: float = DEFAULT_MOVING_RATE, bit_length: int = BITS):
        super().__init__(layer, moving_rate=moving_rate, bit_length=bit_length)

    def dynamic_forward(self, input):
        return self._fake_quant(input)

    def pir_forward(self, input):
        return self._fake_quant(input)

    def _fake_quant(self, input):
        training = self.training
        out, scale, state, accum = _C_ops.fake_quantize_dequantize_moving_average_abs_max(
            input, self._scale, self._accum if training else None, self._state if training else None,
            self._moving_rate, self._bit_length, not training, ROUND_HALF_TO_EVEN)
        if training:
            _C_ops.assign_out_(scale, self._scale)
            _C_ops.assign_out_(state, self._state)
            _C_ops.assign_out_(accum, self._accum)
        return out

    def static_forward(self, input):
        helper = LayerHelper("fake_quantize_dequantize_moving_average_abs_max")
        out = helper.create_variable_for_type_inference(input.dtype)
        inputs, outputs = {"X": [input], "InScale": [self._scale]}, {"Out": [out], "OutScale": [self._scale]}
        if self.training:
            inputs.update(InState=[self._state], InAccum=[self._accum])
            outputs.update(OutState=[self._state], OutAccum=[self._accum])
        helper.append_op(type="fake_quantize_dequantize_moving_average_abs_max", inputs=inputs, outputs=outputs,
                         attrs={"moving_rate": self._moving_rate, "bit_length": self._bit_length,
                                "is_test": not self.training, "round_type": ROUND_HALF_TO_EVEN})
        return out


def quant_config(model: nn.Layer, moving_rate: float = DEFAULT_MOVING_RATE) -> QuantConfig:
    """Conv2D / Linear: per-tensor moving-average activations, per-channel weights; stubs (residual adds, a
    shared convolution's call sites): per-tensor activations. A convolution whose calls have their own input
    stubs (``ppdlx.layers.CallSiteQuantized``) has no input quanter of its own. Nothing else is quantized."""
    activation, weight = MovingAverageAbsMaxQuanter(moving_rate=moving_rate), ChannelWiseAbsMaxQuanter()
    config = QuantConfig(activation=None, weight=None)
    # Paddle's QAT matches a layer's exact type: ppdlx's Conv2D (the one that picks a CPU kernel when built) is a
    # paddle Conv2D to quantize like any other, through Paddle's QuantedConv2D (which runs Paddle's convolution).
    config.add_type_config([nn.Conv2D, Conv2D, nn.Linear], activation=activation, weight=weight)
    config.add_qat_layer_mapping(Conv2D, QuantedConv2D)
    config.add_type_config(Stub, activation=activation)
    shared = [conv for conv, _ in site_quantized_convs(model)]
    if shared:
        config.add_layer_config(shared, activation=None, weight=weight)
    return config


def quantize_model(model: nn.Layer, moving_rate: float = DEFAULT_MOVING_RATE) -> Dict[str, int]:
    """Turn ``model`` (in place) into its QAT form; returns how many layers of each kind were quantized.
    Parameter names and ``state_dict`` keys of the float model stay as they were (the quanters add
    ``..._quanter._scale`` / ``._state`` / ``._accum`` entries), so a float checkpoint loads into it."""
    training = model.training
    model.train()  # paddle's QAT insists on a model in training mode
    QAT(quant_config(model, moving_rate)).quantize(model, inplace=True)
    if not training:
        model.eval()
    return summary(model)


def _site_stubs(model: nn.Layer) -> set:
    return {id(stub) for _, stubs in site_quantized_convs(model) for stub in stubs}


def summary(model: nn.Layer) -> Dict[str, int]:
    """Counts of quantized layers: ``conv``, ``linear``, ``residual`` (quantized stubs before residual adds) and
    ``call_sites`` (quantized stubs before a shared convolution's calls)."""
    layers = model.sublayers(include_self=True)
    stubs = [m for m in layers if isinstance(m, QuanterStub) and m._observer is not None]
    sites = _site_stubs(model)
    return {"conv": sum(isinstance(m, QuantedConv2D) for m in layers),
            "linear": sum(isinstance(m, QuantedLinear) for m in layers),
            "residual": sum(id(m) not in sites for m in stubs),
            "call_sites": sum(id(m) in sites for m in stubs)}


def is_quantized(model: nn.Layer) -> bool:
    return any(isinstance(m, QUANTED_LAYERS) for m in model.sublayers(include_self=True))


def activation_quanters(model: nn.Layer) -> List[Tuple[str, FakeQuanterWithAbsMaxObserverLayer]]:
    """``(name, quanter)`` of every per-tensor activation quanter, in the model's sublayer order."""
    return [(name, m) for name, m in model.named_sublayers(include_self=True)
            if isinstance(m, FakeQuanterWithAbsMaxObserverLayer)]


def weight_quanters(model: nn.Layer) -> List[Tuple[str, ChannelWiseAbsMaxQuanterLayer]]:
    return [(name, m) for name, m in model.named_sublayers(include_self=True)
            if isinstance(m, ChannelWiseAbsMaxQuanterLayer)]


def running_ranges(model: nn.Layer) -> List[paddle.Tensor]:
    """The activation quanters' running state (scale, moving-average accumulators): like BatchNorm's
    running statistics, each rank updates its own from its own batches, so several ranks average them."""
    return [t for _, q in activation_quanters(model) for t in (q._scale, q._state, q._accum)]


@paddle.no_grad()
def refresh_weight_scales(model: nn.Layer) -> int:
    """Recompute every weight quanter's scales from its current weight: the stored ones are those of the
    last forward, before the last optimizer update (and before an EMA swap). Returns how many."""
    count = 0
    for layer in model.sublayers(include_self=True):
        if isinstance(layer, QUANTED_LAYERS) and isinstance(layer.weight_quanter, ChannelWiseAbsMaxQuanterLayer):
            quanter = layer.weight_quanter
            axes = [a for a in range(layer.weight.ndim) if a != quanter._axis]
            paddle.assign(paddle.abs(layer.weight).max(axis=axes).astype("float32"), quanter._scale)
            count += 1
    return count


@contextlib.contextmanager
def quantized_weights(model: nn.Layer) -> Iterator[nn.Layer]:
    """For the duration, every quantized layer's weight holds its fake-quantized value (an int8 step times
    its channel's scale) and its quanter the scales of the weight it replaced: what an export writes as
    int8 is then exactly the training's rounding (numpy's own rounding of the float weight, in float64,
    lands on the other side of a step now and then). Restored on exit."""
    refresh_weight_scales(model)
    saved = []
    with paddle.no_grad():
        for layer in model.sublayers(include_self=True):
            if isinstance(layer, QUANTED_LAYERS) and layer.weight_quanter is not None:
                saved.append((layer.weight, layer.weight.numpy()))
                training = layer.weight_quanter.training
                layer.weight_quanter.eval()
                scale = layer.weight_quanter._scale.numpy()
                quantized = layer.weight_quanter(layer.weight)
                paddle.assign(quantized, layer.weight)
                layer.weight_quanter._scale.set_value(scale)
                layer.weight_quanter.train(training)
    try:
        yield model
    finally:
        for weight, value in saved:
            weight.set_value(value)


@contextlib.contextmanager
def widened_ranges(model: nn.Layer, factor: float) -> Iterator[nn.Layer]:
    """Every activation range multiplied by ``factor`` for the duration (the headroom a CPU without VNNI
    needs, :mod:`ppdlx.export.onednn_int8`). Restored on exit."""
    saved = [(q._scale, q._scale.numpy()) for _, q in activation_quanters(model)] if factor != 1 else []
    with paddle.no_grad():
        for scale, value in saved:
            scale.set_value(value * np.float32(factor))
    try:
        yield model
    finally:
        for scale, value in saved:
            scale.set_value(value)


def _quanter_slots(model: nn.Layer) -> Iterator[tuple]:
    """Every place a quanter sits in ``model``: ``(layer, attribute, "weight" | "activation")``."""
    for layer in model.sublayers(include_self=True):
        if isinstance(layer, QUANTED_LAYERS):
            yield layer, "weight_quanter", "weight"
            yield layer, "activation_quanter", "activation"
        elif isinstance(layer, QuanterStub):
            yield layer, "_observer", "activation"


@contextlib.contextmanager
def _quanters_replaced(model: nn.Layer, replace: Callable) -> Iterator[nn.Layer]:
    """Each quanter ``q`` of ``model`` replaced by ``replace(kind, q)`` for the duration. Restored on exit."""
    saved = []
    for layer, attr, kind in list(_quanter_slots(model)):  # listed first: the walk must not see its replacements
        quanter = getattr(layer, attr)
        saved.append((layer, attr, quanter))
        setattr(layer, attr, replace(kind, quanter))
    try:
        yield model
    finally:
        for layer, attr, value in saved:
            setattr(layer, attr, value)


def without_quanters(model: nn.Layer):
    """The model without its quanters for the duration: the float network with the same parameters
    (what the ONNX QDQ export starts from). Restored on exit."""
    return _quanters_replaced(model, lambda kind, quanter: None)


class SimulatedActivationQuanter(nn.Layer):
    """An activation quanter's evaluation in plain float ops, to the bit: ``round(127 * (1 / range) * x)`` (half to
    even) saturated to [-128, 127], times ``range``, divided by 127, as Paddle's fake quantize op computes it. A
    float program built with it computes what the QAT model computes; Paddle's fake quantize ops would do the same,
    but they mark a program as quantized to its readers (Paddle Inference's quantization passes, deploy's int8
    route). ``onnx=True``: an ONNX ``QuantizeLinear`` -> ``DequantizeLinear`` pair's arithmetic instead (divide by
    the scale ``range / 127`` the QDQ graph holds, round, saturate, multiply back), which lands a float ulp away
    from Paddle's on part of the values."""

    def __init__(self, quanter: FakeQuanterWithAbsMaxObserverLayer, onnx: bool = False):
        super().__init__()
        steps = (1 << (quanter.bit_length() - 1)) - 1
        value_range = np.float32(max(float(quanter.scales().numpy().reshape(-1)[0]), 1e-12))
        self.onnx, self.lowest, self.highest = onnx, float(-steps - 1), float(steps)
        self.range, self.steps = float(value_range), float(steps)
        self.gain = float(np.float32(steps) * (np.float32(1) / value_range))
        self.step = float(np.float32(float(value_range) / steps))  # the QDQ graph's scale (ppdlx.export.onnx_qdq)

    def forward(self, x):
        def constant(value):
            return paddle.full([], value, x.dtype)
        if self.onnx:
            q = paddle.clip(paddle.round(paddle.divide(x, constant(self.step))), self.lowest, self.highest)
            return paddle.multiply(q, constant(self.step))
        q = paddle.clip(paddle.round(paddle.multiply(x, constant(self.gain))), self.lowest, self.highest)
        return paddle.divide(paddle.multiply(q, constant(self.range)), constant(self.steps))


@contextlib.contextmanager
def simulated_quantization(model: nn.Layer, onnx: bool = False) -> Iterator[nn.Layer]:
    """For the duration, the model computes its quantization in plain float ops: weights hold their
    fake-quantized values (:func:`quantized_weights`), the weight quanters are off, and every activation
    quanter is a :class:`SimulatedActivationQuanter` of its trained range. What a float Paddle program of a
    QAT model is traced from, so that it predicts what the QAT model predicts; with ``onnx``, the arithmetic
    of its ONNX QDQ graph instead (:mod:`ppdlx.export.onnx_qdq`: -128 is a step there). Restored on exit."""
    def simulated(kind, quanter):
        if kind == "weight" or quanter is None:
            return None
        return SimulatedActivationQuanter(quanter, onnx)
    with quantized_weights(model), _quanters_replaced(model, simulated):
        yield model


def _range(quanter) -> float:
    return float(quanter.scales().numpy().reshape(-1)[0])


def layer_scales(model: nn.Layer) -> Dict[str, dict]:
    """Per quantized layer, keyed by its weight's parameter name: the activation range (abs max; a list, one per
    call, for a convolution quantized at its call sites) and the per-channel weight ranges, as numpy arrays: what
    an ONNX QDQ graph needs. Residual stubs are keyed by their sublayer name."""
    scales, sites = {}, _site_stubs(model)
    for name, layer in model.named_sublayers(include_self=True):
        if isinstance(layer, QUANTED_LAYERS):
            quanter = layer.activation_quanter
            scales[layer.weight.name] = {
                "layer": name, "kind": "linear" if isinstance(layer, QuantedLinear) else "conv",
                "activation": _range(quanter) if quanter is not None else None,
                "weight": layer.weight_quanter.scales().numpy().astype("float32"),
                "weight_axis": layer.weight_quanter.quant_axis()}
        elif isinstance(layer, QuanterStub) and layer._observer is not None and id(layer) not in sites:
            scales[name] = {"layer": name, "kind": "residual", "activation": _range(layer._observer)}
    for conv, stubs in site_quantized_convs(model):
        scales[conv.weight.name]["activation"] = [_range(stub._observer) for stub in stubs]
    return scales


def check_training(enabled: bool, amp_enabled: bool, amp_level: str) -> None:
    """One line for what quantization-aware training cannot be combined with."""
    if enabled and amp_enabled and amp_level == "O2":
        raise UnsupportedError("qat.enabled with amp.level=O2: O2 casts every parameter to float16, the quanters' "
                               "ranges and the fake-quantized weights included; NVIDIA's QAT recipe trains with "
                               "O1 (amp.level=O1)")


def describe(model: nn.Layer, moving_rate: float) -> str:
    counts, shared = summary(model), len(site_quantized_convs(model))
    per_call = (f"; {shared} convolutions shared over pyramid levels take one input range per call "
                f"({counts['call_sites']} in all)") if shared else ""
    return (f"qat: fake quantization on the inputs of {counts['conv']} convolutions and {counts['linear']} linear "
            f"layers (weights per output channel, activations per tensor, moving average at {moving_rate:g}) and "
            f"{counts['residual']} residual adds{per_call}")
