"""Read a foreign checkpoint file into numpy arrays, without PyTorch, without running its code.

Formats (detected from the bytes, not the file name):

* ``torch-zip``: ``torch.save`` since PyTorch 1.6 -- a zip holding ``<dir>/data.pkl`` (the object,
  tensors as persistent ids ``('storage', StorageType, key, location, numel)``) and one member
  ``<dir>/data/<key>`` of raw little-endian bytes per storage.
* ``torch-legacy``: ``torch.save`` before 1.6 (``_use_new_zipfile_serialization=False``) -- five
  pickles in a row (magic number, protocol 1001, system info, the object, the storage key list),
  then per storage an int64 element count and its raw bytes.
* ``safetensors``: u64 header length, JSON header ``{name: {dtype, shape, data_offsets}}``, buffer.
* ``pickle``: one plain pickle, e.g. Paddle's ``paddle.save`` / ``paddle.static.save`` ``.pdparams``
  (name -> numpy array).

The PyTorch <= 0.3 tar format and TorchScript archives are refused with one line.
"""
from __future__ import annotations

import hashlib
import io
import json
import pickle
import struct
import tarfile
import zipfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ppdlx.weights.errors import WeightsError
from ppdlx.weights.paddle_pickle import PADDLE_STRUCTURE_KEY
from ppdlx.weights.unpickle import Refused, RestrictedUnpickler, materialize, refusal_line, widen_storage

TORCH_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
ZIP_LOCAL_HEADER = b"PK\x03\x04"  # a zip's first bytes; zipfile finds an archive by its end, which a cut file lacks
SAFETENSORS_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "bfloat16", "I64": "<i8", "I32": "<i4", "I16": "<i2",
    "I8": "i1", "U8": "u1", "BOOL": "?", "U16": "<u2", "U32": "<u4", "U64": "<u8",
}
MAX_SAFETENSORS_HEADER = 100 << 20


