"""What the loaders share: the paddle.io loader over a map-style dataset with undecodable images
reported once by name, the guard around importing a DALI backend, and the batch sampler of a split."""
from __future__ import annotations

import contextlib
import logging

import numpy as np
import paddle

from ppdlx.data.image_file import why_unreadable
from ppdlx.data.samplers import EvalBatchSampler, TrainBatchSampler
from ppdlx.errors import ConfigError, DataError

log = logging.getLogger("ppdlx.data")


def report_unreadable(skipped_files: list, path: str, reason: str | None = None) -> None:
    """One warning line per unreadable image and run; ``skipped_files`` remembers it."""
    if path in skipped_files:
        return
    skipped_files.append(path)
    if reason:
        log.warning("skipping unreadable image %s (%s; %d skipped so far)", path, reason, len(skipped_files))
    else:
        log.warning("skipping unreadable image %s (%d skipped so far)", path, len(skipped_files))


def nothing_readable(source: str, tried: int, first: str) -> DataError:
    """The one line for a pass in which no image could be read: training on it would run 0 steps and save an
    untrained model, evaluating it would score nothing."""
    return DataError(f"{source}: none of the {tried} images this rank read can be decoded (first: {first}); "
                     f"replace the files (tools/check_data.py lists every unreadable one) or fix data.root")


@contextlib.contextmanager
def dali_required():
    """Around ``from ppdlx.data import dali...``: a missing DALI is one ``ConfigError`` line."""
    try:
        yield
    except ImportError as err:
        raise ConfigError(f"data.backend=dali: NVIDIA DALI is not installed ({err}); "
                          f"pip install 'ppdlx[dali]' or set data.backend=paddle") from None


def split_batch_sampler(training: bool, num_samples: int, batch_size: int, rank: int, world_size: int, seed: int,
                        shuffle: bool, source: str, last_batch: str = "drop"):
    """Training: full shuffled batches (``ConfigError`` if a rank gets none), the last partial one dropped or
    filled (``data.last_batch``); val: disjoint shards, every sample once. ``source`` (split directory or
    annotation file) names the data in the error."""
    if not training:
        return EvalBatchSampler(num_samples, batch_size, rank, world_size)
    sampler = TrainBatchSampler(num_samples, batch_size, rank, world_size, seed=seed, shuffle=shuffle,
                                fill_last=last_batch == "fill")
    if len(sampler) == 0:
        raise ConfigError(f"data.batch_size={batch_size}: larger than the {num_samples} training images per "
                          f"rank ({source}); lower data.batch_size")
    return sampler


class _PaddleDataset(paddle.io.Dataset):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, index):
        return self.inner[index]


class PaddleIOLoader:
    """Batches of a map-style dataset through ``paddle.io.DataLoader``.

    ``collate_fn`` returns the batch's arrays followed by the dataset indices of the samples it
    dropped as undecodable (-1 for the others; a fixed length, as paddle cannot pass empty arrays
    between workers) and a 1-D first array when every sample of the batch was dropped. The loader
    yields the arrays without that last one, reports each dropped image once (``path_of(index)``)
    and skips empty batches; a whole pass without one readable image is a ``DataError`` naming ``source``.
    A training pass (a :class:`TrainBatchSampler`) still yields ``len(self)`` batches, as the DALI
    loaders do: each step of several ranks is a collective, and a rank one batch short would leave
    the others waiting in it (NCCL may instead reduce unrelated buffers into each other). A batch
    with no readable image is made up by repeating the pass's next readable batch (its last one at
    the end of a pass).
    """

    source = ""  # the split directory or annotation file, for messages

    def __init__(self, dataset, batch_sampler, workers: int, collate_fn):
        self.dataset = dataset
        self.batch_sampler = batch_sampler
        self.workers = workers
        self.skipped_files: list = []
        self._loader = paddle.io.DataLoader(_PaddleDataset(dataset), batch_sampler=batch_sampler,
                                            collate_fn=collate_fn, num_workers=workers, return_list=True,
                                            use_shared_memory=workers > 0)

    def path_of(self, index: int) -> str:
        raise NotImplementedError

    @property
    def num_images(self):
        return len(self.dataset)

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)
        self.batch_sampler.set_epoch(epoch)

    def __len__(self):
        return len(self.batch_sampler)

    def __iter__(self):
        it = iter(self._loader)
        keep_length = isinstance(self.batch_sampler, TrainBatchSampler)
        yielded, dropped, owed, last = 0, [], 0, None
        try:
            for *arrays, skipped in it:
                # the vector has a row per sample asked for, the images one per sample decoded: read back (a
                # device round trip once paddle's reader has copied it) only when some sample is missing
                if arrays[0].ndim == 1 or arrays[0].shape[0] < skipped.shape[0]:
                    for index in np.asarray(skipped).reshape(-1).tolist():
                        if index >= 0:
                            dropped.append(self.path_of(index))
                            report_unreadable(self.skipped_files, dropped[-1], why_unreadable(dropped[-1]))
                if arrays[0].ndim == 1:
                    owed += keep_length
                    continue
                last = tuple(arrays)
                for _ in range(1 + owed):
                    yielded += 1
                    yield last
                owed = 0
            if not yielded and dropped:
                raise nothing_readable(self.source, len(dropped), dropped[0])
            for _ in range(owed):
                yield last
        finally:
            # A consumer that stops early (steps_per_epoch, precise BN) would otherwise leave the
            # worker processes of this pass alive until the iterator is garbage collected.
            shutdown = getattr(it, "_try_shutdown_all", None)
            if shutdown is not None:
                shutdown()
