"""Name mappings and the used-exactly-once / filled-with-matching-shape check, without PyTorch.

Checkpoints are built in the published layouts (names and shapes from the reference code, or for
GPUNet from NVIDIA's model as recorded in shared/data/gpunet/reference_state_dicts) with random
values, written in the published container, converted, and every ppdlx tensor is compared with the
source tensor it must come from.
"""
import collections
import hashlib
import json
import os
import pickle
import subprocess
import sys

import numpy as np
import paddle
import pytest

from ppdlx.checkpoint import load_states
from ppdlx.checkpoint import convert_weights
from ppdlx.models import build_model
from ppdlx.models.gpunet import GPUNET_NAMES
from ppdlx.weights import WeightsError, convert_state, detect_source, import_state
from tests.engine.test_training import tiny_overrides
from tests.weights.torch_format import save_torch_zip

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPUNET_REFERENCE = os.path.join(ROOT, "..", "shared", "data", "gpunet", "reference_state_dicts")
TINY = dict(widths=(16, 32, 64, 128), depths=(1, 1, 1, 1), stem=16)  # resnet18_bottleneck_tiny


def _bn(state, name, channels, rng):
    state[f"{name}.weight"] = rng.uniform(0.5, 1.5, channels).astype(np.float32)
    state[f"{name}.bias"] = rng.uniform(-0.1, 0.1, channels).astype(np.float32)
    state[f"{name}.running_mean"] = rng.uniform(-0.1, 0.1, channels).astype(np.float32)
    state[f"{name}.running_var"] = rng.uniform(0.5, 1.5, channels).astype(np.float32)
    state[f"{name}.num_batches_tracked"] = np.array(1000, dtype=np.int64)


def torchvision_resnet_state(widths, depths, stem, num_classes, seed=0):
    """A torchvision ``ResNet(Bottleneck)`` state_dict layout (``conv1``, ``layerN.B.convK``, ...)."""
    rng = np.random.RandomState(seed)
    conv = lambda o, i, k: (rng.standard_normal((o, i, k, k)) * np.sqrt(2.0 / (i * k * k))).astype(np.float32)
    state = collections.OrderedDict()
    state["conv1.weight"] = conv(stem, 3, 7)
    _bn(state, "bn1", stem, rng)
    in_ch = stem
    for layer, (width, depth) in enumerate(zip(widths, depths), start=1):
        for block in range(depth):
            p = f"layer{layer}.{block}"
            for k, (o, i, size) in enumerate(((width, in_ch, 1), (width, width, 3), (4 * width, width, 1)), start=1):
                state[f"{p}.conv{k}.weight"] = conv(o, i, size)
                _bn(state, f"{p}.bn{k}", o, rng)
            if block == 0:
                state[f"{p}.downsample.0.weight"] = conv(4 * width, in_ch, 1)
                _bn(state, f"{p}.downsample.1", 4 * width, rng)
            in_ch = 4 * width
    state["fc.weight"] = rng.uniform(-0.05, 0.05, (num_classes, in_ch)).astype(np.float32)
    state["fc.bias"] = rng.uniform(-0.05, 0.05, num_classes).astype(np.float32)
    return state


def tiny_file(tmp_path, num_classes=10, wrap=None):
    state = torchvision_resnet_state(num_classes=num_classes, **TINY)
    path = str(tmp_path / "tv_tiny.pth")
    save_torch_zip({wrap: state} if wrap else state, path)
    return path, state


def test_torchvision_layout_fills_every_parameter_with_its_tensor(tmp_path):
    path, src = tiny_file(tmp_path)
    out, meta = convert_state("torchvision", path, "resnet18_bottleneck_tiny")
    pairs = {"stem.conv.weight": "conv1.weight", "stem.bn._mean": "bn1.running_mean",
             "stages.0.0.conv1.conv.weight": "layer1.0.conv1.weight",
             "stages.1.0.conv2.conv.weight": "layer2.0.conv2.weight",
             "stages.2.0.conv3.bn.weight": "layer3.0.bn3.weight",
             "stages.3.0.conv2.bn._variance": "layer4.0.bn2.running_var",
             "stages.3.0.shortcut.conv.weight": "layer4.0.downsample.0.weight",
             "stages.3.0.shortcut.bn.bias": "layer4.0.downsample.1.bias", "fc.bias": "fc.bias"}
    for ours, theirs in pairs.items():
        np.testing.assert_array_equal(out[ours], src[theirs], err_msg=ours)
    np.testing.assert_array_equal(out["fc.weight"], src["fc.weight"].T)  # paddle Linear is [in, out]
    assert list(out) == list(build_model("resnet18_bottleneck_tiny", num_classes=10).state_dict())
    bns = sum(k.endswith("num_batches_tracked") for k in src)
    assert meta["dropped"] == {"BatchNorm step counter": bns} and meta["tensors_read"] == len(src)
    assert meta["parameters_written"] == len(src) - bns and meta["num_classes"] == meta["source_num_classes"] == 10


