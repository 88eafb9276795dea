"""Export refuses what it must not write, in one line: weights holding NaN or inf (naming the first such
tensor), an output directory that cannot be made; it records the size and sha256 of the program and
weights in inference.yml for deploy to check; --verify of a damaged export names the file."""
import hashlib
import os
import subprocess
import sys

import paddle
import pytest

from ppdlx.config import load_config
from ppdlx.engine.step import NonFiniteWeightsError
from ppdlx.errors import ConfigError
from ppdlx.export import export_model, read_meta
from ppdlx.export.verify import verify_export
from ppdlx.models.from_config import build_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["model.name=resnet18_bottleneck_tiny", "model.num_classes=3", "data.transforms.crop_size=32",
        "data.transforms.resize_short=36", "data.root=/nonexistent", "global.seed=4"]
BAD_TENSOR = "stages.1.0.conv2.conv.weight"


def _weights(tmp_path, name, value=None):
    """A tiny model's initial weights saved as ``<tmp>/<name>.pdparams``, ``BAD_TENSOR`` filled with ``value``."""
    paddle.seed(4)
    state = build_model(load_config(None, TINY)).state_dict()
    if value is not None:
        state[BAD_TENSOR] = paddle.full_like(state[BAD_TENSOR], value)
    prefix = str(tmp_path / name)
    paddle.save(state, prefix + ".pdparams")
    return prefix


def test_export_of_nan_weights_is_one_line_naming_the_tensor(tmp_path):
    prefix = _weights(tmp_path, "diverged", float("nan"))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "export_model.py"), "-c",
                           os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml"), "-o", *TINY,
                           f"model.weights={prefix}", "--output-dir", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 4, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: model.weights={prefix}: '{BAD_TENSOR}' holds NaN (non-finite tensors: 1 of 87); an export of these "
        f"weights would predict NaN/inf: export a checkpoint saved before the run diverged (an earlier epoch_N) or "
        f"retrain with a lower lr.base_lr")
    assert not os.path.exists(tmp_path / "out" / "inference.yml")


def test_export_of_inf_weights_says_inf(tmp_path):
    prefix = _weights(tmp_path, "overflowed", float("inf"))
    cfg = load_config(None, TINY + [f"model.weights={prefix}"])
    with pytest.raises(NonFiniteWeightsError, match=rf"'{BAD_TENSOR}' holds inf \(non-finite tensors: 1 of 87\)"):
        export_model(cfg, output_dir=str(tmp_path / "out"), check_batch_sizes=(1,))


def test_an_output_dir_that_cannot_be_made_is_refused_before_building(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a directory\n")
    cfg = load_config(None, TINY + ["model.weights=/nonexistent/never_read"])  # refused before the weights load
    with pytest.raises(ConfigError, match=rf"^--output-dir {blocker}/export: cannot create it \(Not a directory: "
                                          rf"{blocker}/export\); choose a directory that can be written$"):
        export_model(cfg, output_dir=str(blocker / "export"))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    base = tmp_path_factory.mktemp("recorded")
    prefix = _weights(base, "weights")
    cfg = load_config(None, TINY + [f"model.weights={prefix}"])
    report = export_model(cfg, output_dir=str(base / "export"), onnx=True, labels=["a", "b", "c"],
                          check_batch_sizes=(1,))
    return cfg, report["model_dir"]


def test_inference_yml_records_every_file_it_describes(exported):
    _, model_dir = exported
    records = read_meta(model_dir)["files"]
    assert sorted(records) == ["inference.json", "inference.pdiparams"]  # not the ONNX file: often rewritten
    for name, record in records.items():
        with open(os.path.join(model_dir, name), "rb") as f:
            data = f.read()
        assert record == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_verify_of_a_damaged_export_names_the_file(exported, tmp_path):
    cfg, model_dir = exported
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for name in os.listdir(model_dir):
        with open(os.path.join(model_dir, name), "rb") as f:
            data = f.read()
        if name == "inference.pdiparams":
            data = data[: len(data) // 2]
        (damaged / name).write_bytes(data)
    record = read_meta(model_dir)["files"]["inference.pdiparams"]
    with pytest.raises(ConfigError) as err:
        verify_export(cfg, str(damaged), source=str(tmp_path / "never_read"))
    assert str(err.value) == (f"--verify: {damaged}/inference.pdiparams: {record['bytes'] // 2} bytes, but the export "
                              f"wrote {record['bytes']} (truncated or replaced since); re-export the model with "
                              f"tools/export_model.py (tools/quantize.py for an int8 export)")


def _ended_pid():
    """The id of a process that has ended."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_the_staging_folder_of_a_killed_export_is_removed_by_the_next_export(tmp_path):
    # Before: a killed export left its hidden .export-staging-* folder (a whole export's size) and the next export
    # into the folder left it there.
    prefix = _weights(tmp_path, "weights")
    model_dir = tmp_path / "export"
    killed, running, nameless = (model_dir / f".export-staging-{_ended_pid()}-k1ll3d",
                                 model_dir / f".export-staging-{os.getpid()}-busy", model_dir / ".export-staging-q9x")
    for folder in (killed, running, nameless):
        folder.mkdir(parents=True)
        (folder / "inference.pdiparams").write_bytes(b"\0" * 1024)
    export_model(load_config(None, TINY + [f"model.weights={prefix}"]), output_dir=str(model_dir),
                 check_batch_sizes=(1,))
    hidden = sorted(n for n in os.listdir(model_dir) if n.startswith("."))
    assert hidden == sorted([running.name, nameless.name])  # a live export's and an unattributable one are kept
    assert os.path.isfile(model_dir / "inference.yml")
