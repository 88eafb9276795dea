"""A minimal writer of PyTorch checkpoint files from numpy arrays, without PyTorch.

It emits the documented layout byte for byte the way ``torch.save`` lays it out -- the
``data.pkl`` pickle with tensors as ``torch._utils._rebuild_tensor_v2`` calls on persistent-id
storages, the raw storages as zip members (or, for the legacy format, the five pickles plus
length-prefixed raw storages) -- so the reader tests need no PyTorch. ``test_parity`` checks
with PyTorch installed that ``torch.load`` reads these files back unchanged.

Pickle opcodes are written by hand because the ``pickle`` module can only name globals it can
import, and ``torch`` is not importable here.
"""
from __future__ import annotations

import collections
import io
import pickle
import struct
import zipfile

import numpy as np

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
STORAGE_NAMES = {np.dtype("float32"): "FloatStorage", np.dtype("float64"): "DoubleStorage",
                 np.dtype("float16"): "HalfStorage", np.dtype("int64"): "LongStorage",
                 np.dtype("int32"): "IntStorage", np.dtype("uint8"): "ByteStorage", np.dtype("bool"): "BoolStorage"}


class BFloat16:
    """A tensor to be stored as bfloat16: ``bits`` are the upper 16 bits of float32 values."""

    def __init__(self, values):
        self.values = np.asarray(values, dtype=np.float32)
        self.bits = (self.values.view(np.uint32) >> 16).astype("<u2")


class View:
    """A tensor that is a strided view into a larger storage (``storage`` 1-D)."""

    def __init__(self, storage, offset, shape, stride):
        self.storage, self.offset, self.shape, self.stride = np.asarray(storage), offset, shape, stride


class Global:
    """Pickle any ``module.name`` global (e.g. a malicious ``posix.system``) called with ``args``."""

    def __init__(self, module, name, args=()):
        self.module, self.name, self.args = module, name, args


class _Emitter:
    def __init__(self, legacy):
        self.out = io.BytesIO()
        self.storages = []  # (key, raw bytes, storage class name, numel)
        self.legacy = legacy

    def op(self, data: bytes):
        self.out.write(data)

    def text(self, s):
        raw = s.encode("utf-8")
        self.op(b"X" + struct.pack("<I", len(raw)) + raw)

    def glob(self, module, name):
        self.op(b"c" + module.encode() + b"\n" + name.encode() + b"\n")

    def value(self, v):
        if isinstance(v, collections.OrderedDict):
            self.glob("collections", "OrderedDict")
            self.op(b")R")
            self._items(v)
        elif isinstance(v, dict):
            self.op(b"}")
            self._items(v)
        elif isinstance(v, (list, tuple)):
            self.op(b"](" if isinstance(v, list) else b"(")  # EMPTY_LIST + APPENDS, or TUPLE
            for x in v:
                self.value(x)
            self.op(b"e" if isinstance(v, list) else b"t")
        elif isinstance(v, bool):
            self.op(b"\x88" if v else b"\x89")
        elif isinstance(v, int):
            self.op(b"J" + struct.pack("<i", v))
        elif isinstance(v, float):
            self.op(b"G" + struct.pack(">d", v))
        elif isinstance(v, str):
            self.text(v)
        elif v is None:
            self.op(b"N")
        elif isinstance(v, Global):
            self.glob(v.module, v.name)
            self.value(tuple(v.args))
            self.op(b"R")
        elif isinstance(v, (np.ndarray, BFloat16, View)):
            self.tensor(v)
        else:
            raise TypeError(f"cannot write {type(v).__name__}")

    def _items(self, d):
        for k, x in d.items():
            self.value(k)
            self.value(x)
            self.op(b"s")

    def tensor(self, t):
        if isinstance(t, View):
            raw, name, numel = t.storage.astype(t.storage.dtype.newbyteorder("<")).tobytes(), \
                STORAGE_NAMES[t.storage.dtype], t.storage.size
            offset, shape, stride = t.offset, tuple(t.shape), tuple(t.stride)
        else:
            if isinstance(t, BFloat16):
                raw, name, shape = t.bits.tobytes(), "BFloat16Storage", t.values.shape
            else:
                arr = np.array(t, order="C")  # (ascontiguousarray would turn a 0-d tensor into 1-d)
                raw, name, shape = arr.astype(arr.dtype.newbyteorder("<")).tobytes(), STORAGE_NAMES[arr.dtype], \
                    arr.shape
            numel, offset = int(np.prod(shape)) if shape else 1, 0
            stride = tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))
        key = str(len(self.storages))
        self.storages.append((key, raw, name, numel))
        self.glob("torch._utils", "_rebuild_tensor_v2")
        self.op(b"(")
        # persistent id: ('storage', <storage class>, key, location, numel[, view metadata])
        self.op(b"(")
        self.text("storage")
        self.glob("torch", name)
        self.text(key)
        self.text("cpu")
        self.op(b"J" + struct.pack("<i", numel))
        if self.legacy:
            self.op(b"N")
        self.op(b"tQ")
        self.op(b"J" + struct.pack("<i", offset))
        self.value(tuple(int(s) for s in shape))
        self.value(tuple(int(s) for s in stride))
        self.op(b"\x89")  # requires_grad False
        self.glob("collections", "OrderedDict")
        self.op(b")R")  # backward hooks
        self.op(b"tR")

    def pickle(self, obj) -> bytes:
        self.op(b"\x80\x02")
        self.value(obj)
        self.op(b".")
        return self.out.getvalue()


def save_torch_zip(obj, path, archive="archive"):
    """``torch.save`` (zip format, PyTorch >= 1.6) of ``obj``: dicts/lists/numbers with numpy tensors."""
    emitter = _Emitter(legacy=False)
    data = emitter.pickle(obj)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr(f"{archive}/data.pkl", data)
        zf.writestr(f"{archive}/byteorder", "little")
        for key, raw, _, _ in emitter.storages:
            zf.writestr(f"{archive}/data/{key}", raw)
        zf.writestr(f"{archive}/version", "3\n")


def save_torch_legacy(obj, path):
    """``torch.save(..., _use_new_zipfile_serialization=False)`` layout."""
    emitter = _Emitter(legacy=True)
    data = emitter.pickle(obj)
    with open(path, "wb") as f:
        pickle.dump(LEGACY_MAGIC, f, protocol=2)
        pickle.dump(1001, f, protocol=2)
        pickle.dump({"protocol_version": 1001, "little_endian": True,
                     "type_sizes": {"short": 2, "int": 4, "long": 4}}, f, protocol=2)
        f.write(data)
        pickle.dump([key for key, _, _, _ in emitter.storages], f, protocol=2)
        for _, raw, name, numel in emitter.storages:
            f.write(struct.pack("<q", numel))
            f.write(raw)
