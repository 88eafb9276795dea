"""Building blocks every model family shares (the timm layout: ``create_act``, ``ConvNormAct``, ...).

* ``create_act(name)``: ``relu``, ``relu6``, ``swish``/``silu``, ``sigmoid``, or ``None``/``"none"`` (identity).
* ``Conv2D``, ``MaxPool2D``: Paddle's layers that pick their CPU training kernel when built (``conv``).
* ``BatchNormAct2D``: ``paddle.nn.BatchNorm2D`` followed by its activation. The activation has no
  parameters, so a block's state_dict keys (``bn.weight``, ``bn._mean``, ...) are those of a plain
  BatchNorm; knowing what follows the normalisation is what lets it train BatchNorm + ReLU in one oneDNN pass.
* ``ConvNormAct``: conv (no bias) -> ``BatchNormAct2D`` as ``conv`` / ``bn``.
* ``SqueezeExcite``: channel gate ``x * sigmoid(expand(act(reduce(mean_hw(x)))))``.
* ``CallSiteQuantized``: a layer whose shared convolutions take one quantization point per call site
  (``site_inputs``; ``site_quantized_convs(model)`` lists them), as a detector head over pyramid levels.
* ``drop_path(x, drop_prob, training)``: per-sample stochastic depth (drop probability, as timm).
* ``make_divisible``, ``get_padding``: channel rounding and symmetric padding.
* ``fan_in_uniform(fan_in)``: PyTorch's default conv/linear initialisation.
* ``layer_config(cpu_kernels=..., bf16=...)``: which implementation the layers built inside the block pick
  (``config``); ``cpu_kernels``: whether and where a run may use them, and what a built model runs.
"""
from ppdlx.layers.activations import create_act
from ppdlx.layers.call_sites import CallSiteQuantized, site_quantized_convs
from ppdlx.layers.config import LayerConfig, get_layer_config, layer_config
from ppdlx.layers.conv import Conv2D, MaxPool2D
from ppdlx.layers.drop import drop_path
from ppdlx.layers.helpers import fan_in_uniform, get_padding, make_divisible
from ppdlx.layers.norm_act import BatchNormAct2D, ConvNormAct
from ppdlx.layers.squeeze_excite import SqueezeExcite

__all__ = ["BatchNormAct2D", "CallSiteQuantized", "Conv2D", "ConvNormAct", "LayerConfig", "MaxPool2D", "SqueezeExcite",
           "create_act", "drop_path", "fan_in_uniform", "get_layer_config", "get_padding", "layer_config",
           "make_divisible", "site_quantized_convs"]
