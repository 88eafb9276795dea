"""A pickle reader that only rebuilds tensors, containers and numbers.

A checkpoint from the internet is a pickle, and a pickle can name any importable callable
(``os.system``) for the loader to call. ``RestrictedUnpickler.find_class`` therefore answers
only for an allow-list: ``collections.OrderedDict``, PyTorch's tensor/parameter rebuild
functions and storage types (turned into numpy arrays here, no PyTorch needed), numpy's
array/scalar/dtype reconstructors (Paddle's ``.pdparams``), what ``paddle.save`` itself emits
(``tuple`` for a tensor's ``(name, array)``, ``eval`` only as ``eval("data", {"data": array})`` for a
DenseTensor, Paddle's ``GeneratorState`` in ppdlx's ``.pdstates``), and a few harmless builtins. A
handful of data-only classes that training scripts put next to the weights (``argparse.Namespace``
with the run's arguments, paths, versions) become inert ``Opaque`` placeholders that keep their
state and run nothing. Every other global raises ``Refused`` before anything is called.

PyTorch tensors come back as ``LazyTensor`` (storage key + offset/shape/stride) because the
storage bytes live outside the pickle (zip member or the tail of a legacy file);
``materialize`` swaps them for numpy arrays once the storages are known.
"""
from __future__ import annotations

import collections
import io
import pickle

import numpy as np
from paddle.base.libpaddle import GeneratorState

# PyTorch storage class -> numpy dtype ("bfloat16" is widened to float32 when materialised)
TORCH_STORAGE_DTYPES = {
    "DoubleStorage": np.dtype("<f8"), "FloatStorage": np.dtype("<f4"), "HalfStorage": np.dtype("<f2"),
    "BFloat16Storage": "bfloat16", "LongStorage": np.dtype("<i8"), "IntStorage": np.dtype("<i4"),
    "ShortStorage": np.dtype("<i2"), "CharStorage": np.dtype("i1"), "ByteStorage": np.dtype("u1"),
    "BoolStorage": np.dtype("?"),
}
TORCH_DTYPE_NAMES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8",
                     "bool", "double", "float", "half", "long", "int", "short")
# Classes that only carry data; rebuilt as Opaque placeholders.
DATA_ONLY_CLASSES = {
    ("argparse", "Namespace"), ("pathlib", "Path"), ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"),
    ("pathlib", "PurePosixPath"), ("pathlib", "PureWindowsPath"), ("torch.torch_version", "TorchVersion"),
}
SAFE_BUILTINS = {"set": set, "frozenset": frozenset, "bytearray": bytearray, "complex": complex}


class Refused(Exception):
    """A global outside the allow-list (the message names it)."""


class Opaque:
    """Placeholder for a data-only object: remembers its class name and state, runs nothing."""

    def __init__(self, *args, **kwargs):
        self.args = args

    def __setstate__(self, state):
        self.state = state

    def __repr__(self):
        return f"<{type(self).__qualname__} {self.qualname}>"


class StorageType:
    """The value of ``torch.FloatStorage`` & co. inside a pickle: just the element dtype."""

    def __init__(self, name):
        self.name = name
        self.dtype = TORCH_STORAGE_DTYPES[name]


class StorageRef:
    """One storage named by a persistent id; ``base`` is the element offset of a legacy view."""

    __slots__ = ("key", "dtype", "numel", "base")

    def __init__(self, key, dtype, numel, base=0):
        self.key, self.dtype, self.numel, self.base = key, dtype, numel, base


class LazyTensor:
    __slots__ = ("storage", "offset", "shape", "stride")

    def __init__(self, storage, offset, shape, stride):
        if not isinstance(storage, StorageRef):
            raise Refused(f"a tensor whose storage is a {type(storage).__name__}, not a storage reference")
        self.storage = storage
        self.offset = int(offset) + storage.base
        self.shape = tuple(int(s) for s in shape)
        self.stride = tuple(int(s) for s in stride)


def _rebuild_tensor(storage, storage_offset, size, stride, *_ignored):
    # requires_grad, backward hooks and metadata do not change the values
    return LazyTensor(storage, storage_offset, size, stride)


def _rebuild_parameter(data, *_ignored):
    return data


def _checked_dtype(*args):
    dtype = np.dtype(*args)
    if dtype.hasobject:
        raise Refused("numpy arrays of Python objects (dtype 'O')")
    return dtype


def _numpy_reconstruct(cls, *args):
    if cls is not np.ndarray:
        raise Refused(f"numpy reconstruction of {getattr(cls, '__name__', cls)!r}")
    return np.ndarray.__new__(np.ndarray, *args)


def _scalar_from_bytes(dtype, data=None):
    dtype = _checked_dtype(dtype)
    return np.frombuffer(data, dtype=dtype, count=1)[0]


def _numpy_frombuffer(buffer, dtype, shape, order):
    arr = np.frombuffer(buffer, dtype=_checked_dtype(dtype))
    return arr.reshape(shape, order=order)


def _latin1_encode(text, encoding="latin1"):
    if encoding not in ("latin1", "latin-1"):
        raise Refused(f"_codecs.encode with encoding {encoding!r}")
    return text.encode("latin1")


def _paddle_dense_tensor(expression, namespace=None, *_ignored):
    # paddle.save writes a DenseTensor as a call eval('data', {'data': array}): that one call, nothing else
    if expression != "data" or not isinstance(namespace, dict) or not isinstance(namespace.get("data"), np.ndarray):
        raise Refused(f"builtins.eval of {str(expression)[:60]!r}")
    return namespace["data"]


