"""A damaged export is one line naming the file and exit 2, never a traceback, a crash or a silent
prediction: truncated, emptied, garbled or bit-flipped program / weights / inference.yml / ONNX
files, checked before Paddle Inference or onnxruntime read them (ppdlx_deploy.integrity)."""
import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest
import yaml

from benchmarks.infer import load_deploy_module
from ppdlx.config import load_config
from ppdlx.export import export_model
from tests.conftest import make_digits_tree

D = load_deploy_module()
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INFER = os.path.join(ROOT, "deploy", "python", "infer.py")
REEXPORT = "re-export the model with tools/export_model.py"


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """A small classifier (random init) exported as PIR + ONNX and as a legacy program, and one image."""
    base = tmp_path_factory.mktemp("damaged_export")
    tree = make_digits_tree(base / "digits", per_class=1, size=40, classes=2)
    cfg = load_config(None, ["model.name=resnet18_bottleneck_tiny", "model.num_classes=2",
                             "data.transforms.crop_size=32", "data.transforms.resize_short=36",
                             "data.root=/nonexistent", "global.seed=3"])
    export_model(cfg, output_dir=str(base / "pir"), onnx=True, labels=["a", "b"], check_batch_sizes=(1,))
    export_model(cfg, output_dir=str(base / "program"), fmt="program", labels=["a", "b"], check_batch_sizes=(1,))
    image = D.list_images(tree)[0]
    return base, image


def _copy(exports, tmp_path, which="pir", keep_record=True):
    base, _ = exports
    model_dir = str(tmp_path / which)
    shutil.copytree(str(base / which), model_dir)
    if not keep_record:  # as an export written before inference.yml recorded its files
        meta_file = os.path.join(model_dir, "inference.yml")
        with open(meta_file, encoding="utf-8") as f:
            meta = yaml.safe_load(f)
        meta.pop("files", None)
        with open(meta_file, "w", encoding="utf-8") as f:
            yaml.safe_dump(meta, f, sort_keys=False)
    return model_dir


def _run(exports, model_dir, *extra, capsys=None):
    """deploy's command line in process; returns (exit code, stderr)."""
    backend = [] if "--backend" in extra else ["--backend", "paddle-cpu"]  # the runtime that reads these files
    args = ["--model-dir", model_dir, "--input", exports[1], "--threads", "1", *backend, *extra]
    code = D.cli.run(args)
    return code, capsys.readouterr().err


def _cut(path, keep_bytes):
    with open(path, "r+b") as f:
        f.truncate(keep_bytes)


def _tensor_boundaries(path):
    """Byte offsets where each tensor of a combined .pdiparams ends (its layout: integrity.py's docstring)."""
    from paddle.base.proto import framework_pb2
    ends, size = [], os.path.getsize(path)
    with open(path, "rb") as f:
        while f.tell() < size:
            f.read(4)
            assert struct.unpack("<Q", f.read(8))[0] == 0
            f.read(4)
            desc = framework_pb2.VarType.TensorDesc()
            desc.ParseFromString(f.read(struct.unpack("<i", f.read(4))[0]))
            f.seek(int(np.prod(desc.dims)) * 4, os.SEEK_CUR)
            ends.append(f.tell())
    return ends


def test_the_intact_export_runs_and_records_its_files(exports, tmp_path, capsys):
    model_dir = _copy(exports, tmp_path)
    meta = D.load_meta(model_dir)
    assert set(meta["files"]) == {"inference.json", "inference.pdiparams"}  # not the ONNX file: often rewritten
    assert meta["files"]["inference.pdiparams"]["bytes"] == os.path.getsize(os.path.join(model_dir,
                                                                                          "inference.pdiparams"))
    assert _run(exports, model_dir, capsys=capsys)[0] == 0


@pytest.mark.parametrize("keep_record", [True, False], ids=["recorded", "unrecorded"])
def test_pdiparams_short_by_100_bytes_is_refused_not_predicted_with(exports, tmp_path, capsys, keep_record):
    # Paddle Inference itself loads this file and predicts with a garbled last tensor (exit 0 before).
    model_dir = _copy(exports, tmp_path, keep_record=keep_record)
    params = os.path.join(model_dir, "inference.pdiparams")
    _cut(params, os.path.getsize(params) - 100)
    code, err = _run(exports, model_dir, capsys=capsys)
    assert code == 2
    expected = "bytes, but the export wrote" if keep_record else "truncated: "
    assert err.startswith(f"error: {params}: ") and expected in err and err.rstrip().endswith(
        f"{REEXPORT} (tools/quantize.py for an int8 export)")
    assert len(err.strip().splitlines()) == 1


