"""Which implementation the layers built now pick: timm's ``set_layer_config`` idea, as a context.

``with layer_config(cpu_kernels=True, bf16=False): model = build(...)`` builds a model whose layers train
through ppdlx's CPU kernels (``ppdlx.layers.cpu_kernels`` lists them); a model built outside the block runs
Paddle's own. Each layer reads the config once, when it is built, and keeps its choice in ``cpu_kernel``:
what a model's code says it runs is what runs. Parameters, their names and their initial values do not
depend on it, so checkpoints and exports are the same either way.
"""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Iterator


@dataclass(frozen=True)
class LayerConfig:
    cpu_kernels: bool = False  # train NHWC layers through ppdlx's oneDNN ops (and 1x1 convolutions as matmuls)
    bf16: bool = False         # with cpu_kernels: convolutions (and a ResNet's activations) train in bfloat16


_current = LayerConfig()


def get_layer_config() -> LayerConfig:
    """The config the layers built now read."""
    return _current


@contextlib.contextmanager
def layer_config(config: LayerConfig | None = None, **changes) -> Iterator[LayerConfig]:
    """Layers built inside the block read ``config`` (or the current one with ``changes``)."""
    global _current
    previous = _current
    _current = dataclasses.replace(config or previous, **changes)
    try:
        yield _current
    finally:
        _current = previous
