"""Output parity with the reference implementations: a reference model with seeded random weights and
perturbed BN statistics is saved in its native format, converted by tools/convert_weights.py, and
ppdlx's eval-mode outputs must match the reference's to 1e-4 relative (fp32).

Needs torch (CPU), and torchvision / timm / effdet per test; each test skips naming what is absent.
NVIDIA's GPUNet builder is not a package: GPUNet is covered by test_convert against the recorded
reference parameter names and shapes.
"""
import collections
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest

from ppdlx.models import build_model
from ppdlx.weights import read_checkpoint
from tests.weights.reference import import_torchvision, perturb_batchnorm, relative_error
from tests.weights.torch_format import BFloat16, View, save_torch_legacy, save_torch_zip

torch = pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RTOL = 1e-4


def convert_cli(source, path, model, prefix, *extra):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "convert_weights.py"), "--from", source,
                           str(path), "--model", model, "--output", str(prefix), *extra],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def load_converted(model_name, prefix, **kwargs):
    model = build_model(model_name, **kwargs)
    state = paddle.load(f"{prefix}.pdparams")
    assert set(state) == set(model.state_dict())
    model.set_state_dict(state)
    return model.eval()


def images(size, batch=2, seed=0):
    return np.random.RandomState(seed).standard_normal((batch, 3, size, size)).astype(np.float32)


def test_torch_reads_the_test_writer_files_unchanged(tmp_path):
    """The no-PyTorch writer behind the reader tests produces files torch.load accepts (weights_only)."""
    state = collections.OrderedDict(w=np.arange(12, dtype=np.float32).reshape(3, 4), n=np.array(5, np.int64),
                                    h=np.arange(3, dtype=np.float16), b=BFloat16([1.5, -2.25]),
                                    v=View(np.arange(20, dtype=np.float32), 2, (3, 2), (1, 5)))
    for writer in (save_torch_zip, save_torch_legacy):
        path = str(tmp_path / f"{writer.__name__}.pth")
        writer({"state_dict": state, "epoch": 3, "flags": [True, None]}, path)
        theirs = torch.load(path, weights_only=True)
        ours = read_checkpoint(path).content
        assert theirs["epoch"] == ours["epoch"] == 3 and theirs["flags"] == ours["flags"] == [True, None]
        assert list(theirs["state_dict"]) == list(ours["state_dict"])
        for key, tensor in theirs["state_dict"].items():
            assert tuple(tensor.shape) == ours["state_dict"][key].shape, key
            np.testing.assert_array_equal(tensor.float().numpy(), ours["state_dict"][key], err_msg=key)
        assert theirs["state_dict"]["b"].dtype == torch.bfloat16 and theirs["state_dict"]["h"].dtype == torch.float16


def test_torchvision_resnet50_matches(tmp_path):
    torchvision = import_torchvision()
    torch.manual_seed(0)
    reference = perturb_batchnorm(torchvision.models.resnet50())
    torch.save(reference.state_dict(), tmp_path / "resnet50.pth")
    stdout = convert_cli("torchvision", tmp_path / "resnet50.pth", "resnet50", tmp_path / "rn50")
    assert "320 tensors read, 267 parameters written, dropped: 53 BatchNorm step counter" in stdout
    x = images(224)
    with torch.no_grad():
        want = reference(torch.from_numpy(x)).numpy()
    got = load_converted("resnet50", tmp_path / "rn50")(paddle.to_tensor(x)).numpy()
    assert sum(p.numel() for p in reference.parameters()) == 25_557_032
    assert relative_error(got, want) < RTOL


def test_timm_resnet50_safetensors_matches(tmp_path):
    import_torchvision()  # timm imports it
    timm = pytest.importorskip("timm")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    torch.manual_seed(1)
    reference = perturb_batchnorm(timm.create_model("resnet50", pretrained=False), seed=1)
    safetensors_torch.save_file(reference.state_dict(), str(tmp_path / "model.safetensors"))
    stdout = convert_cli("timm", tmp_path / "model.safetensors", "resnet50", tmp_path / "rn50")
    assert stdout.startswith("timm safetensors '<top level>' -> resnet50 (1000 classes)")
    x = images(224, seed=1)
    with torch.no_grad():
        want = reference(torch.from_numpy(x)).numpy()
    got = load_converted("resnet50", tmp_path / "rn50")(paddle.to_tensor(x)).numpy()
    assert relative_error(got, want) < RTOL


