"""A checkpoint is one directory that appears whole or not at all, and that readers verify.

A unit (``<output_dir>/epoch_3/``)::

    model.pdparams     the model's state_dict (paddle.save, float32)
    optimizer.pdopt    the optimizer's state_dict (paddle.save; absent when there is none)
    states.pdstates    epoch, step, best metric, LR schedule, loss scaler, EMA, RNG, hooks (plain pickle)
    manifest.json      written last: each file's size and sha256, the epoch, the model's identity

Writing: every file goes to ``epoch_3.tmp-<pid>/`` and is fsynced, the manifest last; the directory is
fsynced, renamed to ``epoch_3`` and its parent fsynced. A process killed before the rename leaves a
``*.tmp-<pid>`` directory that no reader looks at (the next training in the directory removes it);
killed after it, the unit is complete. Names that move (``latest``, ``best``) are relative symlinks
replaced by one ``rename(2)``: they point at a complete unit before and after, never at a mix.

Reading checks the manifest first: a file that is missing, shorter or longer than written, or whose
bytes changed is one :class:`CheckpointError` line naming the file.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil

from ppdlx.errors import ConfigError

FORMAT = "ppdlx-checkpoint/1"
MODEL, OPTIMIZER, STATES, MANIFEST = "model.pdparams", "optimizer.pdopt", "states.pdstates", "manifest.json"
UNIT_FILES = (MODEL, OPTIMIZER, STATES)
# what an interrupted save, replacement or removal of a checkpoint leaves behind (this layout's and the
# earlier one-file-at-a-time layout's temporary names)
LEFTOVER = re.compile(r"(latest|best|epoch_\d+)(\.pdparams|\.pdopt|\.pdstates)?\.(tmp|old)[-.]\d+")
_CHUNK = 1 << 22


class CheckpointError(ConfigError):
    """A checkpoint that is missing, incomplete, damaged, of another model, or that could not be written."""


def write_durably(path: str, data) -> dict:
    """Write ``data`` (bytes-like) to a new file and fsync it; returns its manifest entry. A failed write
    names the file (an OSError from ``write`` carries no file name)."""
    try:
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as err:
        if err.filename is None:
            raise OSError(err.errno, err.strerror, path) from None
        raise
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def fsync_dir(path: str) -> None:
    """Make the directory's entries (a rename into it) durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_entry(path: str) -> None:
    """Remove a file, symlink or directory tree; absent is fine."""
    if os.path.islink(path) or os.path.isfile(path):
        os.remove(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)


def replace_entry(src: str, dst: str) -> None:
    """``os.replace`` that also replaces a directory: ``rename(2)`` cannot put anything over a non-empty
    directory (nor a symlink over any directory), so the old one is renamed aside first and removed after."""
    try:
        os.replace(src, dst)
        return
    except OSError as err:
        if err.errno not in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
            raise
    aside = f"{dst}.old-{os.getpid()}"
    remove_entry(aside)
    os.rename(dst, aside)
    os.replace(src, dst)
    remove_entry(aside)


def write_unit(path: str, files: dict, manifest: dict) -> None:
    """Write the unit ``path`` (a directory) from ``files`` (name -> bytes-like, or a function returning them:
    called when that file is written, so that one serialised file at a time is in memory) and ``manifest`` (more
    keys for manifest.json). An existing unit of that name is replaced; on any error the temporary directory goes."""
    parent = os.path.dirname(os.path.abspath(path))
    tmp = f"{path}.tmp-{os.getpid()}"
    os.makedirs(parent, exist_ok=True)
    remove_entry(tmp)
    os.mkdir(tmp)
    try:
        listed = {name: write_durably(os.path.join(tmp, name), data() if callable(data) else data)
                  for name, data in files.items()}
        body = json.dumps({"format": FORMAT, **manifest, "files": listed}, indent=1, sort_keys=True)
        write_durably(os.path.join(tmp, MANIFEST), body.encode("utf-8"))
        fsync_dir(tmp)
        replace_entry(tmp, path)
        fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def point(directory: str, name: str, unit_name: str) -> None:
    """Make ``<directory>/<name>`` a symlink to the unit ``unit_name`` (a sibling), in one rename."""
    link = os.path.join(directory, name)
    tmp = f"{link}.tmp-{os.getpid()}"
    remove_entry(tmp)
    os.symlink(unit_name, tmp)
    replace_entry(tmp, link)
    fsync_dir(directory)


