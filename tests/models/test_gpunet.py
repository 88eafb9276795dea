"""GPUNet: the 7 released JSONs build the reference architecture (shapes, counts, drop-path), the
user-JSON path validates with one-line errors, and NHWC matches NCHW."""
import json
import os
import shutil

import numpy as np
import paddle
import pytest

from ppdlx.errors import ConfigError
from ppdlx.models import build_model
from ppdlx.models import gpunet as G
from ppdlx.registry import MODELS

NAMES = G.GPUNET_NAMES

# Trainable parameters at 1000 classes (computed with this port; cross-checked below against an
# independent count from the reference module formulas; D1 10.59M agrees with the paper's 10.6M).
PARAMS = {
    "gpunet_0": 11_885_432,
    "gpunet_1": 12_704_192,
    "gpunet_2": 25_798_704,
    "gpunet_p0": 22_815_080,
    "gpunet_p1": 39_905_672,
    "gpunet_d1": 10_589_859,
    "gpunet_d2": 19_036_728,
}

# Output spatial size of JSON entries 1..N-1 (the tail is excluded) at the spec resolution,
# transcribed from the "HxW in->out" columns of shared/specs/gpunet.md section 2.4.
SPATIAL = {
    "gpunet_0": (320, [160, 160, 160, 79, 79, 39, 39, 39, 20, 20, 20, 10, 10]),
    "gpunet_1": (288, [144, 144, 71, 71, 35, 35, 18, 18, 18, 18, 18, 9, 9, 9, 9]),
    "gpunet_2": (384, [192] * 4 + [94] + [46] * 3 + [23] * 10 + [12] * 15),
    "gpunet_p0": (224, [112, 112, 112, 56, 28, 28, 28, 14, 14, 14, 7, 7, 7, 7, 4]),
    "gpunet_p1": (224, [112, 112, 112, 56, 56, 56, 28, 28, 14, 14, 14, 7, 7, 7, 7, 4]),
    "gpunet_d1": (456, [228, 228] + [114] * 3 + [57] * 4 + [29] * 8 + [15] * 6),
    "gpunet_d2": (528, [264, 264] + [132] * 3 + [66] * 4 + [33] * 10 + [17] * 7),
}

# {entry index: drop-path rate} of the residual blocks, from the spec tables (4 decimals).
RESIDUAL = {
    "gpunet_0": {5: .0714, 7: .1, 8: .1143, 10: .1429, 11: .1571, 13: .1857},
    "gpunet_1": {4: .05, 6: .075, 9: .1125, 10: .125, 11: .1375, 13: .1625, 14: .175, 15: .1875},
    "gpunet_2": {7: .0412, 8: .0471, 10: .0588, 11: .0647, 12: .0706, 13: .0765, 14: .0824, 16: .0941,
                 17: .1, 18: .1059, 20: .1176, 21: .1235, 22: .1294, 23: .1353, 24: .1412, 25: .1471,
                 26: .1529, 28: .1647, 29: .1706, 30: .1765, 31: .1824, 32: .1882, 33: .1941},
    "gpunet_p0": {6: .075, 7: .0875, 9: .1125, 10: .125, 12: .15, 13: .1625, 14: .175},
    "gpunet_p1": {5: .0588, 6: .0706, 8: .0941, 10: .1176, 11: .1294, 13: .1529, 14: .1647, 15: .1765},
    # distill family: residual but no stochastic depth in the reference
    "gpunet_d1": {i: 0.0 for i in (2, 4, 5, 7, 8, 9, 11, 12, 13, 15, 16, 17, 19, 20, 21, 22, 23)},
    "gpunet_d2": {i: 0.0 for i in (2, 4, 5, 7, 8, 9, 11, 12, 13, 14, 16, 17, 18, 19, 21, 22, 23, 24, 25, 26)},
}

# "mid ch" column of the spec for irb/fused_irb entries (float expansions in P0/P1).
MID = {
    "gpunet_0": {4: 160, 5: 160, 6: 160, 7: 320, 8: 320, 9: 320, 10: 1280, 11: 1280, 12: 1280, 13: 3520},
    "gpunet_p0": {5: 512, 6: 736, 7: 736, 8: 736, 9: 1088, 10: 1216, 11: 2048, 12: 2688, 13: 2368,
                  14: 1792, 15: 4032},
    "gpunet_p1": {5: 512, 6: 512, 7: 512, 8: 768, 9: 768, 10: 1920, 11: 2016, 12: 2016, 13: 5632,
                  14: 5216, 15: 5632, 16: 5600},
    "gpunet_d1": {2: 33, 3: 99, 10: 402, 14: 804, 16: 1140, 23: 804},
}


@pytest.fixture(scope="module")
def models():
    paddle.seed(0)
    return {name: build_model(name) for name in NAMES}


