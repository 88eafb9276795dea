"""Checkpoint compatibility of every registered model, pinned to the names of commit 89e7f20.

For each model: the state_dict keys with their shapes (what ``.pdparams`` checkpoints, the weight
converters and the reference-parity tests address), and each key's Paddle parameter name (what
``.pdopt`` optimizer checkpoints key accumulators and fp32 master weights by). Each is hashed in
state_dict order. A refactor of the model code must leave both unchanged; a new model adds its line.
"""
import hashlib

import paddle
import pytest

from ppdlx.models import MODELS

# name: (number of state_dict entries, sha256[:32] of "key [shape]" lines, of "key param_name" lines)
EXPECTED = {
    "efficientdet_d0": (676, "0311e5207114dea870084c1b4c5e9d5d", "547d0b7c4ffdc2a1c5a19041592f7868"),
    "efficientnet_b0": (311, "932dabe2bd475abd759f8c7760af7c42", "408faf4f9629ba2a25a9ca7a3053fdc4"),
    "efficientnet_lite0": (247, "16fca6ea4b7486c3b87b2615544a75a8", "5ff0b6a4f21d37a63f42cd6b6e27ed70"),
    "gpunet_0": (155, "aca32c74a240781116e72142b25ff86e", "41b7a6552f605a6241952b7c1a9dc0a3"),
    "gpunet_1": (212, "db40f254fb7f6dd145944c0e55becac7", "5ab6505203def1734d1261cbcecd71c2"),
    "gpunet_2": (478, "58e4995d3ee20e2a0e35d9d6be5809ed", "1c920a4f4450365ef23da968dc446649"),
    "gpunet_d1": (343, "6959e4f5a5a97fb151dd8ef2a55954cd", "18c2407bd8c4ea5e108b00080e5f9e06"),
    "gpunet_d2": (398, "0af9975a6d557e2b0cff2842e8da1b1d", "fccb6c0bc9819fda4c23afc908d9cb83"),
    "gpunet_p0": (192, "abfcb32a4575e9391d3c885c00ac6231", "5698654a4278ea4a0652c3e5aa45a9b5"),
    "gpunet_p1": (207, "1063a1946deeced96d04fa015ee2208f", "1fe64aeab655fd55f7563ba4aff19659"),
    "resnet18_bottleneck_tiny": (87, "7b4586e833cc66747b40f45372a77dc5", "656b3259a6cbd7d356c874760db15006"),
    "resnet50": (267, "a831250f50c444d367b48c1ad10ecfb4", "b8c96e8718ba6a7c2886e6b46d6affcc"),
}
BUILT_FROM_A_FILE = {"gpunet_json"}  # its keys are those of the user's JSON


def _digest(lines):
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:32]


def test_every_registered_model_is_pinned():
    assert set(MODELS.names()) - BUILT_FROM_A_FILE == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_state_dict_keys_shapes_and_parameter_names_are_unchanged(name):
    with paddle.utils.unique_name.guard():  # parameter names numbered from 0, as in a fresh process
        state = MODELS.build(name).state_dict()
    count, keys, names = EXPECTED[name]
    got = (len(state), _digest(f"{k} {list(v.shape)}" for k, v in state.items()),
           _digest(f"{k} {v.name}" for k, v in state.items()))
    assert got[:2] == (count, keys), f"{name}: state_dict keys or shapes changed (first keys: {list(state)[:4]})"
    assert got[2] == names, f"{name}: Paddle parameter names changed, e.g. {[v.name for v in state.values()][:4]}"