def pointer_target(directory: str, name: str):
    """The unit name ``<directory>/<name>`` points at, or None when it is not a symlink."""
    link = os.path.join(directory, name)
    return os.path.basename(os.path.normpath(os.readlink(link))) if os.path.islink(link) else None


def retire(path: str) -> None:
    """Remove a unit so that it never shows half-deleted: renamed away in one step, then deleted."""
    aside = f"{path}.old-{os.getpid()}"
    os.rename(path, aside)
    shutil.rmtree(aside, ignore_errors=True)


def remove_leftovers(directory: str) -> list:
    """Remove what interrupted writes left in ``directory``; returns the names removed."""
    names = sorted(n for n in os.listdir(directory) if LEFTOVER.fullmatch(n))
    for name in names:
        remove_entry(os.path.join(directory, name))
    return names


def is_unit(path: str) -> bool:
    """``path`` names a unit: a directory holding a manifest or model file, or a symlink (a pointer, maybe
    dangling: reading it then says what it points at)."""
    return os.path.islink(path) or (os.path.isdir(path) and any(
        os.path.isfile(os.path.join(path, n)) for n in (MANIFEST, MODEL)))


def read_manifest(unit: str) -> dict:
    if os.path.islink(unit) and not os.path.exists(unit):
        raise CheckpointError(f"{unit} points to {os.readlink(unit)}, which does not exist")
    path = os.path.join(unit, MANIFEST)
    if not os.path.isfile(path):
        raise CheckpointError(f"{path} is missing: {unit} is not a complete checkpoint (its save was interrupted)")
    try:
        with open(path, "rb") as f:
            manifest = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{path} is damaged ({err})") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if manifest.get("format") != FORMAT or not isinstance(files, dict) or not all(
            isinstance(e, dict) and isinstance(e.get("size"), int) and isinstance(e.get("sha256"), str)
            for e in files.values()):
        raise CheckpointError(f"{path} is damaged (not a {FORMAT} manifest)")
    return manifest


def read_file(unit: str, manifest: dict, name: str, keep: bool = True):
    """The bytes of ``<unit>/<name>`` (None with ``keep=False``) after checking them against the manifest."""
    path, entry = os.path.join(unit, name), manifest["files"][name]
    digest, size, chunks = hashlib.sha256(), 0, []
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(_CHUNK), b""):
                digest.update(chunk)
                size += len(chunk)
                if keep:
                    chunks.append(chunk)
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing (listed in {MANIFEST})") from None
    except OSError as err:
        raise CheckpointError(f"{path} cannot be read ({err.strerror})") from None
    if size != entry["size"]:
        raise CheckpointError(f"{path} is truncated or damaged ({size} bytes; {MANIFEST} says {entry['size']})")
    if digest.hexdigest() != entry["sha256"]:
        raise CheckpointError(f"{path} is damaged (its sha256 differs from the one in {MANIFEST})")
    return b"".join(chunks) if keep else None


def verify_unit(unit: str) -> dict:
    """The manifest of ``unit`` after checking every file it lists."""
    manifest = read_manifest(unit)
    for name in manifest["files"]:
        read_file(unit, manifest, name, keep=False)
    return manifest


def model_digest(state: dict) -> str:
    """sha256 of the parameter names and shapes: the same for the same architecture and class count."""
    lines = sorted(f"{k}:{list(getattr(v, 'shape', []))}" for k, v in state.items())
    return hashlib.sha256("\n".join(lines).encode("utf-8")).hexdigest()
