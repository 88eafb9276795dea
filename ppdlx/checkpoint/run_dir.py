"""The training's output directory, settled before anything is built.

* An output directory inside the data (``data.root``) is refused before anything is created.
* Rank 0 creates ``global.output_dir`` and proves it writable (a directory it cannot write is one line,
  not an error at the first save), then takes ``<output_dir>/train.lock``: ``fcntl.flock`` (the kernel drops
  it when the process ends, however it ends; it works across NFS clients, where a pid check alone would
  not), with the holder's pid written inside for the message. A second training into the directory is
  refused; a lock file naming a process that ended without releasing it (killed) is taken over with one log
  line. Other ranks of the same job do not lock. The lock is re-entrant within a process and released after
  training (``release_output_dir``) or at exit.
* The lock holder removes what interrupted saves left (``*.tmp-<pid>``, ``*.old-<pid>``).
* ``train.resume``: ``auto`` -> the newest complete checkpoint (:func:`ppdlx.checkpoint.resolve_resume`),
  or a fresh start in a directory without checkpoints; a path -> that checkpoint, verified; ``never`` -> start
  over, the directory's checkpoints removed (refused when the directory is reached through a link); unset -> start
  fresh, refused in a directory that holds checkpoints (nothing is overwritten unless asked).
"""
from __future__ import annotations

import atexit
import fcntl
import logging
import os
import time

import paddle.distributed as pdist

import ppdlx.checkpoint.unit as unit
from ppdlx import dist
from ppdlx.checkpoint.files import SUFFIXES, locate, strip_suffix
from ppdlx.checkpoint.training import BEST, EPOCH_NAME, checkpoint_names, recorded_epoch, resolve_resume
from ppdlx.checkpoint.unit import CheckpointError
from ppdlx.data.data_dirs import refuse_output_inside_data
from ppdlx.errors import ConfigError
from ppdlx.processes import alive

log = logging.getLogger("ppdlx")
LOCK_NAME = "train.lock"
# a holder that died may leave data-loader workers holding the lock for a moment while they exit
DEAD_HOLDER_WAIT_SECONDS = 10.0
_held: dict = {}  # lock file's real path -> (pid, descriptor) of the process holding it


def prepare_output_dir(cfg, rank: int):
    """Settle ``global.output_dir`` for a training: the checkpoint to resume from, or None to start fresh."""
    out, resume = cfg.global_.output_dir, cfg.train.resume
    refuse_output_inside_data(cfg, out)  # every rank alike, before anything is created
    if resume == "never":
        _refuse_clearing_through_link(out)
    if rank == 0:
        _make_writable(out)
        lock_output_dir(out)
        removed = unit.remove_leftovers(out)
        if removed:
            log.info("removed what interrupted saves left in %s: %s", out, ", ".join(removed))
        if resume == "never":
            _remove_checkpoints(out)
    if resume == "never":
        return None
    if not resume:  # every rank decides alike (they see the same files): none waits for one that stopped
        names = checkpoint_names(out)
        if names:
            shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
            raise ConfigError(f"global.output_dir={out} already holds checkpoints ({shown}); pass train.resume=auto "
                              f"to continue from the newest complete one, train.resume=never to start over "
                              f"(replacing them), or another global.output_dir")
        return None
    path = resolve_resume(resume, out)
    if path and rank == 0:
        _repair_best(out, path)
    return path


def check_ranks_resume_alike(out: str, resume_path) -> None:
    """Each rank settles the resume on the files it sees, and only rank 0 writes checkpoints: ranks on
    nodes that do not share ``global.output_dir`` (node-local disks) would resume some ranks and start
    others fresh, and train different models until the first parameter check. Every rank gathers what
    each one resumes and all refuse alike when they differ."""
    if dist.world_size() <= 1:
        return
    seen = []
    pdist.all_gather_object(seen, _resume_fingerprint(resume_path))
    if any(f != seen[0] for f in seen):
        groups = {}  # what was found -> the ranks that found it, in rank order
        for r, fingerprint in enumerate(seen):
            groups.setdefault(repr(fingerprint), (fingerprint, []))[1].append(r)
        found = "; ".join(f"rank{'s' if len(ranks) > 1 else ''} {','.join(map(str, ranks))}: {_describe(f)}"
                          for f, ranks in groups.values())
        raise ConfigError(f"global.output_dir={out}: the ranks of this job see different checkpoints there ({found}); "
                          f"every rank must read the same global.output_dir (a folder all nodes share), or resume "
                          f"from one checkpoint all nodes can read (train.resume=<path>)")


def _resume_fingerprint(path):
    """What a rank resumes from: None, or the checkpoint's path, epoch and file digests."""
    if path is None:
        return None
    kind, where = locate(path)
    digests = sorted((n, e["sha256"]) for n, e in unit.read_manifest(where)["files"].items()) if kind == "unit" \
        else None
    return [path, recorded_epoch(path), digests]