def n_trainable(model):
    return sum(int(np.prod(p.shape)) for p in model.parameters() if not p.stop_gradient)


def reference_param_count(config, num_classes):
    """Independent count from the reference module definitions (gpunet_modules.py)."""

    def mkdiv(v):
        new_v = max(8, int(v + 4) // 8 * 8)
        return new_v + 8 if new_v < 0.9 * v else new_v

    distill, total = config[0]["distill"], 0
    for e in config[1:]:
        t, cin, cout = e["layer_type"], e["num_in_channels"], e["num_out_channels"]
        bn = 2 * cout
        if t in ("head", "head_large"):
            total += 9 * cin * cout + bn + (2 * (9 * cout * cout + bn) if t == "head_large" else 0)
        elif t == "conv":
            total += e["kernel_size"] ** 2 * cin * cout + bn
        elif t == "tail":
            if distill:
                total += cin * 1152 + 2 * 1152 + 1152 * cout + cout * num_classes + num_classes
            else:
                total += cin * cout + bn + cout * num_classes + num_classes
        elif distill:  # Inverted_Residual_Block
            mid, g, k = cin * e["expansion"], e["groups"], e["kernel_size"]
            total += cin // g * mid + 2 * mid + k * k * mid + 2 * mid + mid // g * cout + bn
        else:  # InvertedResidual / EdgeResidual
            exp, k = e["expansion"], e["kernel_size"]
            mid = mkdiv(cin * exp)
            body = (cin * mid + 2 * mid + k * k * mid + 2 * mid) if t == "irb" else (k * k * cin * mid + 2 * mid)
            rd = round(mid * (0.25 / exp))
            se = (mid * rd + rd + rd * mid + mid) if e["use_se"] else 0
            total += body + se + mid * cout + bn
    return total


def test_registered_factories():
    for name in NAMES + ("gpunet_json",):
        assert name in MODELS
    import inspect
    sig = inspect.signature(MODELS.get("gpunet_0")).parameters
    assert [(k, v.default) for k, v in sig.items()] == [
        ("num_classes", 1000), ("data_format", "NCHW"), ("drop_path_rate", 0.2), ("dropout", 0.2)]


def test_shipped_architecture_jsons_are_arrays():
    for name in NAMES:
        with open(G.arch_path(name), "rb") as f:
            ours = f.read()
        assert len(ours) > 3000 and ours.lstrip().startswith(b"[")


def test_json_copies_are_byte_identical():
    # the reference copies live in the repo's sibling shared/ (developers' machines and CI)
    shared = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                           "..", "..", "..", "shared", "data", "gpunet"))
    if not os.path.isdir(shared):
        pytest.skip(f"reference GPUNet architecture directory {shared} is absent")
    for name in NAMES:
        with open(G.arch_path(name), "rb") as ours, open(os.path.join(shared, name + ".json"), "rb") as theirs:
            assert theirs.read() == ours.read(), name


@pytest.mark.parametrize("name", NAMES)
def test_param_counts(models, name):
    m = models[name]
    assert n_trainable(m) == PARAMS[name]
    assert reference_param_count(m.config, 1000) == PARAMS[name]
    assert m.num_classes == 1000 and m.data_format == "NCHW"
    assert m.img_resolution == SPATIAL[name][0]


def test_num_classes_override_changes_only_the_classifier(models):
    m = build_model("gpunet_p0", num_classes=10)
    assert m.num_classes == 10
    # linear 1984 x (1000 -> 10) weights + bias
    assert PARAMS["gpunet_p0"] - n_trainable(m) == 1984 * 990 + 990
    assert reference_param_count(m.config, 10) == n_trainable(m)


@pytest.mark.parametrize("name", NAMES)
def test_spatial_sizes_at_spec_resolution(models, name):
    res, expected = SPATIAL[name]
    m = models[name]
    m.eval()
    x = paddle.randn([1, 3, res, res])
    sizes = []
    with paddle.no_grad():
        for _, layer in m.network.named_children():
            x = layer(x)
            if x.ndim == 4:
                assert x.shape[2] == x.shape[3]
                sizes.append(x.shape[2])
    assert sizes == expected
    assert x.shape == [1, 1000] and bool(paddle.isfinite(x).all())


@pytest.mark.parametrize("name", NAMES)
def test_residual_and_drop_path_placement(models, name):
    m = models[name]
    table = m.block_table()
    assert [i for i, *_ in table] == list(range(1, len(m.config)))  # children named by entry index
    got = {i: rate for i, _, res, rate in table if res}
    assert sorted(got) == sorted(RESIDUAL[name])
    for i, rate in got.items():
        assert round(rate, 4) == pytest.approx(RESIDUAL[name][i], abs=1e-9)
        if not m.distill:
            assert rate == pytest.approx(0.2 * i / (len(m.config) - 1), rel=1e-12)
    # non-residual blocks never drop
    assert all(rate == 0.0 for _, _, res, rate in table if not res)


