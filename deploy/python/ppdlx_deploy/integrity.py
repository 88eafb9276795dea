"""Is the export on disk the one that was written? Checked before any runtime reads it, because the
runtimes do not say so themselves: Paddle Inference loads a ``.pdiparams`` cut short by a few bytes
and predicts with garbage, crashes the process on an empty or garbled ``.pdmodel``, and names no file
when a ``.json`` or ``.pdiparams`` is damaged; onnxruntime names no fix.

An export records the size and sha256 of its Paddle program and weights in ``inference.yml``
(``files:``); a file that differs is one :class:`DeployError` naming it (the ONNX file is not recorded:
it is often rewritten on purpose, and onnxruntime refuses a damaged one itself). Exports without the
record get structural checks instead: the program parses, and the ``.pdiparams`` stream of tensors
(each: uint32 version, uint64 LoD levels, uint32 version, int32 + TensorDesc protobuf, then numel *
dtype-size bytes; Paddle's ``dense_tensor_tostream.cc``, whose reader does not check that the data
bytes were all there) ends exactly at the end of the file. A runtime's own load failure is turned into
one line naming the file.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
from typing import Optional

from .errors import DeployError

REEXPORT = "re-export the model with tools/export_model.py (tools/quantize.py for an int8 export)"
_CHUNK = 1 << 22
# Predictors are created many times per process (benchmarks, tuning): a file is hashed and checked once
# per (path, size, mtime).
_digests = {}  # (path, size, mtime_ns) -> sha256
_verified = set()  # (path, size, mtime_ns, its record) that passed check_export_files


def file_digest(path: str) -> str:
    stat = os.stat(path)
    key = (os.path.abspath(path), stat.st_size, stat.st_mtime_ns)
    if key not in _digests:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(_CHUNK), b""):
                digest.update(chunk)
        _digests[key] = digest.hexdigest()
    return _digests[key]


def check_recorded(path: str, record: Optional[dict]) -> None:
    """``path`` against its ``files:`` entry of inference.yml (nothing to check without one)."""
    if not record:
        return
    size = os.path.getsize(path)
    if "bytes" in record and size != int(record["bytes"]):
        cause = "truncated" if size < int(record["bytes"]) else "appended to"
        raise DeployError(f"{path}: {size} bytes, but the export wrote {int(record['bytes'])} ({cause} or replaced "
                          f"since); {REEXPORT}")
    if record.get("sha256") and file_digest(path) != record["sha256"]:
        raise DeployError(f"{path}: its content differs from what the export wrote (sha256 mismatch: damaged or "
                          f"replaced since); {REEXPORT}")


def check_not_empty(path: str) -> None:
    if os.path.getsize(path) == 0:
        raise DeployError(f"{path}: empty file (0 bytes); {REEXPORT}")


def check_program(path: str) -> None:
    """The program file parses: a PIR ``.json`` as JSON, a legacy ``.pdmodel`` as a ProgramDesc with blocks."""
    check_not_empty(path)
    if path.endswith(".json"):
        try:
            with open(path, encoding="utf-8") as f:
                json.load(f)
        except (ValueError, UnicodeDecodeError) as err:
            raise DeployError(f"{path}: not a readable PIR program ({_first_line(err)}); {REEXPORT}") from None
        return
    blocks = parse_program_desc(path).blocks
    if not blocks:
        raise DeployError(f"{path}: a program without blocks (not a saved inference program); {REEXPORT}")


def parse_program_desc(path: str):
    """A legacy ``.pdmodel`` as ``framework_pb2.ProgramDesc``; a damaged one is one line naming it."""
    from paddle.base.proto import framework_pb2  # paddle loads on use (see the package's docstring)
    program = framework_pb2.ProgramDesc()
    with open(path, "rb") as f:
        data = f.read()
    try:
        program.ParseFromString(data)
    except Exception as err:  # protobuf's DecodeError (its module is not imported here: deploy's own imports only)
        raise DeployError(f"{path}: not a readable ProgramDesc ({_first_line(err)}); {REEXPORT}") from None
    return program


# bytes per element of the TensorDesc data types a parameters file holds (framework.proto VarType.Type)
_DTYPE_BYTES = {"BOOL": 1, "INT16": 2, "INT32": 4, "INT64": 8, "FP16": 2, "FP32": 4, "FP64": 8, "UINT8": 1, "INT8": 1,
                "BF16": 2, "COMPLEX64": 8, "COMPLEX128": 16, "FP8_E4M3FN": 1, "FP8_E5M2": 1, "UINT16": 2,
                "UINT32": 4, "UINT64": 8}


def check_params_stream(path: str) -> None:
    """Walk the tensors of a combined ``.pdiparams``: one line when the file ends inside a tensor or is
    not such a stream. A data type this walk does not know stops it (nothing is claimed past it)."""
    from paddle.base.proto import framework_pb2  # as above
    size, index = os.path.getsize(path), 0

    def fail(what):
        raise DeployError(f"{path}: {what} (tensor #{index + 1}); {REEXPORT}")

    with open(path, "rb") as f:
        def read(fmt):
            data = f.read(struct.calcsize(fmt))
            if len(data) < struct.calcsize(fmt):
                fail("truncated: the file ends inside a tensor header")
            return struct.unpack(fmt, data)[0]

        while f.tell() < size:
            if read("<I") != 0:
                fail("not a Paddle parameters file (unknown tensor version)")
            for _ in range(read("<Q")):  # LoD levels: inference weights have none
                f.seek(read("<Q"), os.SEEK_CUR)
            if read("<I") != 0:
                fail("not a Paddle parameters file (unknown tensor version)")
            desc_size = read("<i")
            if not 0 <= desc_size <= size - f.tell():
                fail("damaged tensor description")
            desc = framework_pb2.VarType.TensorDesc()
            try:
                desc.ParseFromString(f.read(desc_size))
            except Exception:  # protobuf's DecodeError, whichever implementation is installed
                fail("damaged tensor description")
            itemsize = _DTYPE_BYTES.get(framework_pb2.VarType.Type.Name(desc.data_type)
                                        if desc.data_type in framework_pb2.VarType.Type.values() else "")
            if itemsize is None or any(d < 0 for d in desc.dims):
                return
            numel = 1
            for d in desc.dims:
                numel *= d
            if f.tell() + numel * itemsize > size:
                fail(f"truncated: {size} bytes end inside the data of a {list(desc.dims)} tensor")
            f.seek(numel * itemsize, os.SEEK_CUR)
            index += 1


def check_export_files(files: dict, meta: Optional[dict]) -> None:
    """The program and weights of ``files`` (:func:`ppdlx_deploy.meta.model_files`) before a runtime reads them:
    against the export's record when inference.yml has one (size and sha256), else structurally."""
    records = (meta or {}).get("files") or {}
    for key in ("model_file", "params_file"):
        path = files[key]
        check_not_empty(path)
        record = records.get(os.path.basename(path))
        stat = os.stat(path)
        seen = (os.path.abspath(path), stat.st_size, stat.st_mtime_ns, json.dumps(record, sort_keys=True))
        if seen in _verified:
            continue
        if record:
            check_recorded(path, record)
        elif key == "model_file":
            check_program(path)
        else:
            check_params_stream(path)
        _verified.add(seen)


def check_onnx_file(path: str) -> None:
    """The ONNX file is not recorded (tools such as onnx-simplifier rewrite it on purpose); onnxruntime's
    own parse errors are turned into one line by the predictor."""
    check_not_empty(path)


# Paddle Inference's wording when it cannot read the parameters file (its program was checked first).
_PARAMS_LOAD_FAILURES = ("tensor desc", "deserialize to tensor", "loading model parameters", "complete or damaged",
                         "read tensor", "params file")


def runtime_load_error(files: dict, err: BaseException) -> Optional[DeployError]:
    """The one line for a Paddle Inference failure to load ``files``, or None when it is not about the files."""
    text = str(err).lower()
    if any(marker in text for marker in _PARAMS_LOAD_FAILURES):
        return DeployError(f"{files['params_file']}: Paddle Inference cannot read the weights "
                           f"({_first_line(err)}); the file is damaged or does not belong to "
                           f"{os.path.basename(files['model_file'])}: {REEXPORT}")
    return None


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    text = lines[0] if lines else type(err).__name__
    return text if len(text) <= 160 else text[:157] + "..."
