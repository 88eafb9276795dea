"""Which files an export produced: Paddle 3 writes ``PREFIX.json`` (PIR program) by default and
``PREFIX.pdmodel`` (legacy ProgramDesc) under the old-IR guard; both come with
``PREFIX.pdiparams``. The format is decided by the files on disk, never by version strings.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Dict, Sequence

from ppdlx.errors import ConfigError
from ppdlx.export.meta import META_FILE
from ppdlx.processes import alive

FORMATS = {"pir": ".json", "program": ".pdmodel"}
STAGING_PREFIX = ".export-staging-"
STAGING_NAME = re.compile(re.escape(STAGING_PREFIX) + r"(\d+)-\w+")  # <prefix><pid>-<random>
log = logging.getLogger("ppdlx")


@dataclass(frozen=True)
class ModelFiles:
    model_dir: str
    prefix: str          # file name prefix inside model_dir, e.g. "inference"
    format: str          # "pir" (.json) | "program" (.pdmodel)
    model_file: str      # absolute path
    params_file: str     # absolute path

    @property
    def model_filename(self) -> str:
        return os.path.basename(self.model_file)

    @property
    def params_filename(self) -> str:
        return os.path.basename(self.params_file)


def find_model_files(model_dir: str, prefix: str = "inference") -> ModelFiles:
    """Locate ``PREFIX.json`` or ``PREFIX.pdmodel`` (+ ``.pdiparams``) in ``model_dir``.

    Both program files present is ambiguous (a stale export): one-line error naming them.
    """
    found = {fmt: os.path.join(model_dir, prefix + ext) for fmt, ext in FORMATS.items()
             if os.path.isfile(os.path.join(model_dir, prefix + ext))}
    if not found:
        raise ConfigError(f"{model_dir}: no exported program ({prefix}.json or {prefix}.pdmodel); "
                          f"run tools/export_model.py first")
    if len(found) > 1:
        raise ConfigError(f"{model_dir}: both {prefix}.json and {prefix}.pdmodel exist (a stale export?); "
                          f"remove the one you do not want")
    fmt, model_file = next(iter(found.items()))
    params_file = os.path.join(model_dir, prefix + ".pdiparams")
    if not os.path.isfile(params_file):
        raise ConfigError(f"{model_dir}: {prefix}.pdiparams is missing next to {os.path.basename(model_file)}")
    return ModelFiles(os.path.abspath(model_dir), prefix, fmt, os.path.abspath(model_file),
                      os.path.abspath(params_file))


# What deploy/ derives from an export inside its folder by default (TensorRT engines and
# calibration tables, OpenVINO's compiled model): worthless once the export is replaced.
DERIVED_CACHES = ("_trt_cache", "_openvino_cache")


def remove_stale(model_dir: str, prefix: str = "inference") -> None:
    """Delete a previous export's program/params so a re-export cannot leave two formats behind,
    and the caches built from it."""
    for ext in (".json", ".pdmodel", ".pdiparams", ".pdiparams.info", ".onnx"):
        path = os.path.join(model_dir, prefix + ext)
        if os.path.isfile(path):
            os.remove(path)
    for name in DERIVED_CACHES:
        shutil.rmtree(os.path.join(model_dir, name), ignore_errors=True)


def remove_stale_staging(model_dir: str) -> list:
    """Remove the staging folders in ``model_dir`` whose export was killed (its process, named in the folder's
    name, has ended; a folder of a running export, or of a name without a pid, is left alone); returns their
    names."""
    removed = []
    for name in sorted(os.listdir(model_dir)) if os.path.isdir(model_dir) else []:
        match = STAGING_NAME.fullmatch(name)
        if match and not alive(int(match.group(1))) and os.path.isdir(os.path.join(model_dir, name)):
            shutil.rmtree(os.path.join(model_dir, name), ignore_errors=True)
            removed.append(name)
    if removed:
        log.info("removed what killed exports left in %s: %s", model_dir, ", ".join(removed))
    return removed


@contextmanager
def staged_export(model_dir: str):
    """A fresh staging folder inside ``model_dir`` (same file system, so :func:`publish_export` only
    renames) for an export to be written and checked in; it is removed afterwards, so an export that
    fails leaves the folder's previous export as it was. Its name carries this process's id: a killed export's
    folder is removed by the next export into ``model_dir``."""
    remove_stale_staging(model_dir)
    staging = tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-", dir=model_dir)
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def publish_export(staging: str, model_dir: str, prefix: str = "inference") -> None:
    """Move a finished export's files from ``staging`` into ``model_dir`` in place of the export there.
    The old ``inference.yml`` goes first and the new one comes last: deploy reads a folder only through
    its inference.yml, so at every moment the folder holds one whole export or none."""
    old_meta = os.path.join(model_dir, META_FILE)
    if os.path.isfile(old_meta):
        os.remove(old_meta)
    remove_stale(model_dir, prefix)
    names = sorted(n for n in os.listdir(staging) if n != META_FILE and os.path.isfile(os.path.join(staging, n)))
    for name in names + [META_FILE]:
        os.replace(os.path.join(staging, name), os.path.join(model_dir, name))


def ensure_output_dir(path: str, option: str = "--output-dir") -> None:
    """Create the export directory, or say in one line why it cannot be (before any model is built)."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"{option} {path}: is a file, not a directory; choose a directory that can be written")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"{option} {path}: cannot create it ({err.strerror}: {err.filename}); choose a directory "
                          f"that can be written") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{option} {path}: not writable; choose a directory that can be written")


def file_records(paths: Sequence[str]) -> Dict[str, dict]:
    """``{file name: {bytes, sha256}}``: what ``inference.yml`` records of the Paddle program and weights so
    that deploy can tell a damaged or replaced file from the one exported (ppdlx_deploy.integrity)."""
    records = {}
    for path in paths:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                digest.update(chunk)
        records[os.path.basename(path)] = {"bytes": os.path.getsize(path), "sha256": digest.hexdigest()}
    return records