@pytest.mark.parametrize("name", ["gpunet_0", "gpunet_p0", "gpunet_p1", "gpunet_d1"])
def test_mid_channels_match_spec(models, name):
    layers = dict(models[name].network.named_children())
    for i, mid in MID[name].items():
        assert layers[str(i)].mid_channels == mid, i


def test_block_details_gpunet0(models):
    net = dict(models["gpunet_0"].network.named_children())
    # head: no act key -> swish; P0 head says relu (the activation the BN "1" owns: the reference's child "2")
    assert isinstance(net["1"].net["1"].act, paddle.nn.Silu)
    assert isinstance(dict(models["gpunet_p0"].network.named_children())["1"].net["1"].act, paddle.nn.ReLU)
    # fused IRB padding quirk: stride 2 -> VALID (0), stride 1 k3 -> 1
    assert net["4"].conv_exp._padding == 0 and net["4"].conv_exp._stride == [2, 2]
    assert net["5"].conv_exp._padding == 1
    # irb depthwise: symmetric ((s-1)+(k-1))//2 = 1 for k3 s2
    assert net["9"].conv_dw._padding == 1 and net["9"].conv_dw._groups == 320
    # SE reduce channels round(mid * 0.25 / exp): 1280*0.05 = 64, 3520*0.05 = 176
    assert net["12"].se.rd_channels == 64 and net["13"].se.rd_channels == 176
    assert isinstance(net["10"].se, paddle.nn.Identity) and isinstance(net["9"].bn1.act, paddle.nn.Silu)
    # BN eps 1e-3 / momentum 0.9 everywhere in the non-distill family; head dropout 0.2
    bns = [l for l in models["gpunet_0"].sublayers() if isinstance(l, paddle.nn.BatchNorm2D)]
    assert len(bns) == 1 + 2 + 5 * 2 + 5 * 3 + 1  # head, 2 conv, 5 fused (2 BN), 5 irb (3 BN), tail
    assert {(b._epsilon, b._momentum) for b in bns} == {(1e-3, 0.9)}
    assert net["14"].net["5"].p == 0.2


def test_distill_family_details(models):
    d2 = dict(models["gpunet_d2"].network.named_children())
    # head_large: 3 x conv-BN-ReLU, numbered as the reference's 9 children (each ReLU owned by its BN)
    head = d2["1"].net
    assert [name for name, _ in head.named_children()] == ["0", "1", "3", "4", "6", "7"]
    assert all(isinstance(head[i].act, paddle.nn.ReLU) for i in ("1", "4", "7"))
    bns = [l for l in models["gpunet_d2"].sublayers() if isinstance(l, paddle.nn.BatchNorm2D)]
    assert {b._epsilon for b in bns} == {1e-5}
    tail = d2["27"].net
    assert tail["0"].weight.shape == [1152, 384, 1, 1] and tail["4"].weight.shape == [1984, 1152, 1, 1]
    assert tail["4"].bias is None and tail["8"].weight.shape == [1984, 1000]
    # distill Fused_IRB (unused by the shipped JSONs): BN eps 1e-3, pad k//2 even at stride 2
    f = G.FusedIRBD(8, 16, 3, 2, 4)
    assert f.body["0"]._padding == 1 and {f.body["1"]._epsilon, f.body["4"]._epsilon} == {1e-3}
    assert f(paddle.randn([1, 8, 9, 9])).shape == [1, 16, 5, 5]


@pytest.mark.parametrize("name", NAMES)
def test_forward_backward_small(models, name):
    paddle.seed(1)
    m = models[name]
    m.train()
    x = paddle.randn([2, 3, 64, 64])
    logits = m(x)
    assert logits.shape == [2, 1000]
    loss = paddle.nn.functional.cross_entropy(logits, paddle.to_tensor([3, 7]))
    loss.backward()
    assert np.isfinite(float(loss))
    params = [p for p in m.parameters() if not p.stop_gradient]
    with_grad = [p for p in params if p.grad is not None]
    assert len(with_grad) == len(params)
    assert all(bool(paddle.isfinite(p.grad).all()) for p in with_grad)
    assert sum(float(p.grad.abs().sum()) for p in with_grad) > 0
    m.clear_gradients()
    m.eval()


def test_drop_path_identity_in_eval_and_active_in_train():
    paddle.seed(4)
    a = build_model("gpunet_0", num_classes=5, drop_path_rate=0.9, dropout=0.0)
    b = build_model("gpunet_0", num_classes=5, drop_path_rate=0.0, dropout=0.0)
    b.set_state_dict(a.state_dict())
    x = paddle.randn([4, 3, 32, 32])
    a.eval(), b.eval()
    with paddle.no_grad():
        assert float((a(x) - b(x)).abs().max()) == 0.0
        a.train(), b.train()
        diff = float((a(x) - b(x)).abs().max())
    assert diff > 1e-3


