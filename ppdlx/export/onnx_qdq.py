"""ONNX QDQ graph of a quantization-aware-trained model: what ``trtexec --int8`` (explicit quantization)
and onnxruntime's int8 kernels take.

paddle2onnx 2.1 cannot convert the int8 Paddle program: it converts a ``.pdmodel`` to PIR first and its
``quantize_linear`` / ``dequantize_linear`` mappers exist for opset 19 only and assert an fp8 range
(``qmax`` 448 or 57344: "Only support e4m3 or e5m2 now", ``paddle2onnx/mapper/quantize/quantize_linear.cc``),
so an int8 program stops the conversion. The QDQ graph is therefore written from the float graph of the
same weights (the model traced without its quanters, converted by paddle2onnx as every fp32 export is):
:func:`insert_qdq` puts ``QuantizeLinear`` -> ``DequantizeLinear`` with the trained activation range on the
activation input of every ``Conv`` / ``MatMul`` / ``Gemm`` whose weight belongs to a quantized layer (the
initializer is named after the Paddle parameter), replaces that weight by its int8 values feeding a
per-channel ``DequantizeLinear`` (the int8 values Paddle's ``QuantWeightPass`` computes, by its own
``quant_tensor``), and quantizes the earlier input of each residual ``Add`` in the order the model's
residual quanters run. Scales are range / 127, zero points 0 (symmetric, as TensorRT requires).
"""
from __future__ import annotations

import collections
from typing import Callable, Dict, List, Optional

import numpy as np
from paddle.static.quantization import utils as quant_utils

from ppdlx.errors import UnsupportedError
from ppdlx.models.qat import BITS

QMAX = float((1 << (BITS - 1)) - 1)
WEIGHT_OPS = {"Conv": 1, "MatMul": 1, "Gemm": 1}
# The export check runs the QDQ graph unfused (onnxruntime without graph optimisations) against the model
# computing its Q/DQ arithmetic (simulated_quantization with onnx=True) on random inputs. onnxruntime still
# runs the convolutions between a QuantizeLinear and a DequantizeLinear in integers, exactly, where the model
# sums floats: a value next to a rounding step lands on the other side, and in a deep network those flips
# add up layer by layer, more on random inputs than on images. A QuantizeLinear / DequantizeLinear pair whose
# scales disagree moves the outputs mostly by more; docs/int8.md has both measured, and that the two overlap,
# so this check is a coarse guard and --verify's agreement on real images is the accuracy gate.
QDQ_CHECK_RTOL = 0.10


def quantized_check(compare: Callable) -> Callable:
    """``compare`` with the tolerance of a quantized graph (:data:`QDQ_CHECK_RTOL` of the largest output)."""
    def check(what, reference, outputs, atol, rtol):
        return compare(f"{what} (QDQ graph, unfused)", reference, outputs, atol, max(rtol, QDQ_CHECK_RTOL))
    return check


def int8_weight(weight: np.ndarray, ranges: np.ndarray, axis: int) -> np.ndarray:
    """Paddle's own int8 rounding of a weight (``QuantWeightPass`` calls the same function)."""
    return np.asarray(quant_utils.quant_tensor(weight.astype(np.float32).copy(), ranges.tolist(), axis, BITS,
                                         onnx_format=True)).astype(np.int8)


class _Graph:
    def __init__(self, model):
        self.model, self.graph = model, model.graph
        self.initializers = {t.name: t for t in self.graph.initializer}
        self.producer = {out: i for i, node in enumerate(self.graph.node) for out in node.output}
        self.new_nodes: Dict[int, list] = {}  # node index -> nodes to insert before it
        self.count = 0

    def constant(self, name: str, array: np.ndarray) -> str:
        from onnx import numpy_helper  # optional (ppdlx[onnx]): only ONNX exports
        self.graph.initializer.append(numpy_helper.from_array(array, name))
        self.initializers[name] = self.graph.initializer[-1]
        return name

    def qdq(self, index: int, tensor: str, activation_range: float, tag: str) -> str:
        """Q/DQ of activation ``tensor`` for the node at ``index``; returns the dequantized name."""
        from onnx import helper  # optional, as above
        self.count += 1
        base = f"{tensor}.qdq{self.count}.{tag}"
        scale = self.constant(base + ".scale", np.array(max(activation_range, 1e-12) / QMAX, np.float32))
        zero = self.constant(base + ".zero_point", np.array(0, np.int8))
        self.new_nodes.setdefault(index, []).extend([
            helper.make_node("QuantizeLinear", [tensor, scale, zero], [base + ".q"], name=base + ".quantize"),
            helper.make_node("DequantizeLinear", [base + ".q", scale, zero], [base + ".dq"],
                             name=base + ".dequantize")])
        return base + ".dq"

    def int8_weight(self, index: int, name: str, ranges: np.ndarray, axis: int) -> str:
        """The dequantized int8 weight ``name``, written once before its first reader (a detector's heads
        share one weight across pyramid levels)."""
        from onnx import helper, numpy_helper  # optional, as above
        if name + ".dq" in self.producer:
            return name + ".dq"
        self.producer[name + ".dq"] = index
        weight = numpy_helper.to_array(self.initializers[name])
        if ranges.size != weight.shape[axis]:
            raise UnsupportedError(f"ONNX QDQ: weight {name} {list(weight.shape)} has {weight.shape[axis]} channels on "
                                   f"axis {axis}, its quanter {ranges.size} scales")
        quantized = self.constant(name + ".int8", int8_weight(weight, ranges, axis))
        scale = self.constant(name + ".scale", (np.maximum(ranges, 1e-12) / QMAX).astype(np.float32))
        zero = self.constant(name + ".zero_point", np.zeros(ranges.size, np.int8))
        self.new_nodes.setdefault(index, []).append(
            helper.make_node("DequantizeLinear", [quantized, scale, zero], [name + ".dq"], name=name + ".dequantize",
                             axis=axis))
        return name + ".dq"

    def finish(self) -> None:
        nodes = list(self.graph.node)
        del self.graph.node[:]
        for i, node in enumerate(nodes):
            self.graph.node.extend(self.new_nodes.get(i, []))
            self.graph.node.append(node)
        used = {name for node in self.graph.node for name in node.input}
        for tensor in [t for t in self.graph.initializer if t.name not in used]:
            self.graph.initializer.remove(tensor)  # the float weights now held as int8


