"""bf16 activations between the layers of a ResNet trained with bf16 convolutions on CPU.

With ``amp.cpu_bf16`` every convolution computes in bf16, but on float32 tensors: each one rounds
its input and its incoming gradient to bf16 and writes float32 results, and batch norm, ReLU and
the residual add move float32 data. PyTorch's autocast keeps the activations in bf16 end to end,
which on a CPU with bf16 hardware saves those roundings and half the memory traffic
(docs/cpu_speed.md, AMD EPYC Zen 4). Paddle 3.3.1 has no CPU bf16 add or ReLU, so this is done
where ppdlx's oneDNN ops cover a whole network: ResNet's stem, max pool and bottleneck blocks run
with bf16 tensors between them (convolution -> batch norm + ReLU -> ... -> add + ReLU), and the
last block's output is cast to float32 for the pooling, classifier and loss. A block's input feeds
its first convolution and its shortcut through ``onednn.fork``, so oneDNN sums the two gradients
(Paddle sums two bf16 gradients on one thread, element by element). Weights, their
gradients, batch-norm statistics and the optimizer stay float32. Evaluation, and a batch norm
with fixed statistics, take the model's own float32 forward.
"""
from __future__ import annotations

import types

import paddle

from ppdlx.layers import BatchNormAct2D, ConvNormAct
from ppdlx.models.resnet import Bottleneck, ResNet
from ppdlx.ops import onednn


def _is_onednn_conv_norm(layer) -> bool:
    """A ConvNormAct whose conv was switched to the oneDNN op, with no bias, and a BN + ReLU/none."""
    if type(layer) is not ConvNormAct:
        return False
    conv, bn = layer.conv, layer.bn
    return (type(conv) is paddle.nn.Conv2D and conv.bias is None and conv._data_format == "NHWC"
            and hasattr(conv, "_onednn_paddings")
            and type(bn) is BatchNormAct2D and type(bn.act) in (paddle.nn.ReLU, paddle.nn.Identity))


def _blocks(model):
    return [block for stage in model.stages for block in stage]


def _conv_norms(model) -> list:
    layers = [model.stem]
    for block in _blocks(model):
        layers += [block.conv1, block.conv2, block.conv3] + ([block.shortcut] if block.shortcut is not None else [])
    return layers


def applies(model) -> bool:
    """Whether ``model`` (after ``use_fast_cpu_kernels(model, bf16=True)``) is a ResNet made only of
    layers these ops cover."""
    if type(model) is not ResNet or model.data_format != "NHWC" or not hasattr(model.pool, "_onednn_paddings"):
        return False
    if not all(type(block) is Bottleneck and type(block.relu) is paddle.nn.ReLU for block in _blocks(model)):
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


def _forward_features(self, x):
    if not self.training or not all(_trains(layer) for layer in self._bf16_conv_norms):
        return ResNet.forward_features(self, x)
    x = self.pool(conv_norm(self.stem, x))  # the oneDNN max pool (see applies), which takes bf16
    for block in _blocks(self):
        x = bottleneck(block, x)
    return x.astype(paddle.float32)


def use_bf16_activations(model) -> int:
    """Trains ``model``'s features with bf16 activations where :func:`applies`; returns how many
    residual blocks now do (0: the model is left as it was)."""
    if not applies(model):
        return 0
    model._bf16_conv_norms = _conv_norms(model)
    model.forward_features = types.MethodType(_forward_features, model)
    return len(_blocks(model))
