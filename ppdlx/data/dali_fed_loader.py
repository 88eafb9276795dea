"""The loop both DALI loaders (classification ``dali``, COCO ``dali_coco``) share.

One pipeline per loader and run reads each epoch's sampler order (``dali_feed``). A pass left early
is drained. A file DALI cannot read stops the pipeline, and the batch it stops at need not hold the
file (it runs batches ahead); the loader then tries the files of the batches in flight one at a time
(``find_undecodable``: the bytes read here, an empty file named as such, the rest through a
synchronous CPU decoder) and, with ``data.dali.corrupt_files: skip`` (default, as the paddle.io
loaders), logs one warning per file, leaves it out for the rest of the run and builds a new pipeline
(DALI invalidates one after an error) that goes on from the same position. Training batches stay full
and ``len(loader)`` stays exact, so ranks stay in step. With ``error`` it raises ``DataError`` naming
the file. If no single file fails on its own, ``DataError`` carries DALI's message; if no file of
this rank's pass is readable, ``DataError`` says so. Nothing hangs.
"""
from __future__ import annotations

import math

import nvidia.dali as dali
import nvidia.dali.fn as fn
import nvidia.dali.types as types
import numpy as np
import paddle

from ppdlx.data.dali_feed import EpochFeed, ResumableRandomState, drained
from ppdlx.data.dali_handover import HeldBatches, check_device, dali_device_id
from ppdlx.data.loader_common import nothing_readable, report_unreadable
from ppdlx.errors import DataError


def find_undecodable(paths):
    """``[(path, reason)]`` of the files DALI's CPU decoder cannot read, each tried on its own.

    Each file is read here and decoded in a run of its own: a failed run of the loader's pipeline holds a
    whole batch, and with prefetching it need not be the batch the failing file is in.
    """
    bad, pipe = [], None

    def graph():
        encoded = fn.external_source(name="encoded", dtype=types.UINT8, ndim=1)
        return fn.decoders.image(encoded, device="cpu", output_type=types.RGB)

    for path in paths:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as err:
            bad.append((path, err.strerror or type(err).__name__))
            continue
        if not data:
            bad.append((path, "empty file: 0 bytes"))
            continue
        if pipe is None:
            pipe = dali.pipeline_def(graph)(batch_size=1, num_threads=1, device_id=None, prefetch_queue_depth=1,
                                            exec_pipelined=False, exec_async=False)
            pipe.build()
        pipe.feed_input("encoded", [np.frombuffer(data, np.uint8)])
        try:
            pipe.run()
        except RuntimeError as err:
            detail = dali_error_line(err)
            bad.append((path, "DALI's decoder rejects it" + (f" ({detail})" if detail else "")))
            pipe = None  # DALI invalidates a pipeline after an error
    return bad


# What DALI wraps around the reason of an operator's error: the pipeline/operator header, the Python
# traceback of the graph definition, the C++ source location, the trailer, and the batch position of a sample
# (always #0 when files are tried one at a time).
_DALI_WRAPPING = ("critical error in pipeline", "error in cpu operator", "error in gpu operator",
                  "error in mixed operator", "which was used in the pipeline", "c++ context",
                  "current pipeline object is no longer valid", "unknown error", "failed to decode sample #")


def dali_error_line(err, default=""):
    """The line of a DALI error that says what went wrong (e.g. ``File mapping failed: <path>``)."""
    text = str(err)
    if "encountered:" in text:
        text = text.rsplit("encountered:", 1)[1]
    lines = [ln.strip().rstrip(":").strip() for ln in text.splitlines()]
    useful = [ln for ln in lines if ln and not ln.lower().startswith(_DALI_WRAPPING)]
    return (useful or [default])[0][:200]


