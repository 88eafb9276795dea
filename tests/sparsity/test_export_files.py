"""``prune_asp.py --check`` on a damaged export names the damaged file in one line (the deploy package's own file
checks, ppdlx.sparsity.export_files): a truncated inference.pdiparams against inference.yml's record or, without
one, by the structure of the file; a truncated or empty inference.onnx."""
import os
import shutil
import subprocess
import sys

import paddle
import pytest

from ppdlx.config import load_config
from ppdlx.errors import DataError
from ppdlx.export import export_model, read_meta
from ppdlx.models.from_config import build_model
from ppdlx.sparsity import check_path

pytest.importorskip("onnx")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "prune_asp.py")
TINY = ["model.name=resnet18_bottleneck_tiny", "model.num_classes=3", "data.transforms.crop_size=32",
        "data.transforms.resize_short=36", "data.root=/nonexistent", "global.seed=4"]
REEXPORT = "re-export the model with tools/export_model.py (tools/quantize.py for an int8 export)"


def check_cli(path):
    return subprocess.run([sys.executable, TOOL, "--check", str(path)], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A recorded export (inference.yml holds the size and sha256 of its program and weights) with its ONNX file."""
    base = tmp_path_factory.mktemp("asp_export")
    paddle.seed(4)
    prefix = str(base / "weights")
    paddle.save(build_model(load_config(None, TINY)).state_dict(), prefix + ".pdparams")
    cfg = load_config(None, TINY + [f"model.weights={prefix}"])
    return export_model(cfg, output_dir=str(base / "export"), onnx=True, labels=["a", "b", "c"],
                        check_batch_sizes=(1,))["model_dir"]


def damaged_copy(model_dir, dest, name, keep=0.5):
    """A copy of the export in ``dest`` with ``name`` cut to ``keep`` of its bytes."""
    shutil.copytree(model_dir, dest)
    path = os.path.join(dest, name)
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[: int(len(data) * keep)])
    return str(dest)


def test_a_truncated_recorded_pdiparams_is_named(exported, tmp_path):
    model_dir = damaged_copy(exported, tmp_path / "export", "inference.pdiparams")
    full = read_meta(exported)["files"]["inference.pdiparams"]["bytes"]
    proc = check_cli(model_dir)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    prefix = os.path.join(model_dir, "inference")
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: --check {prefix}: {prefix}.pdiparams: {int(full * 0.5)} bytes, but the export wrote {full} "
        f"(truncated or replaced since); {REEXPORT}")


def test_a_truncated_unrecorded_pdiparams_is_named_by_its_structure(exported, tmp_path):
    model_dir = damaged_copy(exported, tmp_path / "export", "inference.pdiparams", keep=0.9)
    os.remove(os.path.join(model_dir, "inference.yml"))  # a plain paddle.jit.save export records nothing
    prefix = os.path.join(model_dir, "inference")
    with pytest.raises(DataError) as err:
        check_path(model_dir)
    message = str(err.value)
    assert message.startswith(f"--check {prefix}: {prefix}.pdiparams: truncated: "), message
    assert message.endswith(f"; {REEXPORT}"), message


@pytest.mark.parametrize("keep", [0.5, 0.0])
def test_a_truncated_or_empty_onnx_is_named(exported, tmp_path, keep):
    model_dir = damaged_copy(exported, tmp_path / "export", "inference.onnx", keep=keep)
    onnx_file = os.path.join(model_dir, "inference.onnx")
    proc = check_cli(onnx_file)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    if keep:
        assert last.startswith(f"error: --check {onnx_file}: not a readable ONNX model ("), last
        assert last.endswith("); re-export the model with tools/export_model.py --onnx"), last
    else:
        assert last == f"error: --check {onnx_file}: empty file (0 bytes); {REEXPORT}"