def _describe(fingerprint) -> str:
    return "no checkpoint (a fresh start)" if fingerprint is None else \
        f"{fingerprint[0]} (epoch {fingerprint[1]})"


def _make_writable(out: str) -> None:
    try:
        os.makedirs(out, exist_ok=True)
        probe = os.path.join(out, f".write-probe.tmp-{os.getpid()}")
        with open(probe, "wb"):
            pass
        os.remove(probe)
    except OSError as err:
        raise ConfigError(f"global.output_dir={out}: cannot write there ({err.strerror}: {err.filename}); "
                          f"choose a writable global.output_dir") from None


def _pid_in(fd: int):
    text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None


def lock_output_dir(out: str) -> None:
    """Hold ``<out>/train.lock`` for this process (see the module doc); ConfigError when another holds it."""
    path = os.path.join(out, LOCK_NAME)
    key = os.path.realpath(path)
    if key in _held and _held[key][0] == os.getpid():
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    deadline = time.monotonic() + DEAD_HOLDER_WAIT_SECONDS
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            holder = _pid_in(fd)
            dead = holder is not None and not alive(holder)
            if dead and time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            os.close(fd)
            who = f"pid {holder}" if holder is not None else "a process"
            still = ", which has ended but whose child processes still hold it" if dead else ""
            raise ConfigError(f"global.output_dir={out} is in use by another training ({who} holds {path}{still}); "
                              f"wait for it to end, or use another global.output_dir") from None
        except OSError as err:  # a file system without locks (some FUSE mounts): the training runs unguarded
            log.warning("global.output_dir=%s: cannot lock %s (%s): a second training into it would not be refused",
                        out, path, err.strerror)
            break
    previous = _pid_in(fd)
    if previous is not None and previous != os.getpid():
        log.warning("global.output_dir=%s: took over %s from pid %d, which ended without releasing it",
                    out, path, previous)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
    os.fsync(fd)
    _held[key] = (os.getpid(), fd)
    atexit.register(release_output_dir, out)  # any exit but a kill empties the file: no take-over to report


def release_output_dir(out: str) -> None:
    """Release the lock this process holds on ``out`` (an empty lock file: nobody to take over from)."""
    pid, fd = _held.pop(os.path.realpath(os.path.join(out, LOCK_NAME)), (None, None))
    if pid != os.getpid():  # a forked child shares the lock: unlocking there would unlock the holder
        return
    try:
        os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _remove_checkpoints(out: str) -> None:
    """``train.resume=never``: remove the checkpoints (either layout), pointers first so none dangles."""
    names = checkpoint_names(out)
    if not names:
        return
    entries = [e for e in os.listdir(out) if (strip_suffix(e) if e.endswith(SUFFIXES) else e) in names]
    for entry in sorted(entries, key=lambda e: not os.path.islink(os.path.join(out, e))):
        path = os.path.join(out, entry)
        if os.path.isdir(path) and not os.path.islink(path):
            unit.retire(path)
        else:
            os.remove(path)
    log.info("train.resume=never: removed the checkpoints in %s (%s)", out, ", ".join(names))


def _refuse_clearing_through_link(out: str) -> None:
    """``train.resume=never`` removes checkpoints: through a link (``out`` or a folder above it) they may be another
    run's, and the log would name only the link. Refused, naming the real folder, when there are any."""
    real = os.path.realpath(out)
    names = checkpoint_names(out) if os.path.isdir(out) else []
    if real == os.path.abspath(out) or not names:
        return
    shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
    raise ConfigError(f"global.output_dir={out} leads through a symbolic link to {real}, which holds checkpoints "
                      f"({shown}); train.resume=never would remove them: to start over there, pass "
                      f"global.output_dir={real}, or choose another global.output_dir")


def _repair_best(out: str, path: str) -> None:
    """A save killed between pointing ``latest`` and ``best`` at its unit leaves ``best`` behind: resuming from
    a unit that improved on the best, newer than what ``best`` points at, points ``best`` at it."""
    kind, where = locate(path)
    target = os.path.basename(os.path.realpath(where))
    if kind != "unit" or os.path.realpath(os.path.dirname(os.path.realpath(where))) != os.path.realpath(out) \
            or not EPOCH_NAME.fullmatch(target):
        return
    manifest = unit.read_manifest(where)
    if not manifest.get("improved") or unit.pointer_target(out, BEST) == target:
        return
    try:
        best_epoch = recorded_epoch(os.path.join(out, BEST))
    except CheckpointError:
        best_epoch = -1
    if best_epoch < manifest["epoch"]:
        unit.point(out, BEST, target)
        log.info("best -> %s: its save was interrupted before it pointed best there", target)
