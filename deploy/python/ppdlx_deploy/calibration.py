"""Calibration images for int8: pre-processed batches from an image folder (what any post-training
calibration consumes), and Paddle-TRT's calibration run, which turns them into the table its
int8 engines are built from."""
from __future__ import annotations

import time
from typing import Dict, Iterator, List, Optional

import numpy as np

from .errors import UnsupportedError
from .predictors import PaddlePredictor
from .preprocess import Preprocessor, list_images
from .trt import move_calibration_tables, trt_calibration_tables


def calibration_feeds(calib_dir: str, preprocessor: Preprocessor, batch_size: int,
                      max_batches: int) -> Iterator[Dict[str, np.ndarray]]:
    """Up to ``max_batches`` consecutive batches of the folder's images (sorted by path); a folder
    with fewer images than one batch gives one short batch."""
    files = list_images(calib_dir)
    for i in range(min(max_batches, max(1, len(files) // batch_size))):
        batch = files[i * batch_size:(i + 1) * batch_size] or files[:batch_size]
        yield preprocessor.feeds_from_files(batch)


def calibrate_trt(model_dir: str, meta: dict, plan: dict, calib_dir: str, batch_size: int, max_batches: int,
                  sample_feeds: Optional[List[Dict[str, np.ndarray]]] = None) -> List[str]:
    """Paddle-TRT int8 post-training calibration: run calibration batches through a predictor in
    calibration mode; the table is written when that predictor is destroyed and moved into the
    plan's cache dir, from which the next predictor with the same plan builds int8 engines. Returns
    the tables."""
    preprocessor = Preprocessor(meta)
    started = time.time()
    predictor = PaddlePredictor(model_dir, meta=meta, plan=plan, sample_feeds=sample_feeds)
    for feeds in calibration_feeds(calib_dir, preprocessor, batch_size, max_batches):
        predictor.run(feeds)
    del predictor
    move_calibration_tables(plan, started)
    tables = trt_calibration_tables(plan["cache_dir"])
    if not tables:
        raise UnsupportedError(f"--calib-dir: the calibration run wrote no table (trt_calib_*) into "
                               f"{plan['cache_dir']}, so TensorRT did not run; int8 would not be served")
    return tables