def test_timm_tf_efficientnet_b0_training_checkpoint_matches_with_new_classes(tmp_path):
    """A timm training checkpoint (raw + EMA weights): the EMA copy is imported; a 10-class
    conversion leaves the classifier out and keeps everything before it."""
    import_torchvision()  # timm imports it
    timm = pytest.importorskip("timm")
    torch.manual_seed(2)
    reference = perturb_batchnorm(timm.create_model("tf_efficientnet_b0", pretrained=False), seed=2)
    raw = {k: torch.zeros_like(v) for k, v in reference.state_dict().items()}
    torch.save({"epoch": 10, "state_dict": raw, "state_dict_ema": reference.state_dict()}, tmp_path / "ckpt.pth.tar")
    stdout = convert_cli("timm", tmp_path / "ckpt.pth.tar", "efficientnet_b0", tmp_path / "b0")
    assert "'state_dict_ema' -> efficientnet_b0" in stdout
    x = images(224, seed=2)
    with torch.no_grad():
        want = reference(torch.from_numpy(x)).numpy()
    ours = load_converted("efficientnet_b0", tmp_path / "b0")
    assert relative_error(ours(paddle.to_tensor(x)).numpy(), want) < RTOL

    convert_cli("timm", tmp_path / "ckpt.pth.tar", "efficientnet_b0", tmp_path / "b0_10", "--num-classes", "10")
    state = paddle.load(str(tmp_path / "b0_10.pdparams"))
    assert "fc.weight" not in state and len(state) == len(ours.state_dict()) - 2
    ten = build_model("efficientnet_b0", num_classes=10)
    ten.set_state_dict({**state, "fc.weight": reference.classifier.weight[:10].detach().numpy().T,
                        "fc.bias": reference.classifier.bias[:10].detach().numpy()})
    ten.eval()
    # with the reference's first 10 classifier rows the new-class model is the reference restricted to them
    assert relative_error(ten(paddle.to_tensor(x)).numpy(), want[:, :10]) < RTOL


def test_effdet_tf_efficientdet_d0_outputs_per_level_and_anchors_match(tmp_path):
    import_torchvision()  # effdet imports it
    effdet = pytest.importorskip("effdet")
    from effdet.anchors import Anchors

    from ppdlx.models.detection.anchors import generate_anchors
    torch.manual_seed(3)
    size = 256  # the 512 network at a quarter of the pixels: same weights, every level still > 1x1
    reference = effdet.create_model("tf_efficientdet_d0", pretrained=False, pretrained_backbone=False,
                                    image_size=(size, size))
    perturb_batchnorm(reference, seed=3)
    assert sum(p.numel() for p in reference.parameters()) == 3_880_067
    torch.save({"state_dict": reference.state_dict()}, tmp_path / "d0.pth")
    stdout = convert_cli("effdet", tmp_path / "d0.pth", "efficientdet_d0", tmp_path / "d0")
    assert "784 tensors read, 676 parameters written, dropped: 108 BatchNorm step counter" in stdout
    x = images(size, batch=1, seed=3)
    with torch.no_grad():
        want_cls, want_box = reference(torch.from_numpy(x))
    got_cls, got_box = load_converted("efficientdet_d0", tmp_path / "d0")(paddle.to_tensor(x))
    for level, (got, want) in enumerate(zip(list(got_cls) + list(got_box), list(want_cls) + list(want_box))):
        assert tuple(got.shape) == tuple(want.shape), level
        assert relative_error(got.numpy(), want.numpy()) < RTOL, level
    config = effdet.get_efficientdet_config("tf_efficientdet_d0")
    np.testing.assert_allclose(generate_anchors(512), Anchors.from_config(config).boxes.numpy(), atol=1e-4)
