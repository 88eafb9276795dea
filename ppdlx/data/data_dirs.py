"""Where a config's data lives, so that nothing a run writes lands among it.

An output folder inside an image-folder split becomes one more class folder (the run then blamed the data: "1
class without images", and so did every later run on that data); inside any data folder a run's files mix with
the data set's. Paths are compared after resolving links, so a link into the data is seen too.
"""
from __future__ import annotations

import os

import ppdlx.data.coco_dataset  # noqa: F401  (registers coco, and image_folder that it imports, in DATASETS)
from ppdlx.errors import ConfigError
from ppdlx.registry import DATASETS


def data_folders(cfg) -> list:
    """``[(setting, folder)]`` the configured data is read from: ``data.root``, and for COCO image folders given
    outside it; none for synthetic data."""
    data = cfg.data
    if data.backend == "synthetic" or not data.root:
        return []
    return [("data.root", data.root)] + DATASETS.get(data.dataset).folders_outside_root(cfg)


def _inside(path: str, folder: str) -> bool:
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def refuse_output_inside_data(cfg, output_dir: str, option: str = "global.output_dir") -> None:
    """``ConfigError`` (one line) when ``output_dir`` is, or lies inside, a folder the data is read from. Creates
    nothing."""
    for setting, folder in data_folders(cfg):
        if _inside(output_dir, folder):
            raise ConfigError(f"{option}={output_dir} is inside {setting}={folder}: what a run writes there would "
                              f"mix with the data (in an image-folder split, its folder would become a class); choose "
                              f"a {option} outside {setting}")