@pytest.mark.parametrize("name", ["gpunet_0", "gpunet_d2"])
def test_nhwc_matches_nchw(models, name):
    paddle.seed(5)
    a = build_model(name, num_classes=7)
    b = build_model(name, num_classes=7, data_format="NHWC")
    assert b.data_format == "NHWC"
    b.set_state_dict(a.state_dict())
    a.eval(), b.eval()
    x = paddle.randn([2, 3, 48, 48])
    with paddle.no_grad():
        ya, yb = a(x), b(paddle.transpose(x, [0, 2, 3, 1]))
    assert ya.shape == yb.shape == [2, 7]
    assert float((ya - yb).abs().max()) < 1e-4 * max(1.0, float(ya.abs().max()))


def test_bad_data_format():
    with pytest.raises(ConfigError, match="data_format"):
        build_model("gpunet_0", data_format="NCWH")


# ------------------------------------------------------------------- user JSON files
def _write(tmp_path, config, name="gpunet.json"):
    p = tmp_path / name
    p.write_text(json.dumps(config) if not isinstance(config, str) else config)
    return str(p)


def _arch(name):
    with open(G.arch_path(name)) as f:
        return json.load(f)


def _err(path, **kw):
    with pytest.raises(ConfigError) as ei:
        build_model("gpunet_json", json_path=path, **kw)
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith(path + ": ")
    return msg


def test_user_json_builds_and_overrides(tmp_path):
    path = str(tmp_path / "mine.json")
    shutil.copy(G.arch_path("gpunet_d2"), path)  # has the upstream "stage:" typo key
    m = build_model("gpunet_json", json_path=path)
    assert m.num_classes == 1000 and m.img_resolution == 528 and n_trainable(m) == PARAMS["gpunet_d2"]
    m = build_model("gpunet_json", json_path=path, num_classes=3)
    assert m.num_classes == 3 and m.drop_path_rate == 0.0
    cfg = _arch("gpunet_p0")
    cfg[-1]["num_classes"] = 12
    m = build_model("gpunet_json", json_path=_write(tmp_path, cfg))
    assert m.num_classes == 12 and m.drop_path_rate == 0.2
    assert m(paddle.randn([1, 3, 32, 32])).shape == [1, 12]


def test_user_json_unknown_layer_type(tmp_path):
    cfg = _arch("gpunet_0")
    cfg[3]["layer_type"] = "fused_ibr"
    msg = _err(_write(tmp_path, cfg))
    assert "entry 3" in msg and "'fused_ibr'" in msg and "did you mean 'fused_irb'" in msg


def test_user_json_missing_key(tmp_path):
    cfg = _arch("gpunet_0")
    del cfg[9]["stride"]
    path = _write(tmp_path, cfg)
    assert _err(path) == f"{path}: entry 9 (irb): missing key 'stride'"
    cfg = _arch("gpunet_d1")
    del cfg[4]["groups"]
    path = _write(tmp_path, cfg, "d1.json")
    assert _err(path) == f"{path}: entry 4 (irb): missing key 'groups'"


def test_user_json_structure_errors(tmp_path):
    assert "expected a JSON list" in _err(_write(tmp_path, {"layer_type": "data"}))
    cfg = _arch("gpunet_0")
    assert "entry 0 must be the 'data' layer" in _err(_write(tmp_path, cfg[1:]))
    assert "invalid JSON" in _err(_write(tmp_path, "[{"))
    assert "file not found" in _err(str(tmp_path / "nope.json"))
    bad = _arch("gpunet_0")
    bad[2]["act"] = "gelu"
    assert "entry 2 (conv): unsupported act 'gelu'" in _err(_write(tmp_path, bad))
    bad = _arch("gpunet_0")
    bad[5]["num_in_channels"] = 48
    assert "entry 5 (fused_irb): num_in_channels 48 does not match" in _err(_write(tmp_path, bad))
    bad = _arch("gpunet_d1")
    bad[1]["layer_type"] = "conv"
    bad[1].update(kernel_size=3, stride=2, act="relu")
    assert "entry 1: layer_type 'conv' is not supported" in _err(_write(tmp_path, bad))
    bad = _arch("gpunet_0")
    del bad[0]["distill"]
    assert "entry 0 (data): missing key 'distill'" in _err(_write(tmp_path, bad))
    bad = _arch("gpunet_0")[:-1]
    assert "the last entry must be a 'tail'" in _err(_write(tmp_path, bad))
