"""Which parameters each recipe's optimizer decays (``optimizer.decay_params``), read from the update itself.

NVIDIA's Paddle ResNet50 (``models/resnet.py``, ``utils/config.py``: ``--bn-weight-decay`` off) gives every
BatchNorm scale and shift ``L2Decay(0.0)`` and leaves the rest to ``Momentum(weight_decay=...)``: every
convolution kernel, ``fc.weight`` and ``fc.bias`` decay. timm's recipes (GPUNet) exempt every 1-D parameter.
"""
import paddle
import pytest

from ppdlx.config import ConfigError, load_config
from ppdlx.models.from_config import build_model
from ppdlx.optim import build_lr_schedule, build_optimizer

WEIGHT_DECAY = 1.0 / 32768


def decayed_names(cfg_path, *overrides):
    """Parameter names a zero-gradient step of the recipe's optimizer moves (only the decay moves them)."""
    cfg = load_config(cfg_path, ["model.num_classes=10", "amp.enabled=false", *overrides])
    model = build_model(cfg)
    for p in model.parameters():
        p.set_value(paddle.ones_like(p))  # fc.bias starts at 0, where decay would not show
    optimizer = build_optimizer(cfg, model, build_lr_schedule(cfg, 256, 10), multi_precision=False)
    zero = sum((p * 0.0).sum() for p in model.parameters())
    zero.backward()
    for _ in range(6):  # past the linear warm-up's first step, whose learning rate is 0
        optimizer.step()
    optimizer.clear_grad()
    return {n for n, p in model.named_parameters() if float(p.abs().max()) != 1.0 or float(p.abs().min()) != 1.0}


def test_resnet50_recipe_decays_exactly_nvidias_set():
    cfg = load_config("configs/rn50_amp.yaml", ["model.num_classes=10"])
    assert cfg.optimizer.decay_params == "all_but_bn" and cfg.optimizer.weight_decay == WEIGHT_DECAY
    model = build_model(cfg.replace({"amp.enabled": False}))
    names = [n for n, p in model.named_parameters() if not p.stop_gradient]  # BN statistics are parameters too
    convs = {n for n, p in model.named_parameters() if len(p.shape) == 4}
    assert len(convs) == 53  # 1 stem + 16 blocks x 3 + 4 downsample shortcuts
    expected = convs | {"fc.weight", "fc.bias"}
    decayed = decayed_names("configs/rn50_amp.yaml", "global.device=cpu", "lr.warmup_epochs=0")
    assert decayed == expected, sorted(decayed ^ expected)[:10]
    batch_norm = set(names) - expected
    assert len(batch_norm) == 2 * 53 and all(n.rsplit(".", 2)[-2] == "bn" for n in batch_norm), sorted(batch_norm)[:4]


def test_gpunet_recipe_keeps_timms_set():
    decayed = decayed_names("configs/gpunet/gpunet_0.yaml", "global.device=cpu", "lr.warmup_epochs=0")
    model = build_model(load_config("configs/gpunet/gpunet_0.yaml", ["model.num_classes=10"]))
    shapes = {n: p.shape for n, p in model.named_parameters() if not p.stop_gradient}
    assert decayed == {n for n, s in shapes.items() if len(s) > 1}
    undecayed_biases = [n for n, s in shapes.items() if n.endswith(".bias") and n not in decayed]
    assert any(not n.rsplit(".", 2)[-2].startswith("bn") for n in undecayed_biases)  # the classifier's, at least


@pytest.mark.parametrize("value, fix", [(True, "decay_params: all"), (False, "decay_params: all_but_1d")])
def test_the_retired_key_names_its_replacement(tmp_path, value, fix):
    path = tmp_path / "old.yaml"
    path.write_text(f"optimizer:\n  decay_bn_and_bias: {str(value).lower()}\n")
    with pytest.raises(ConfigError) as err:
        load_config(str(path))
    msg = str(err.value)
    assert msg.startswith(str(path)) and "optimizer.decay_bn_and_bias" in msg and fix in msg
    with pytest.raises(ConfigError, match="write optimizer.decay_params: all_but_1d"):
        load_config(None, ["optimizer.decay_params=default"])