def test_bit_flipped_pdiparams_is_caught_by_the_recorded_sha256(exports, tmp_path, capsys):
    model_dir = _copy(exports, tmp_path)
    params = os.path.join(model_dir, "inference.pdiparams")
    with open(params, "r+b") as f:
        f.seek(os.path.getsize(params) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    code, err = _run(exports, model_dir, capsys=capsys)
    assert (code, err.splitlines()[0]) == (2, f"error: {params}: its content differs from what the export wrote "
                                                f"(sha256 mismatch: damaged or replaced since); {REEXPORT} "
                                                f"(tools/quantize.py for an int8 export)")


@pytest.mark.parametrize("damage,expected", [
    ("empty", "empty file (0 bytes)"),
    ("garbled", "not a Paddle parameters file (unknown tensor version) (tensor #1)"),
    ("half", "truncated: "),
])
def test_damaged_pdiparams_without_a_record(exports, tmp_path, capsys, damage, expected):
    model_dir = _copy(exports, tmp_path, keep_record=False)
    params = os.path.join(model_dir, "inference.pdiparams")
    size = os.path.getsize(params)
    if damage == "garbled":
        with open(params, "wb") as f:
            f.write(np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes())
    else:
        _cut(params, 0 if damage == "empty" else size // 2)
    code, err = _run(exports, model_dir, capsys=capsys)
    assert code == 2 and err.startswith(f"error: {params}: {expected}") and "Traceback" not in err


def test_pdiparams_missing_tensors_is_named_from_paddles_own_error(exports, tmp_path, capsys):
    # Cut exactly after a tensor: the stream walk finds nothing wrong, Paddle Inference fails to read on.
    model_dir = _copy(exports, tmp_path, keep_record=False)
    params = os.path.join(model_dir, "inference.pdiparams")
    _cut(params, _tensor_boundaries(params)[10])
    code, err = _run(exports, model_dir, capsys=capsys)
    assert code == 2
    assert err.startswith(f"error: {params}: Paddle Inference cannot read the weights ((Unavailable) Cannot read "
                          f"tensor desc size); the file is damaged or does not belong to inference.json: {REEXPORT}")


@pytest.mark.parametrize("damage", ["half", "not_utf8"])
def test_damaged_pir_json(exports, tmp_path, capsys, damage):
    model_dir = _copy(exports, tmp_path, keep_record=False)
    program = os.path.join(model_dir, "inference.json")
    if damage == "half":
        _cut(program, os.path.getsize(program) // 2)
    else:
        with open(program, "r+b") as f:
            f.seek(1)
            f.write(b"\x82\xff")
    code, err = _run(exports, model_dir, capsys=capsys)
    assert code == 2 and err.startswith(f"error: {program}: not a readable PIR program (")
    assert err.rstrip().endswith(f"{REEXPORT} (tools/quantize.py for an int8 export)")


@pytest.mark.parametrize("damage,expected", [("empty", "empty file (0 bytes)"),
                                             ("half", "not a readable ProgramDesc (")])
def test_damaged_pdmodel_is_one_line_not_a_crash(exports, tmp_path, damage, expected):
    # An empty or garbled .pdmodel made Paddle Inference crash the process (SIGSEGV): run it in a subprocess.
    model_dir = _copy(exports, tmp_path, "program", keep_record=False)
    program = os.path.join(model_dir, "inference.pdmodel")
    _cut(program, 0 if damage == "empty" else os.path.getsize(program) // 2)
    proc = subprocess.run([sys.executable, INFER, "--model-dir", model_dir, "--input", exports[1], "--threads", "1",
                           "--backend", "paddle-cpu"],
                          capture_output=True, text=True, timeout=300)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 2 and errors and errors[-1].startswith(f"error: {program}: {expected}")
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("content,expected", [
    ("ppdlx_inference: 1\nmodel: {family: classification\n", "not valid YAML at line 3 ("),
    ("- a list\n", "not a ppdlx inference.yml (no 'ppdlx_inference: 1' mapping)"),
    (None, "section 'preprocess' is missing"),
])
def test_damaged_inference_yml(exports, tmp_path, capsys, content, expected):
    model_dir = _copy(exports, tmp_path)
    meta_file = os.path.join(model_dir, "inference.yml")
    if content is None:
        meta = D.load_meta(model_dir)
        del meta["preprocess"]
        content = yaml.safe_dump(meta)
    with open(meta_file, "w", encoding="utf-8") as f:
        f.write(content)
    code, err = _run(exports, model_dir, capsys=capsys)
    assert code == 2 and err.startswith(f"error: {meta_file}: {expected}")
    assert err.rstrip().endswith(f"{REEXPORT} (tools/quantize.py for an int8 export)")


def test_damaged_onnx(exports, tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    model_dir = _copy(exports, tmp_path)
    onnx_file = os.path.join(model_dir, "inference.onnx")
    _cut(onnx_file, os.path.getsize(onnx_file) // 2)
    code, err = _run(exports, model_dir, "--backend", "onnxruntime", capsys=capsys)
    assert code == 2
    assert err.startswith(f"error: {onnx_file}: onnxruntime cannot load it ([ONNXRuntimeError] : 7 : "
                          f"INVALID_PROTOBUF") and err.rstrip().endswith("tools/export_model.py --onnx")


@pytest.mark.parametrize("option,value", [("--batch-size", "0"), ("--threads", "0"), ("--topk", "0"),
                                          ("--batch-sizes", "4,0")])
def test_out_of_range_counts_are_one_line(exports, tmp_path, capsys, option, value):
    code, err = _run(exports, str(exports[0] / "pir"), option, value, capsys=capsys)
    assert code == 2
    expected = (f"error: --batch-sizes {value}: give positive integers, e.g. 1,8" if option == "--batch-sizes"
                else f"error: {option} {value}: must be 1 or more")
    assert err.strip() == expected


@pytest.mark.parametrize("option,name", [("--report", "bench.json"), ("--output-dir", "drawn")])
def test_an_output_that_cannot_be_written_is_one_line_before_the_model_runs(exports, tmp_path, capsys, option, name):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a directory\n")
    code, err = _run(exports, str(exports[0] / "pir"), option, str(blocker / name), capsys=capsys)
    expected = (f"{blocker} is a file, not a directory" if option == "--report" else
                f"cannot create {blocker / name} (Not a directory)")
    assert (code, err.strip()) == (2, f"error: {option} {blocker / name}: {expected}; choose a writable path")
