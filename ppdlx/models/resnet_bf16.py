"""bf16 activations between the layers of a ResNet trained with bf16 convolutions on CPU.

With ``amp.cpu_bf16`` every convolution computes in bf16, but on float32 tensors: each one rounds
its input and its incoming gradient to bf16 and writes float32 results, and batch norm, ReLU and
the residual add move float32 data. PyTorch's autocast keeps the activations in bf16 end to end,
which on a CPU with bf16 hardware saves those roundings and half the memory traffic
(docs/cpu_speed.md, AMD EPYC Zen 4). Paddle 3.3.1 has no CPU bf16 add or ReLU, so this is done
where ppdlx's oneDNN ops cover a whole network: ResNet's stem, max pool and bottleneck blocks run
with bf16 tensors between them (convolution -> batch norm + ReLU -> ... -> add + ReLU), and the
last block's output is cast to float32 for the pooling, classifier and loss. A ResNet built under
``layer_config(cpu_kernels=True, bf16=True)`` trains its features here (``ppdlx.models.resnet``). A block's input feeds
its first convolution and its shortcut through ``onednn.fork``, so oneDNN sums the two gradients
(Paddle sums two bf16 gradients on one thread, element by element). Weights, their
gradients, batch-norm statistics and the optimizer stay float32. Evaluation, and a batch norm
with fixed statistics, take the model's own float32 forward.
"""
from __future__ import annotations


import paddle

from ppdlx.layers import ConvNormAct
from ppdlx.ops import onednn


def _is_onednn_conv_norm(layer) -> bool:
    """A ConvNormAct whose conv runs on the oneDNN op, with no bias, and whose BN (+ ReLU/none) does too."""
    if type(layer) is not ConvNormAct:
        return False
    conv, bn = layer.conv, layer.bn
    return (getattr(conv, "cpu_kernel", None) == "onednn" and conv.bias is None and conv._data_format == "NHWC"
            and getattr(bn, "cpu_kernel", None) == "onednn")


def blocks(model) -> list:
    """A ResNet's residual blocks, in order."""
    return [block for stage in model.stages for block in stage]


def _conv_norms(model) -> list:
    layers = [model.stem]
    for block in blocks(model):
        layers += [block.conv1, block.conv2, block.conv3] + ([block.shortcut] if block.shortcut is not None else [])
    return layers


def applies(model) -> bool:
    """Whether ``model`` trains with bf16 activations between its layers (a ResNet built for it)."""
    return bool(getattr(model, "bf16_activations", False))


def covers(model) -> bool:
    """Whether the NHWC ResNet ``model`` is made only of layers these ops cover: its pool, every block's add +
    ReLU and every conv + batch norm on ppdlx's oneDNN ops."""
    if model.data_format != "NHWC" or getattr(model.pool, "cpu_kernel", None) != "onednn":
        return False
    if not all(getattr(block, "cpu_kernel", None) == "add_relu" for block in blocks(model)):
        return False
    return all(_is_onednn_conv_norm(layer) for layer in _conv_norms(model))


def conv_norm(layer, x, bf16: bool = True):
    """``layer`` (a ConvNormAct) in training mode on a float32 or bf16 ``x``; the output is bf16
    (``bf16=False``: the same ops in float32, which tests compare with Paddle's kernels)."""
    conv, bn = layer.conv, layer.bn
    y = onednn.conv2d(x, conv.weight, conv._stride, conv._onednn_paddings, conv._dilation, conv._groups, True,
                      bf16=bf16, out_bf16=bf16)
    return onednn.batch_norm_train(y, bn, type(bn.act) is paddle.nn.ReLU, True)


def bottleneck(block, x, bf16: bool = True):
    """A ResNet bottleneck block in training mode, bf16 in and out (or float32 with ``bf16=False``)."""
    x, shortcut_input = onednn.fork(x)
    identity = shortcut_input if block.shortcut is None else conv_norm(block.shortcut, shortcut_input, bf16)
    if bf16 and identity.dtype != paddle.bfloat16:
        identity = identity.astype(paddle.bfloat16)
    y = conv_norm(block.conv3, conv_norm(block.conv2, conv_norm(block.conv1, x, bf16), bf16), bf16)
    return onednn.add_relu(y, identity)


def _trains(layer) -> bool:
    """The layer trains as a whole: a batch norm in eval mode or with fixed statistics (frozen while
    the rest trains) must use, and not update, its running statistics, which only Paddle's does."""
    return layer.conv.training and layer.bn.training and not layer.bn._use_global_stats


def trains_whole(model) -> bool:
    """``model`` trains, and every conv + batch norm of it with it (else it takes its float32 forward)."""
    return model.training and all(_trains(layer) for layer in _conv_norms(model))


def forward_features(model, x):
    """The features of a training ResNet with bf16 activations between its layers (float32 out)."""
    x = model.pool(conv_norm(model.stem, x))  # the oneDNN max pool (see applies), which takes bf16
    for block in blocks(model):
        x = bottleneck(block, x)
    return x.astype(paddle.float32)