class FedDaliLoader(ResumableRandomState):
    """Base of the DALI loaders: ``len()`` (batches of this rank), ``set_epoch``, ``skipped_files``,
    ``state_dict``/``set_state_dict`` and one epoch per ``iter()``.

    A subclass calls ``_setup`` and defines ``_graph()`` (the outputs of its DALI graph, reading
    ``read_fed_files(self._feed)``), ``draws_randomly`` and ``_batch(outputs) -> (batch, images)``.
    """

    draws_randomly = False
    _staging = None  # the pinned host buffer the last batch's host arrays were copied from (GPU only)

    def _setup(self, cfg, training: bool, paths, values, sampler, source: str, batch_size: int, rank: int) -> None:
        self.dali_cfg, self.training, self.sampler, self.source = cfg.data.dali, training, sampler, source
        self.dali_device = check_device(cfg.data.dali.device)  # "cpu" or "gpu"
        self.batch_size, self.rank, self.seed = batch_size, rank, cfg.global_.seed
        self.paths = paths
        self._feed = EpochFeed(paths, values, batch_size)
        self.epoch = 0
        self.skipped_files: list = []
        self._bad: set = set()
        self._pipe = None          # the pipeline, between passes
        self.device = paddle.get_device()  # where batches go: paddle's device, whatever DALI runs on

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.sampler)

    # --------------------------------------------------------------- order
    def _order(self) -> list:
        self.sampler.set_epoch(self.epoch)
        return self._top_up([i for batch in self.sampler for i in batch if i not in self._bad])

    def _top_up(self, order: list) -> list:
        """Training keeps ``len(self)`` full batches after skipping files (ranks stay in step):
        the shortfall is filled with this epoch's readable files from the start."""
        if not self.training:
            return order
        need = len(self) * self.batch_size
        pool = [i for i in order if i not in self._bad]
        if not pool:
            raise nothing_readable(self.source, len(self._bad), self.skipped_files[0])
        out = list(order)
        while len(out) < need:
            out += pool[: need - len(out)]
        return out[:need]

    # ------------------------------------------------------------ pipeline
    def _build(self, position: int):
        c = self.dali_cfg
        seed = (self.seed * 1_000_003 + self.rank * 7_919 + self.epoch * 104_729 + position) % (2 ** 31 - 1)
        return self._built(self._graph, self.draws_randomly, batch_size=self.batch_size, num_threads=c.num_threads,
                           device_id=dali_device_id(self.dali_device), seed=seed,
                           prefetch_queue_depth=c.prefetch_queue_depth, exec_dynamic=True)

    def __iter__(self):
        order = self._order()
        batches = len(self) if self.training else math.ceil(len(order) / self.batch_size)
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            pipe.reset()  # DALI's end of the last pass (the feed's StopIteration) back to a first iteration
            self._feed.start(order)
        position, done = 0, 0
        held = HeldBatches(self.dali_cfg.prefetch_queue_depth + 1)
        try:
            while done < batches and position < len(order):
                if pipe is None:
                    self._feed.start(order[position:])
                    pipe = self._build(position)
                try:
                    outputs = pipe.run()
                except RuntimeError as err:
                    pipe = None
                    order = self._skip_unreadable(order, position, err)
                    if not self.training:
                        batches = math.ceil(len(order) / self.batch_size)
                    continue
                batch, images = self._batch(outputs)
                position += images
                done += 1
                yield batch
                held.consumed(batch, self._staging)
        except GeneratorExit:
            pass  # the consumer left the pass early; the pipeline is drained below
        held.release_all()  # before DALI runs again (the drain, the next pass) and reuses their memory
        if pipe is not None:
            self._pipe = drained(pipe, self._feed)

    def _skip_unreadable(self, order, position, err):
        window = self.batch_size * (self.dali_cfg.prefetch_queue_depth + 2)
        candidates = order[position: position + window]
        bad = find_undecodable([self.paths[i] for i in candidates])
        where = (f"{self.source}: DALI pipeline failed at batch {position // self.batch_size + 1} of epoch "
                 f"{self.epoch + 1}")
        if not bad:
            raise DataError(f"{where} and no single file of the batches in flight fails on its own: "
                            f"{dali_error_line(err, type(err).__name__)}") from None
        if self.dali_cfg.corrupt_files == "error":
            path, reason = bad[0]
            raise DataError(f"{path}: {reason}; the data.backend=dali loader cannot read it: delete or replace it, "
                            f"or set data.dali.corrupt_files=skip to leave such files out") from None
        index_of = {self.paths[i]: i for i in candidates}
        for path, reason in bad:
            self._bad.add(index_of[path])
            report_unreadable(self.skipped_files, path, reason)
        kept = order[:position] + [i for i in order[position:] if i not in self._bad]
        if not kept:
            raise nothing_readable(self.source, len(set(order)), self.paths[order[0]]) from None
        return self._top_up(kept)