def residual_adds(graph) -> List[tuple]:
    """``(node index, input position)`` of the earlier-computed input of every ``Add`` of two activations
    (quant_aware's ``AddQuantDequantForResidual`` rule), in graph order."""
    initializers = {t.name for t in graph.initializer}
    constants = {n.output[0] for n in graph.node if n.op_type == "Constant"}
    producer = {out: i for i, node in enumerate(graph.node) for out in node.output}
    adds = []
    for i, node in enumerate(graph.node):
        if node.op_type != "Add" or len(node.input) != 2 or set(node.input) & (initializers | constants):
            continue
        order = [producer.get(name, -1) for name in node.input]
        adds.append((i, 0 if order[0] <= order[1] else 1))
    return adds


def insert_qdq(onnx_file: str, layer_scales: Dict[str, dict], save_file: Optional[str] = None) -> dict:
    """Turn the float ONNX graph in ``onnx_file`` into its QDQ form with ``layer_scales``
    (:func:`ppdlx.models.qat.layer_scales`: per weight parameter name the activation range, or one per call in
    graph order, and the per-channel weight ranges; residual quanters in forward order). Returns counts."""
    import onnx  # optional, as above
    model = onnx.load(onnx_file)
    g = _Graph(model)
    weights = {k: v for k, v in layer_scales.items() if v["kind"] != "residual"}
    residuals = [v for v in layer_scales.values() if v["kind"] == "residual"]
    readers = [(i, node, node.input[WEIGHT_OPS[node.op_type]]) for i, node in enumerate(g.graph.node)
               if node.op_type in WEIGHT_OPS and len(node.input) > WEIGHT_OPS[node.op_type]
               and node.input[WEIGHT_OPS[node.op_type]] in weights]
    reads = collections.Counter(name for _, _, name in readers)
    missing = sorted(set(weights) - set(reads))
    if missing:
        raise UnsupportedError(f"ONNX QDQ: {len(missing)} quantized layers have no weight initializer in "
                               f"{onnx_file} (e.g. {missing[0]}): the float graph does not match the QAT model")
    # a shared convolution has one input range per call, in graph order
    per_call = {n for n, s in weights.items() if isinstance(s["activation"], list)}
    mismatched = sorted(n for n in per_call if reads[n] != len(weights[n]["activation"]))
    if mismatched:
        name = mismatched[0]
        raise UnsupportedError(f"ONNX QDQ: {name} is read {reads[name]} times, its layer has input ranges for "
                               f"{len(weights[name]['activation'])} calls: the float graph does not match the QAT "
                               f"model")
    calls: Dict[str, int] = {}
    for i, node, name in readers:
        s = weights[name]
        if node.op_type == "Gemm" and any(a.name == "transB" and a.i for a in node.attribute):
            raise UnsupportedError(f"ONNX QDQ: Gemm {node.name} takes {name} transposed; not written here")
        call = calls[name] = calls.get(name, 0) + 1
        activation = s["activation"][call - 1] if name in per_call else s["activation"]
        node.input[0] = g.qdq(i, node.input[0], activation, "act")
        node.input[WEIGHT_OPS[node.op_type]] = g.int8_weight(i, name, s["weight"], s["weight_axis"])
    adds = residual_adds(g.graph)
    if residuals and len(adds) != len(residuals):
        raise UnsupportedError(f"ONNX QDQ: the graph has {len(adds)} adds of two activations, the model "
                               f"{len(residuals)} residual quanters")
    for (i, position), s in zip(adds if residuals else [], residuals):
        node = g.graph.node[i]
        node.input[position] = g.qdq(i, node.input[position], s["activation"], "residual")
    g.finish()
    onnx.checker.check_model(model)
    onnx.save(model, save_file or onnx_file)
    counts = {op: sum(n.op_type == op for n in model.graph.node) for op in ("QuantizeLinear", "DequantizeLinear")}
    return {**counts, "int8_weights": len(reads), "residual_adds": len(residuals)}
