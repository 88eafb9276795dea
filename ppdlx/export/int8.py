"""The int8 program of a quantization-aware-trained model: one legacy ``.pdmodel`` that Paddle Inference
runs with oneDNN int8 on CPU and Paddle-TRT reads on GPU, the format Paddle's own QAT export writes.

:func:`save_int8_program` traces the QAT model (:mod:`ppdlx.models.qat`) in eval mode into a legacy
program, where each quanter is a fake quantize-dequantize op holding its trained scale, then applies the
passes of Paddle's dygraph QAT export (``ImperativeQuantAware.save_quantized_model`` with
``onnx_format=True``, ``paddle/quantization/imperative/qat.py``): ``ReplaceFakeQuantDequantPass`` turns
every fake op into a ``quantize_linear`` / ``dequantize_linear`` pair whose ``Scale`` tensor is the trained
range, and ``QuantWeightPass`` stores each weight as int8 with its per-channel scales, leaving only a
``dequantize_linear`` after it. Those are the scales Paddle Inference's ``quant_dequant_onednn_pass``
collects (CPU) and Paddle-TRT's ``quantize_linear`` / ``dequantize_linear`` converters turn into
TensorRT Q/DQ layers (scale / 127 on ``quant_axis``): no calibration table (docs/int8.md).
"""
from __future__ import annotations

import collections
import os
from typing import Dict

import numpy as np
import paddle
from paddle.base.framework import IrGraph
from paddle.framework import core
from paddle.static.quantization import QuantWeightPass, ReplaceFakeQuantDequantPass

from ppdlx.export.files import ModelFiles, find_model_files
from ppdlx.models.qat import (BITS, NVIDIA_QUANTIZED_OPS, activation_quanters, quantized_weights, summary,
                              widened_ranges)

QDQ_OPS = ("quantize_linear", "dequantize_linear")
# inference.yml quantization.program_numerics of a QAT export whose Paddle program is float with the quantization
# simulated (a detector's, ppdlx.export.families.detection_graph)
SIMULATED_INT8 = "simulated int8"


def convert_fake_quant_program(files: ModelFiles) -> Dict[str, int]:
    """Rewrite the legacy program in ``files`` (fake quant-dequant ops, float weights) in place into the
    int8 format: quantize/dequantize ops with the trained scales and int8 weights. Returns op counts."""
    place = paddle.CPUPlace()
    prefix = os.path.join(files.model_dir, files.prefix)
    with paddle.pir_utils.OldIrGuard():  # static mode + legacy IR, both restored on exit
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope):
            executor = paddle.static.Executor(place)
            program, feeds, fetches = paddle.static.load_inference_model(prefix, executor)
            graph = IrGraph(core.Graph(program.desc), for_test=True)
            merge_repeated_activation_quants(graph, scope)
            ReplaceFakeQuantDequantPass(scope, place, quant_bits=BITS).apply(graph)
            QuantWeightPass(scope, place).apply(graph)
            program = graph.to_program()
            paddle.static.save_inference_model(prefix, [program.global_block().var(n) for n in feeds], fetches,
                                               executor, program=program, clip_extra=True)
            ops = collections.Counter(op.type for op in program.global_block().ops)
    info = prefix + ".pdiparams.info"  # jit.save's, of the fake-quant program's parameters
    if os.path.isfile(info):
        os.remove(info)
    return dict(ops)


def merge_repeated_activation_quants(graph, scope) -> int:
    """One fake quantize op per activation tensor: a tensor read by two quantized layers (a ResNet block's input
    feeds its first convolution and its projection shortcut) has a quanter in each, trained on the same batches
    to the same range, and Paddle's pass would give both replacements one output name (``<x>.quantized``),
    which TensorRT's engine takes once per name. NVIDIA's quant_aware program quantizes such a tensor once.
    The later op's readers read the earlier op's output; returns how many ops were merged."""
    first, merged = {}, 0
    order = {node.id(): i for i, node in enumerate(graph.topology_sort())}
    quants = [op for op in graph.all_op_nodes() if op.name() == "fake_quantize_dequantize_moving_average_abs_max"]
    for op in sorted(quants, key=lambda node: order[node.id()]):
        source = op.input("X")[0]
        scale = np.array(scope.find_var(op.input("InScale")[0]).get_tensor())
        if source not in first:
            first[source] = (op, scale)
            continue
        kept, kept_scale = first[source]
        if not np.array_equal(kept_scale, scale):
            raise ValueError(f"two quanters of {source} hold different ranges ({kept_scale} and {scale})")
        kept_out = graph._find_node_by_name(kept.outputs, kept.output("Out")[0])
        out = graph._find_node_by_name(op.outputs, op.output("Out")[0])
        for reader in list(out.outputs):
            graph.update_input_link(out, kept_out, reader)
        graph.safe_remove_nodes({op, out})
        merged += 1
    return merged


