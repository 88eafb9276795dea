"""Which files an export produced: Paddle 3 writes ``PREFIX.json`` (PIR program) by default and
``PREFIX.pdmodel`` (legacy ProgramDesc) under the old-IR guard; both come with
``PREFIX.pdiparams``. The format is decided by the files on disk, never by version strings.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ppdlx.errors import ConfigError

FORMATS = {"pir": ".json", "program": ".pdmodel"}


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


def remove_stale(model_dir: str, prefix: str = "inference") -> None:
    """Delete a previous export's program/params so a re-export cannot leave two formats behind."""
    for ext in (".json", ".pdmodel", ".pdiparams", ".pdiparams.info", ".onnx"):
        path = os.path.join(model_dir, prefix + ext)
        if os.path.isfile(path):
            os.remove(path)