def _torch_device(*args):
    return ":".join(str(a) for a in args)


_NUMPY_MODULES = ("numpy.core.multiarray", "numpy._core.multiarray")
_ALLOWED = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch", "Size"): tuple,
    ("torch", "device"): _torch_device,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): _checked_dtype,
    ("numpy.core.numeric", "_frombuffer"): _numpy_frombuffer,
    ("numpy._core.numeric", "_frombuffer"): _numpy_frombuffer,
    ("_codecs", "encode"): _latin1_encode,
    ("paddle.base.libpaddle", "GeneratorState"): GeneratorState,  # a random generator's seed/offset/state
}
for _mod in _NUMPY_MODULES:
    _ALLOWED[(_mod, "_reconstruct")] = _numpy_reconstruct
    _ALLOWED[(_mod, "scalar")] = _scalar_from_bytes
for _name, _fn in {**SAFE_BUILTINS, "tuple": tuple, "eval": _paddle_dense_tensor}.items():
    _ALLOWED[("builtins", _name)] = _ALLOWED[("__builtin__", _name)] = _fn


def _opaque_class(module, name):
    return type(name, (Opaque,), {"qualname": f"{module}.{name}"})


class RestrictedUnpickler(pickle.Unpickler):
    """``storages``: dict filled with ``key -> StorageRef`` as persistent ids are met (PyTorch files);
    ``None`` for plain pickles, where any persistent id is refused."""

    def __init__(self, file, storages=None, encoding="utf-8"):
        super().__init__(file, encoding=encoding)
        self.storages = storages

    def find_class(self, module, name):
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        if module == "torch" and name in TORCH_STORAGE_DTYPES:
            return StorageType(name)
        if module == "torch" and name in TORCH_DTYPE_NAMES:
            return f"torch.{name}"
        if (module, name) in DATA_ONLY_CLASSES:
            return _opaque_class(module, name)
        raise Refused(f"'{module}.{name}'")

    def persistent_load(self, pid):
        if self.storages is None or not isinstance(pid, tuple) or not pid or pid[0] != "storage":
            raise Refused(f"persistent id {str(pid)[:60]!r}")
        storage_type, key, _location, numel = pid[1:5]
        if not isinstance(storage_type, StorageType):
            raise Refused(f"storage of type {storage_type!r}")
        view = pid[5] if len(pid) > 5 else None
        key = str(key)
        root = self.storages.setdefault(key, StorageRef(key, storage_type.dtype, int(numel)))
        if view is None:
            return root
        view_key, offset, view_numel = view  # legacy files: a view into the root storage
        return StorageRef(key, storage_type.dtype, int(view_numel), base=int(offset))


def restricted_loads(data, encoding="utf-8"):
    """One plain pickle (no persistent ids) through the allow-list; ``Refused`` names what it would have built."""
    return RestrictedUnpickler(io.BytesIO(data), encoding=encoding).load()


def refusal_line(path: str, err: Refused) -> str:
    return (f"{path}: refused to unpickle {err}: a checkpoint may only hold tensors, arrays, numbers, strings and "
            f"containers of them (anything else could run code)")


def materialize(obj, storage_arrays):
    """Replace every LazyTensor in a nest of dicts/lists/tuples by a numpy array.

    ``storage_arrays``: ``key -> 1-D numpy array`` (already widened from bfloat16).
    """
    if isinstance(obj, LazyTensor):
        return _tensor_array(obj, storage_arrays[obj.storage.key], obj.storage.key)
    if isinstance(obj, collections.OrderedDict):
        return collections.OrderedDict((k, materialize(v, storage_arrays)) for k, v in obj.items())
    if isinstance(obj, dict):
        return {k: materialize(v, storage_arrays) for k, v in obj.items()}
    if isinstance(obj, list):
        return [materialize(v, storage_arrays) for v in obj]
    if isinstance(obj, tuple):
        return tuple(materialize(v, storage_arrays) for v in obj)
    if isinstance(obj, np.ndarray) and obj.dtype.hasobject:
        raise Refused("numpy arrays of Python objects (dtype 'O')")
    return obj


def _tensor_array(t: LazyTensor, storage: np.ndarray, key: str) -> np.ndarray:
    count = int(np.prod(t.shape)) if t.shape else 1
    if count == 0:
        return np.zeros(t.shape, dtype=storage.dtype)
    last = t.offset + sum((s - 1) * st for s, st in zip(t.shape, t.stride))
    if t.offset < 0 or min(t.stride, default=0) < 0 or last >= storage.size:
        raise Refused(f"a tensor of shape {list(t.shape)} reaching past the end of storage {key!r}")
    if count > storage.size and 0 in t.stride:  # a broadcast view: copying it could exhaust memory
        raise Refused(f"a broadcast tensor of shape {list(t.shape)} over {storage.size} stored values")
    view = np.lib.stride_tricks.as_strided(storage[t.offset:], shape=t.shape,
                                           strides=[s * storage.itemsize for s in t.stride], writeable=False)
    return np.array(view, copy=True)


def widen_storage(raw: bytes, dtype) -> np.ndarray:
    """Raw little-endian storage bytes -> 1-D array; bfloat16 becomes float32 (numpy has no bfloat16)."""
    if isinstance(dtype, str):  # bfloat16: the upper half of a float32
        return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    return np.frombuffer(raw, dtype=dtype)