def test_missing_leftover_and_misshaped_tensors_fail_in_one_line(tmp_path):
    base = torchvision_resnet_state(num_classes=10, **TINY)
    cases = {
        "extra": ({**base, "layer5.0.conv1.weight": np.zeros((4, 4, 1, 1), np.float32)},
                  "tensor 'layer5.0.conv1.weight' [4, 4, 1, 1] is not part of the 'torchvision' layout of this model"),
        "missing": ({k: v for k, v in base.items() if k != "layer2.0.bn2.running_var"},
                    "1 ppdlx parameter(s) of 'resnet18_bottleneck_tiny' get no tensor from the file, "
                    "e.g. 'stages.1.0.conv2.bn._variance' [32]"),
        # before: KeyError 'fc.bias' (a traceback)
        "no_fc_bias": ({k: v for k, v in base.items() if k != "fc.bias"},
                       "the file holds the classifier's 'fc.weight' but nothing for ppdlx 'fc.bias' (entry "
                       "'<top level>'): a classifier cannot be half converted: convert a complete state_dict"),
        "shape": ({**base, "layer3.0.conv2.weight": np.zeros((64, 64, 1, 1), np.float32)},
                  "tensor 'layer3.0.conv2.weight' has shape [64, 64, 1, 1] but ppdlx 'stages.2.0.conv2.conv.weight' "
                  "needs [64, 64, 3, 3]"),
    }
    for case, (state, message) in cases.items():
        path = str(tmp_path / f"{case}.pth")
        save_torch_zip(state, path)
        with pytest.raises(WeightsError) as err:
            convert_state("torchvision", path, "resnet18_bottleneck_tiny")
        assert str(err.value).startswith(f"{path}: {message}"), (case, str(err.value))
        assert "\n" not in str(err.value)
    with pytest.raises(WeightsError, match=r"--from effdet maps onto EfficientDet models; 'resnet18_bottleneck_tiny' "
                                           r"is a ResNet"):
        convert_state("effdet", str(tmp_path / "extra.pth"), "resnet18_bottleneck_tiny")
    with pytest.raises(WeightsError, match=r"unknown weights source 'tv' \(known: dle-gpunet, dle-paddle-rn50, "):
        convert_state("tv", str(tmp_path / "extra.pth"), "resnet18_bottleneck_tiny")


def test_other_class_count_leaves_the_classifier_out_and_says_so(tmp_path):
    path, src = tiny_file(tmp_path, wrap="model")
    out, meta = convert_state("timm", path, "resnet18_bottleneck_tiny", num_classes=4)
    assert "fc.weight" not in out and "fc.bias" not in out
    np.testing.assert_array_equal(out["stem.conv.weight"], src["conv1.weight"])
    assert meta["entry"] == "model" and meta["reinitialised"] == ["fc.weight", "fc.bias"]
    assert meta["num_classes"] == 4 and meta["source_num_classes"] == 10
    assert meta["notes"] == ["classifier fc.weight, fc.bias (10 classes in the file) not written: the model "
                             "initialises it for 4 classes"]


