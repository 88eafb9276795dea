"""How both DALI loaders get each epoch's files into one pipeline built per run.

DALI's readers (``fn.readers.file``, ``fn.readers.coco``) fix their file list when the pipeline
is built, so following the sampler's new order every epoch meant a new pipeline every epoch,
and each one left host memory behind (``docs/data.md``). Here the loader hands DALI the batches
of its sampler's order through ``fn.external_source`` and ``fn.io.file.read`` reads the bytes on
DALI's threads; after each pass the pipeline is reset and serves the next one.
"""
from __future__ import annotations

import nvidia.dali.fn as fn
import nvidia.dali.types as types
import numpy as np


class EpochFeed:
    """``fn.external_source``'s callback: batches of (encoded path, value) over one pass of ``order``.

    DALI calls it from ``Pipeline.run`` on the calling thread, up to ``prefetch_queue_depth`` batches
    ahead; ``StopIteration`` after the last batch ends DALI's epoch, and ``start`` sets the next pass.
    The last batch is as short as the order leaves it (no padding to trim).
    """

    def __init__(self, paths, values, batch_size: int):
        self.paths, self.values, self.batch_size = paths, np.asarray(values, np.int64), batch_size
        self._chunks = iter(())

    def start(self, order) -> None:
        order = np.asarray(order, np.int64)
        self._chunks = iter([order[i: i + self.batch_size] for i in range(0, len(order), self.batch_size)])

    def stop(self) -> None:
        self._chunks = iter(())

    def __call__(self):
        chunk = next(self._chunks)
        return [np.frombuffer(self.paths[i].encode(), np.uint8) for i in chunk], self.values[chunk][:, None]


def read_fed_files(feed: EpochFeed):
    """Inside a pipeline definition: ``(encoded file bytes, value per sample as int64 [1])``."""
    paths, values = fn.external_source(source=feed, num_outputs=2, batch=True, dtype=[types.UINT8, types.INT64])
    return fn.io.file.read(paths), values


def drained(pipe, feed: EpochFeed):
    """``pipe`` ready for the next pass, or None if DALI fails on a batch still in flight.

    A pass read to its end leaves nothing in flight. A pass left early (the trainer stops at its
    last whole accumulation window, or at ``train.steps_per_epoch``) leaves up to
    ``prefetch_queue_depth`` batches of its order in DALI: the feed stops and they are read and
    dropped, rather than building a new pipeline for the next pass.
    """
    feed.stop()
    try:
        while True:
            pipe.run()
    except StopIteration:
        return pipe
    except RuntimeError:
        return None
