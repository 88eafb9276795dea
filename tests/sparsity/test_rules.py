"""Eligibility rules: which Conv2D / Linear weights are pruned, and why not."""
import paddle.nn as nn
import pytest

from ppdlx.config import load_config
from ppdlx.errors import ConfigError
from ppdlx.sparsity import SparsityRules, scan_model


class Net(nn.Layer):
    def __init__(self, num_classes=10):
        super().__init__()
        self.num_classes = num_classes
        self.stem = nn.Conv2D(3, 16, 3)                    # RGB: 3 % 4 != 0
        self.body = nn.Conv2D(16, 32, 3)
        self.dw = nn.Conv2D(32, 32, 3, groups=32)          # depthwise
        self.grouped = nn.Conv2D(32, 32, 1, groups=4)      # grouped (8 channels per group)
        self.odd = nn.Conv2D(32, 6, 1)
        self.up = nn.Conv2DTranspose(6, 8, 2)               # never considered
        self.proj = nn.Linear(8 * 3, 64)                    # 24 inputs
        self.mid = nn.Linear(64, 30)
        self.bad_in = nn.Linear(30, 12)                     # 30 % 4 != 0
        self.fc = nn.Linear(12, num_classes)                # classifier


def verdicts(rules, model=None):
    return {e.layer: (e.prune, e.reason) for e in scan_model(model or Net(), rules)}


def test_default_rules():
    v = verdicts(SparsityRules())
    assert "up" not in v
    assert v["stem"] == (False, "3 input channels not a multiple of 4")
    assert v["body"] == (True, "")
    assert v["dw"] == (False, "depthwise conv")
    assert v["grouped"] == (False, "grouped conv (groups=4)")
    assert v["odd"][0] and v["proj"][0] and v["mid"][0]
    assert v["bad_in"] == (False, "30 input channels not a multiple of 4")
    assert v["fc"] == (False, "classifier (asp.prune_classifier=false)")


def test_configurable_rules():
    v = verdicts(SparsityRules(prune_classifier=True, exclude=("body", "m*")))
    assert v["fc"] == (True, "")
    assert v["body"] == (False, "excluded by pattern 'body'")
    assert v["mid"] == (False, "excluded by pattern 'm*'")
    v = verdicts(SparsityRules(layer_types=("conv2d",)))
    assert v["proj"] == (False, "layer type linear not in asp.layer_types")
    assert v["body"][0]
    v = verdicts(SparsityRules(n=1, m=8))
    assert v["body"] == (True, "") and v["proj"] == (True, "") and v["odd"] == (True, "")
    v = verdicts(SparsityRules(exclude=("*.weight",)))  # parameter names match too
    assert not any(p for p, _ in v.values())


def test_resnet_stem_and_fc_stay_dense():
    from ppdlx.models import build_model
    entries = scan_model(build_model("resnet18_bottleneck_tiny", num_classes=10), SparsityRules())
    dense = {e.layer for e in entries if not e.prune}
    assert dense == {"stem.conv", "fc"}
    assert all(e.param == e.layer + ".weight" for e in entries)


def test_config_fields_and_bad_nm():
    cfg = load_config(None, ["asp.exclude=[stem.*]", "asp.layer_types=[conv2d]", "asp.mask_algo=mask_2d_greedy"])
    rules = SparsityRules.from_config(cfg.asp)
    assert rules.exclude == ("stem.*",) and rules.layer_types == ("conv2d",) and rules.mask_algo == "mask_2d_greedy"
    with pytest.raises(ConfigError, match="asp.n=4, asp.m=4"):
        SparsityRules.from_config(load_config(None, ["asp.n=4"]).asp)