def test_timm_safetensors_file_converts_like_the_pytorch_file(tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    path, src = tiny_file(tmp_path)
    st_path = str(tmp_path / "model.safetensors")
    safetensors_numpy.save_file(dict(src), st_path)
    from_zip, _ = convert_state("timm", path, "resnet18_bottleneck_tiny")
    from_st, meta = convert_state("timm", st_path, "resnet18_bottleneck_tiny")
    assert meta["format"] == "safetensors" and list(from_st) == list(from_zip)
    for key in from_zip:
        np.testing.assert_array_equal(from_st[key], from_zip[key], err_msg=key)


def dle_static_state(widths, depths, stem, num_classes, seed=0):
    """DLE's RN50 v1.5 as ``paddle.static.save`` names it: layers numbered per type in construction
    order -- stem conv, then per block conv0 (1x1), conv1 (3x3, stride), conv2 (1x1, x4), short --
    on 4-channel input; BatchNorm w_0/b_0/w_1/w_2 = scale/offset/mean/variance; Linear [in, out]."""
    rng = np.random.RandomState(seed)
    state, counters, order = collections.OrderedDict(), collections.Counter(), []

    def conv_bn(role, o, i, k):
        c = counters["conv"]
        state[f"conv2d_{c}.w_0"] = rng.standard_normal((o, i, k, k)).astype(np.float32)
        for slot in ("w_0", "b_0", "w_1", "w_2"):
            state[f"batch_norm_{c}.{slot}"] = rng.uniform(0.5, 1.5, o).astype(np.float32)
        counters["conv"] += 1
        order.append((role, c))

    conv_bn("stem", stem, 4, 7)
    in_ch = stem
    for stage, (width, depth) in enumerate(zip(widths, depths)):
        for block in range(depth):
            p = f"stages.{stage}.{block}"
            conv_bn(f"{p}.conv1", width, in_ch, 1)
            conv_bn(f"{p}.conv2", width, width, 3)
            conv_bn(f"{p}.conv3", 4 * width, width, 1)
            if block == 0:
                conv_bn(f"{p}.shortcut", 4 * width, in_ch, 1)
            in_ch = 4 * width
    state["linear_0.w_0"] = rng.standard_normal((in_ch, num_classes)).astype(np.float32)
    state["linear_0.b_0"] = rng.standard_normal(num_classes).astype(np.float32)
    return state, order


def test_dle_paddle_static_names_map_in_construction_order_and_drop_the_pad_channel(tmp_path):
    state, order = dle_static_state(num_classes=10, **TINY)
    path = str(tmp_path / "resnet_50_paddle.pdparams")
    with open(path, "wb") as f:  # what paddle.static.save writes: one pickle of name -> ndarray
        pickle.dump(dict(reversed(list(state.items()))), f, protocol=4)
    out, meta = convert_state("dle-paddle-rn50", path, "resnet18_bottleneck_tiny")
    for role, index in order:
        want = state[f"conv2d_{index}.w_0"]
        got = out[f"{role}.conv.weight"]
        np.testing.assert_array_equal(got, want[:, :3] if role == "stem" else want, err_msg=role)
        for slot, param in (("w_0", "weight"), ("b_0", "bias"), ("w_1", "_mean"), ("w_2", "_variance")):
            np.testing.assert_array_equal(out[f"{role}.bn.{param}"], state[f"batch_norm_{index}.{slot}"])
    np.testing.assert_array_equal(out["fc.weight"], state["linear_0.w_0"])  # already [in, out]
    assert meta["format"] == "pickle" and meta["dropped"] == {}
    assert meta["notes"] == ["stem conv: the zero-padding 4th input channel of DLE's 4-channel input dropped"]


@pytest.mark.parametrize("name", GPUNET_NAMES)
def test_gpunet_reference_layout_fills_every_parameter(tmp_path, name):
    """Names and shapes of NVIDIA's GPUNet_Builder models (recorded facts), in a timm-style training
    checkpoint: EMA copy under ``module.``, raw weights beside it, training args next to them."""
    ref_file = os.path.join(GPUNET_REFERENCE, f"{name}.json")
    if not os.path.isfile(ref_file):
        pytest.skip(f"reference GPUNet state_dict facts {ref_file} are absent")
    with open(ref_file) as f:
        reference = json.load(f)["state_dict"]
    rng = np.random.RandomState(1)
    ema = collections.OrderedDict()
    for key, shape in reference:
        ema[key] = (np.array(7, np.int64) if key.endswith("num_batches_tracked")
                    else rng.standard_normal(shape).astype(np.float32))
    raw = collections.OrderedDict((k, np.zeros_like(v)) for k, v in ema.items())
    path = str(tmp_path / f"{name}.pth.tar")
    save_torch_zip({"epoch": 449, "arch": name, "state_dict": raw,
                    "state_dict_ema": collections.OrderedDict((f"module.{k}", v) for k, v in ema.items())}, path)
    out, meta = convert_state("dle-gpunet", path, name)
    assert meta["entry"] == "state_dict_ema" and meta["stripped_prefixes"] == ["module."]
    assert meta["source_num_classes"] == 1000
    by_entry = {}
    for key, _ in reference:
        module = key.split(".")[1]
        by_entry.setdefault(module, len(by_entry) + 1)  # modules in network order = JSON entries 1..n
    used = 0
    for key, _ in reference:
        if key.endswith("num_batches_tracked"):
            continue
        _, module, rest = key.split(".", 2)
        rest = rest.replace("running_mean", "_mean").replace("running_var", "_variance")
        ours = out[f"network.{by_entry[module]}.{rest}"]
        want = ema[key].T if (ours.ndim == 2 and ours.shape != ema[key].shape) else ema[key]
        np.testing.assert_array_equal(ours, want, err_msg=key)
        used += 1
    assert used == len(out) == meta["parameters_written"]

    raw_out, raw_meta = convert_state("dle-gpunet", path, name, prefer_ema=False)
    assert raw_meta["entry"] == "state_dict" and not any(v.any() for v in raw_out.values())


def test_layout_is_detected_for_model_weights_without_a_source_prefix(tmp_path):
    path, src = tiny_file(tmp_path, wrap="state_dict")
    dle, _ = dle_static_state(num_classes=10, **TINY)
    assert detect_source(src) == "torchvision" and detect_source(dle) == "dle-paddle-rn50"
    assert detect_source(["network.head: 2.net.0.weight", "network. layer15.net.6.weight"]) == "dle-gpunet"
    assert detect_source(build_model("resnet18_bottleneck_tiny").state_dict()) is None  # ppdlx's own names
    detected, meta = import_state(path, "resnet18_bottleneck_tiny")
    named, _ = import_state(f"timm:{path}", "resnet18_bottleneck_tiny")
    assert meta["source"] == "torchvision" and list(detected) == list(named)
    native = str(tmp_path / "native.pth")
    save_torch_zip({k: v.numpy() for k, v in build_model("resnet18_bottleneck_tiny").state_dict().items()}, native)
    with pytest.raises(WeightsError, match=r"native\.pth: the tensor names follow none of the known layouts "
                                           r"\(dle-gpunet, .*\); name one as SOURCE:"):
        import_state(native, "resnet18_bottleneck_tiny")


def test_output_files_record_source_hash_and_mapping_and_load_as_model_weights(tmp_path):
    path, src = tiny_file(tmp_path)
    meta = convert_weights("torchvision", path, "resnet18_bottleneck_tiny", str(tmp_path / "out" / "tv"))
    states = load_states(str(tmp_path / "out" / "tv.pdstates"))["weights_import"]
    assert states["sha256"] == hashlib.sha256(open(path, "rb").read()).hexdigest() == meta["sha256"]
    assert states["source"] == "torchvision" and states["mapping_version"] == "torchvision-resnet/1"
    assert states["file"] == os.path.abspath(path) and states["format"] == "torch-zip"
    params = paddle.load(str(tmp_path / "out" / "tv.pdparams"))
    assert len(params) == meta["parameters_written"]
    np.testing.assert_array_equal(np.asarray(params["stages.0.0.conv2.conv.weight"]), src["layer1.0.conv2.weight"])


def convert_tiny_cli(tmp_path, num_classes):
    path, _ = tiny_file(tmp_path)
    prefix = str(tmp_path / "imported" / "tiny")
    convert = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "convert_weights.py"), "--from",
                              "torchvision", path, "--model", "resnet18_bottleneck_tiny", "--output", prefix,
                              "--num-classes", str(num_classes)], capture_output=True, text=True, timeout=600)
    assert convert.returncode == 0, convert.stderr[-2000:]
    assert "note: classifier fc.weight, fc.bias (10 classes in the file) not written" in convert.stdout
    return prefix