@dataclass
class Checkpoint:
    path: str
    format: str
    sha256: str
    content: Any
    notes: list = field(default_factory=list)


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_checkpoint(path: str) -> Checkpoint:
    """Read ``path``; anything unsafe or unreadable raises ``WeightsError`` naming the file."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError as e:
        raise WeightsError(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        if zipfile.is_zipfile(path):
            fmt, content = "torch-zip", _read_torch_zip(path)
        elif _looks_like_safetensors(head):
            fmt, content = "safetensors", _read_safetensors(path)
        elif head[:1] == b"\x80":
            fmt, content = _read_pickle_file(path)
        elif head.startswith(ZIP_LOCAL_HEADER):
            raise WeightsError(f"{path}: a zip archive (PyTorch's checkpoint format) without its end, the zip's "
                               f"central directory: the file is cut short (an interrupted download or copy?); fetch "
                               f"or copy it again")
        elif tarfile.is_tarfile(path):
            raise WeightsError(f"{path}: a PyTorch <= 0.3 tar checkpoint is not supported; load it with that "
                               f"PyTorch and save the state_dict again (torch.save or safetensors)")
        else:
            raise WeightsError(f"{path}: not a PyTorch, safetensors or Paddle pickle checkpoint "
                               f"(first bytes {head[:8]!r})")
    except Refused as e:
        raise WeightsError(f"{refusal_line(path, e)}; save the bare state_dict or safetensors instead") from None
    except (pickle.UnpicklingError, EOFError, struct.error, ValueError, KeyError, TypeError, IndexError,
            AttributeError, zipfile.BadZipFile, UnicodeDecodeError) as e:
        raise WeightsError(f"{path}: damaged or unsupported checkpoint ({type(e).__name__}: {e})") from None
    return Checkpoint(path, fmt, file_sha256(path), content)


# ------------------------------------------------------------------------------ PyTorch zip
def _read_torch_zip(path):
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        pickles = sorted((n for n in names if n == "data.pkl" or n.endswith("/data.pkl")), key=len)
        if not pickles:
            raise WeightsError(f"{path}: a zip file without data.pkl is not a PyTorch checkpoint")
        prefix = pickles[0][: -len("data.pkl")]
        if any(n.startswith(prefix + "code/") for n in names):
            raise WeightsError(f"{path}: a TorchScript archive (torch.jit.save) is not a checkpoint; save the "
                               f"model's state_dict() with torch.save instead")
        if prefix + "byteorder" in names and zf.read(prefix + "byteorder").strip() != b"little":
            raise WeightsError(f"{path}: big-endian PyTorch checkpoints are not supported")
        storages = {}
        obj = RestrictedUnpickler(io.BytesIO(zf.read(pickles[0])), storages).load()
        arrays = {}
        for key, ref in storages.items():
            member = f"{prefix}data/{key}"
            if member not in names:
                raise WeightsError(f"{path}: storage {key!r} is missing from the archive ({member})")
            arrays[key] = widen_storage(zf.read(member), ref.dtype)
    return materialize(obj, arrays)


# ---------------------------------------------------------------------------- PyTorch legacy
def _read_pickle_file(path):
    with open(path, "rb") as f:
        first = RestrictedUnpickler(f).load()
        if isinstance(first, int) and first == TORCH_LEGACY_MAGIC:
            return "torch-legacy", _read_torch_legacy(f, path)
        if f.read(1):
            raise WeightsError(f"{path}: data after the pickle: not a plain pickle checkpoint")
    if isinstance(first, dict):
        first = {k: v for k, v in first.items() if k != PADDLE_STRUCTURE_KEY}
    return "pickle", materialize(first, {})


def _read_torch_legacy(f, path):
    protocol = RestrictedUnpickler(f).load()
    sys_info = RestrictedUnpickler(f).load()
    if protocol != 1001:
        raise WeightsError(f"{path}: legacy PyTorch protocol {protocol!r} is not supported (expected 1001)")
    if isinstance(sys_info, dict) and not sys_info.get("little_endian", True):
        raise WeightsError(f"{path}: big-endian PyTorch checkpoints are not supported")
    storages = {}
    obj = RestrictedUnpickler(f, storages).load()
    keys = RestrictedUnpickler(f).load()
    arrays = {}
    for key in keys:
        ref = storages.get(str(key))
        if ref is None:
            raise WeightsError(f"{path}: storage {key!r} is listed but no tensor uses it")
        (numel,) = struct.unpack("<q", f.read(8))
        itemsize = 2 if isinstance(ref.dtype, str) else ref.dtype.itemsize
        raw = f.read(numel * itemsize)
        if len(raw) != numel * itemsize:
            raise WeightsError(f"{path}: file ends inside storage {key!r} (truncated download?)")
        arrays[str(key)] = widen_storage(raw, ref.dtype)
    missing = sorted(set(storages) - set(arrays))
    if missing:
        raise WeightsError(f"{path}: storage {missing[0]!r} is used by a tensor but not stored")
    return materialize(obj, arrays)


# ------------------------------------------------------------------------------- safetensors
def _looks_like_safetensors(head: bytes) -> bool:
    if len(head) < 9:
        return False
    (size,) = struct.unpack("<Q", head[:8])
    return 2 <= size <= MAX_SAFETENSORS_HEADER and head[8:9] == b"{"


def _read_safetensors(path):
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size).decode("utf-8"))
        header.pop("__metadata__", None)
        base = 8 + size
        tensors = {}
        for name, info in header.items():
            dtype = SAFETENSORS_DTYPES.get(info.get("dtype"))
            if dtype is None:
                raise WeightsError(f"{path}: tensor '{name}' has unsupported dtype {info.get('dtype')!r}")
            shape = [int(s) for s in info["shape"]]
            start, end = (int(v) for v in info["data_offsets"])
            itemsize = 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize
            if end - start != int(np.prod(shape)) * itemsize or start < 0:
                raise WeightsError(f"{path}: tensor '{name}': data_offsets {[start, end]} do not hold shape {shape}")
            f.seek(base + start)
            raw = f.read(end - start)
            if len(raw) != end - start:
                raise WeightsError(f"{path}: file ends inside tensor '{name}' (truncated download?)")
            tensors[name] = widen_storage(raw, dtype if dtype == "bfloat16" else np.dtype(dtype)).reshape(shape)
    return tensors
