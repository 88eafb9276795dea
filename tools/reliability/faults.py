"""Making faults in files, and reading back what a run left: checkpoints are found by name in either
layout (``<dir>/<name>.pdparams`` files, or a ``<dir>/<name>/`` directory holding them), so the
battery keeps working when the checkpoint format changes."""
from __future__ import annotations

import glob
import os
import shutil
import struct
import threading
import zlib
from typing import Dict, List, Optional

import numpy as np

from ppdlx.weights.paddle_pickle import load_paddle_pickle
from ppdlx.weights.unpickle import restricted_loads

from .battery import SetupError

_PADDLE_LOCK = threading.Lock()  # the battery's checks run in threads; Paddle is called one at a time


def truncate(path: str, keep: float = 0.5) -> str:
    """Cut ``path`` to ``keep`` of its size (a copy interrupted by a full disk, a partial download)."""
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(int(size * keep))
    return path


def empty(path: str) -> str:
    with open(path, "wb"):
        pass
    return path


def garble(path: str, seed: int = 0) -> str:
    """Replace the content by random bytes of the same size (a file from another program, bit rot)."""
    size = max(os.path.getsize(path), 64)
    with open(path, "wb") as f:
        f.write(np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes())
    return path


def flip_bytes(path: str, count: int) -> str:
    """Invert ``count`` bytes in the middle of the file (bit rot: size and structure unchanged)."""
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        data = f.read(count)
        f.seek(-len(data), os.SEEK_CUR)
        f.write(bytes(b ^ 0xFF for b in data))
    return path


def write_text(path: str, text: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def copy_tree(src: str, dst: str) -> str:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def checkpoint_files(directory: str, name: str) -> List[str]:
    """Every file of checkpoint ``name`` in ``directory`` (temporary files excluded)."""
    files = [p for p in glob.glob(os.path.join(directory, glob.escape(name) + ".*")) if os.path.isfile(p)]
    unit = os.path.join(directory, name)
    if os.path.isdir(unit):
        files += [os.path.join(root, n) for root, _, names in os.walk(unit) for n in names]
    return sorted(p for p in files if ".tmp" not in os.path.basename(p))


def checkpoint_file(directory: str, name: str, ext: str) -> str:
    """The ``.{ext}`` file of checkpoint ``name`` (``ext`` without the dot: pdparams, pdopt, pdstates)."""
    found = [p for p in checkpoint_files(directory, name) if p.endswith("." + ext)]
    if not found:
        raise SetupError(f"no .{ext} file of checkpoint {name!r} in {directory}")
    return found[0]


def has_checkpoint(directory: str, name: str) -> bool:
    return any(p.endswith(".pdparams") for p in checkpoint_files(directory, name))


def remove_checkpoint(directory: str, name: str) -> None:
    """Delete checkpoint ``name``; a name that is a link to another checkpoint loses only the link."""
    unit = os.path.join(directory, name)
    if os.path.islink(unit):
        os.remove(unit)
        return
    for path in checkpoint_files(directory, name):
        os.remove(path)
    if os.path.isdir(unit):
        shutil.rmtree(unit)


def checkpoint_unit(directory: str, name: str) -> str:
    """The name of the checkpoint that ``name`` is (``latest`` may be a link to ``epoch_2``)."""
    return os.path.basename(os.path.realpath(os.path.join(directory, name)))


def all_checkpoint_files(directory: str) -> List[str]:
    names = {os.path.basename(p).split(".")[0] for p in glob.glob(os.path.join(directory, "*.pdparams"))}
    names |= {os.path.basename(os.path.dirname(p)) for p in glob.glob(os.path.join(directory, "*", "*.pdparams"))}
    return sorted(f for n in names for f in checkpoint_files(directory, n))


def temporary_entries(directory: str) -> List[str]:
    """Paths under ``directory`` that are temporary or inside something temporary (a ``tmp`` in any part of the
    relative path: ``latest.pdparams.tmp.123``, ``epoch_2.tmp-123/model.pdparams``)."""
    if not os.path.isdir(directory):
        return []
    found = []
    for root, dirs, names in os.walk(directory):
        for name in dirs + names:
            rel = os.path.relpath(os.path.join(root, name), directory)
            if "tmp" in rel.lower():
                found.append(rel)
    return sorted(found)


def read_params(path: str) -> Dict[str, np.ndarray]:
    """A ``.pdparams`` as name -> array; ``{"model": {...}}`` unwrapped."""
    with open(path, "rb") as f, _PADDLE_LOCK:  # through the allow-list: what a run left may be planted
        loaded = load_paddle_pickle(f.read(), return_numpy=True)
    if isinstance(loaded, dict) and isinstance(loaded.get("model"), dict):
        loaded = loaded["model"]
    return {k: np.asarray(v) for k, v in loaded.items()}


def write_params(path: str, params: Dict[str, np.ndarray]) -> None:
    import paddle
    with _PADDLE_LOCK:
        paddle.save({k: paddle.to_tensor(v) for k, v in params.items()}, path)


def params_equal(a: str, b: str) -> Optional[str]:
    """None when the two ``.pdparams`` hold bit-identical tensors, else the first difference."""
    pa, pb = read_params(a), read_params(b)
    if set(pa) != set(pb):
        return f"different tensor names ({len(set(pa) ^ set(pb))} differ)"
    for key in sorted(pa):
        if pa[key].shape != pb[key].shape or not np.array_equal(pa[key], pb[key]):
            return f"'{key}' differs"
    return None


def nonfinite_tensors(path: str) -> List[str]:
    params = read_params(path)
    return [k for k, v in params.items() if np.issubdtype(v.dtype, np.floating) and not np.isfinite(v).all()]


def checkpoint_epoch(directory: str, name: str) -> Optional[int]:
    """The epoch a checkpoint's run state records (None when it has none)."""
    try:
        path = checkpoint_file(directory, name, "pdstates")
    except SetupError:
        return None
    with open(path, "rb") as f:
        states = restricted_loads(f.read())
    epoch = states.get("epoch") if isinstance(states, dict) else None
    return int(epoch) if epoch is not None else None


def decompression_bomb_png(path: str, side: int = 50_000) -> str:
    """A 69-byte PNG whose header declares ``side`` x ``side`` RGB pixels (7.5 GB decoded at 50000): what Pillow
    calls a decompression bomb. Its pixel data is cut short; every reader must refuse it at the header."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64))
                + chunk(b"IEND", b""))
    return path