def run_tool(tool, config, *overrides):
    return subprocess.run([sys.executable, os.path.join(ROOT, "tools", tool), "-c",
                           os.path.join(ROOT, "configs", "demo", config), "-o", *overrides],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)


def test_imported_weights_fine_tune_to_new_classes_and_export(tmp_path, tiny_tree):
    """CLI convert with another class count -> tools/train.py on 4 classes -> tools/export_model.py."""
    prefix = convert_tiny_cli(tmp_path, 4)
    out = tmp_path / "train"
    train = run_tool("train.py", "rn50_demo.yaml", *tiny_overrides(tiny_tree, out, "train.epochs=1",
                                                                    f"model.weights={prefix}"))
    assert train.returncode == 0, train.stderr[-3000:]
    assert f"loaded weights {prefix} (2 parameters not in the file)" in train.stdout + train.stderr
    export = run_tool("export_model.py", "rn50_demo.yaml",
                      *tiny_overrides(tiny_tree, out, f"model.weights={out}/latest"))
    assert export.returncode == 0, export.stderr[-3000:]
    assert any(name.endswith(".pdiparams") for name in os.listdir(out / "inference"))


def test_imported_weights_prune_with_asp(tmp_path, tiny_tree):
    prefix = convert_tiny_cli(tmp_path, 4)
    out = tmp_path / "asp"
    prune = run_tool("prune_asp.py", "rn50_asp_demo.yaml", *tiny_overrides(tiny_tree, out, "train.epochs=1",
                                                                           f"model.weights={prefix}"))
    assert prune.returncode == 0, prune.stderr[-3000:]
    assert f"loaded weights {prefix} (2 parameters not in the file)" in prune.stdout + prune.stderr
    assert "0 violating" in prune.stdout
