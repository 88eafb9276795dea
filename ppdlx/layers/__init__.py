"""Building blocks every model family shares (the timm layout: ``create_act``, ``ConvNormAct``, ...).

* ``create_act(name)``: ``relu``, ``relu6``, ``swish``/``silu``, ``sigmoid``, or ``None``/``"none"`` (identity).
* ``BatchNormAct2D``: ``paddle.nn.BatchNorm2D`` followed by its activation. The activation has no
  parameters, so a block's state_dict keys (``bn.weight``, ``bn._mean``, ...) are those of a plain
  BatchNorm; knowing what follows the normalisation is what lets ``ppdlx.engine.cpu_kernels`` fuse it.
* ``ConvNormAct``: conv (no bias) -> ``BatchNormAct2D`` as ``conv`` / ``bn``.
* ``SqueezeExcite``: channel gate ``x * sigmoid(expand(act(reduce(mean_hw(x)))))``.
* ``drop_path(x, drop_prob, training)``: per-sample stochastic depth (drop probability, as timm).
* ``make_divisible``, ``get_padding``: channel rounding and symmetric padding.
* ``fan_in_uniform(fan_in)``: PyTorch's default conv/linear initialisation.
"""
from ppdlx.layers.activations import create_act
from ppdlx.layers.drop import drop_path
from ppdlx.layers.helpers import fan_in_uniform, get_padding, make_divisible
from ppdlx.layers.norm_act import BatchNormAct2D, ConvNormAct
from ppdlx.layers.squeeze_excite import SqueezeExcite

__all__ = ["BatchNormAct2D", "ConvNormAct", "SqueezeExcite", "create_act", "drop_path", "fan_in_uniform",
           "get_padding", "make_divisible"]