def save_int8_program(model, save, activation_headroom: float = 1.0) -> ModelFiles:
    """``save()`` traces ``model``'s graph as a legacy program (``paddle_export.save_classifier`` /
    ``save_detector`` with ``fmt="program"``) and returns its files; they are then rewritten as the
    int8 program. The weights are traced fake-quantized (:func:`ppdlx.models.qat.quantized_weights`),
    so the int8 values are the training's; every activation range is multiplied by ``activation_headroom``
    (:mod:`ppdlx.export.onednn_int8`)."""
    with quantized_weights(model), widened_ranges(model, activation_headroom):
        files = save()
    if files.format != "program":
        raise ValueError(f"{files.model_file}: the int8 program is written from a legacy .pdmodel")
    convert_fake_quant_program(files)
    return find_model_files(files.model_dir, files.prefix)


def int8_program_facts(files: ModelFiles) -> dict:
    """What ``inference.yml`` records of an int8 program: op counts, and per quantized op type how many
    take a quantized input (checked against what the QAT model quantizes)."""
    with paddle.pir_utils.OldIrGuard():
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope):
            program, _, _ = paddle.static.load_inference_model(
                os.path.join(files.model_dir, files.prefix), paddle.static.Executor(paddle.CPUPlace()))
            block = program.global_block()
            producers = {out: op.type for op in block.ops for out in op.output_arg_names}
            quantized = collections.Counter()
            int8_weights = 0
            for op in block.ops:
                if op.type in NVIDIA_QUANTIZED_OPS + ("elementwise_add",) and any(
                        producers.get(name) == "dequantize_linear" for name in op.input_arg_names):
                    quantized[op.type] += 1
                if op.type == "dequantize_linear" and block.var(op.input("X")[0]).persistable:
                    int8_weights += int(np.array(scope.find_var(op.input("X")[0]).get_tensor()).dtype == np.int8)
            ops = collections.Counter(op.type for op in block.ops)
    return {"ops": {op: int(ops.get(op, 0)) for op in QDQ_OPS}, "ops_with_quantized_inputs": dict(quantized),
            "int8_weights": int8_weights}


def qat_section(model, program: dict | None, onnx: dict | None, onednn_ops, headroom: dict) -> dict:
    """``inference.yml``'s ``quantization`` section of a QAT export."""
    rates = sorted({q._moving_rate for _, q in activation_quanters(model)})
    layers = summary(model)
    where = "at the inputs of every conv and linear layer" + (" and the residual input of each add"
                                                              if layers["residual"] else "")
    section = {
        "method": "qat",
        "description": "quantization-aware training (ppdlx.models.qat: paddle.quantization.QAT with NVIDIA's "
                       "quant_aware placement); the scales are the trained ones, no calibration",
        "weights": "int8, per output channel, abs max of the weight (channel_wise_abs_max)",
        "activations": f"int8, per tensor, moving average of each batch's abs max (rate {', '.join(map(str, rates))}) "
                       f"{where}",
        "quantized_layers": layers,
        "onednn_int8_ops": list(onednn_ops),
        # the program's activation ranges only: the ONNX QDQ graph keeps the trained ones
        "activation_headroom": headroom,
    }
    if program is not None:
        section["program"] = program
    if onnx is not None:
        section["onnx"] = onnx
    return section


def is_quantized_program(files: ModelFiles) -> bool:
    """Whether the saved program holds quantize ops (a legacy int8 program)."""
    return files.format == "program" and int8_program_facts(files)["ops"]["quantize_linear"] > 0
