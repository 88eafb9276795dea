"""Test-only fault injection, imported by Python at start-up when this directory is on PYTHONPATH.

tests/checkpoint/test_checkpoint_kill.py puts it there for the trainings it starts; ppdlx itself has no hook
for it. It wraps the file-system calls a checkpoint save makes -- ``open`` for writing, ``write``,
``os.fsync``, ``os.mkdir``, ``os.rename``/``os.replace``, ``os.symlink``, ``os.remove`` -- and sees those
whose path lies under ``$PPDLX_FAULT_DIR``, each as one event line: ``KIND PATH`` or ``KIND PATH -> OTHER``,
paths relative to that directory, process ids written ``<pid>``.

* ``$PPDLX_FAULT_TRACE``: append every event line to this file;
* ``$PPDLX_FAULT_KILL``: a glob (``fnmatch``) over event lines: at the first event it matches, the process
  sends itself SIGKILL before the call runs -- except a ``write``, which writes the first half of its data
  (flushed) and then dies, so the file on disk is cut short inside its bytes;
* ``$PPDLX_FAULT_STOP``: a glob: at the first event it matches, the process stops itself (SIGSTOP) before the
  call runs -- alive, holding what it holds, until the test kills or continues it;
* ``$PPDLX_FAULT_FILE_LIMIT``: ``GLOB=BYTES``: at the first event the glob matches, the largest file the
  process may write becomes BYTES (``RLIMIT_FSIZE``, SIGXFSZ ignored): from then on the kernel fails every
  write past it with EFBIG, the way a full disk fails them with ENOSPC.

The file system stays real: every call before the kill happened, none after it.
"""
import builtins
import fnmatch
import os
import re
import resource
import signal

_DIR = os.environ.get("PPDLX_FAULT_DIR")
_TRACE = os.environ.get("PPDLX_FAULT_TRACE")
_KILL = os.environ.get("PPDLX_FAULT_KILL")
_STOP = os.environ.get("PPDLX_FAULT_STOP")
_LIMIT_AT, _, _LIMIT = os.environ.get("PPDLX_FAULT_FILE_LIMIT", "").rpartition("=")
_PID = re.compile(r"(\.tmp-|\.old-|\.tmp\.)\d+")

_open, _fsync, _mkdir = builtins.open, os.fsync, os.mkdir
_rename, _replace, _symlink, _remove = os.rename, os.replace, os.symlink, os.remove


def _relative(path):
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str):
        return None
    full = os.path.abspath(path)
    if full != _DIR and not full.startswith(_DIR + os.sep):
        return None
    return _PID.sub(r"\1<pid>", os.path.relpath(full, _DIR))


def _event(kind, path, other=None, before_death=None):
    global _LIMIT_AT, _STOP
    rel = _relative(path)
    if rel is None:
        return
    line = f"{kind} {rel}" + (f" -> {_relative(other) or other}" if other is not None else "")
    if _TRACE:
        with _open(_TRACE, "a") as f:
            f.write(line + "\n")
    if _LIMIT_AT and fnmatch.fnmatchcase(line, _LIMIT_AT):
        _LIMIT_AT = ""
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(_LIMIT), resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    if _STOP and fnmatch.fnmatchcase(line, _STOP):
        _STOP = None
        os.kill(os.getpid(), signal.SIGSTOP)
    if _KILL and fnmatch.fnmatchcase(line, _KILL):
        if before_death is not None:
            before_death()
        os.kill(os.getpid(), signal.SIGKILL)


class _Watched:
    """A file opened for writing under the directory: its writes are events."""

    def __init__(self, file, path):
        self._file, self._path = file, path

    def write(self, data):
        def half():
            self._file.write(data[: len(data) // 2])
            self._file.flush()
        _event("write", self._path, before_death=half)
        return self._file.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._file.__exit__(*exc)

    def __iter__(self):
        return iter(self._file)

    def __getattr__(self, name):
        return getattr(self._file, name)


def _watched_open(file, mode="r", *args, **kwargs):
    writing = any(c in mode for c in "wax+")
    if writing:
        _event("open", file)
    handle = _open(file, mode, *args, **kwargs)
    return _Watched(handle, file) if writing and _relative(file) is not None else handle


def _watched_fsync(fd):
    try:
        path = os.readlink(f"/proc/self/fd/{fd if isinstance(fd, int) else fd.fileno()}")
    except OSError:
        path = None
    _event("fsync", path)
    return _fsync(fd)


def _watched_mkdir(path, *args, **kwargs):
    _event("mkdir", path)
    return _mkdir(path, *args, **kwargs)


def _watched_rename(src, dst, *args, **kwargs):
    _event("rename", src, dst)
    return _rename(src, dst, *args, **kwargs)


def _watched_replace(src, dst, *args, **kwargs):
    _event("rename", src, dst)
    return _replace(src, dst, *args, **kwargs)


def _watched_symlink(target, link, *args, **kwargs):
    _event("symlink", link, target)
    return _symlink(target, link, *args, **kwargs)


def _watched_remove(path, *args, **kwargs):
    _event("remove", path)
    return _remove(path, *args, **kwargs)


if _DIR:
    _DIR = os.path.abspath(_DIR)
    builtins.open = _watched_open
    os.fsync, os.mkdir, os.rename, os.replace = _watched_fsync, _watched_mkdir, _watched_rename, _watched_replace
    os.symlink, os.remove = _watched_symlink, _watched_remove
