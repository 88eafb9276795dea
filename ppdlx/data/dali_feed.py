"""How both DALI loaders get each epoch's files into one pipeline built per run.

DALI's readers (``fn.readers.file``, ``fn.readers.coco``) fix their file list when the pipeline
is built, so following the sampler's new order every epoch meant a new pipeline every epoch,
and each one left host memory behind (``docs/data.md``). Here the loader hands DALI the batches
of its sampler's order through ``fn.external_source`` and ``fn.io.file.read`` reads the bytes on
DALI's threads; after each pass the pipeline is reset and serves the next one.
"""
from __future__ import annotations

import logging
import os

import nvidia.dali as dali
import nvidia.dali.fn as fn
import nvidia.dali.types as types
import numpy as np

log = logging.getLogger("ppdlx.data")


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

    def __call__(self, batch_info):  # DALI's iteration count is not used: the order is the loader's
        chunk = next(self._chunks)
        return [np.frombuffer(os.fsencode(self.paths[i]), np.uint8) for i in chunk], self.values[chunk][:, None]


def read_fed_files(feed: EpochFeed):
    """Inside a pipeline definition: ``(encoded file bytes, value per sample as int64 [1])``."""
    paths, values = fn.external_source(source=feed, num_outputs=2, batch=True, batch_info=True,
                                       dtype=[types.UINT8, types.INT64])
    return fn.io.file.read(paths), values


# Images in their stored pixel frame, as PIL sees them (the paddle.io loaders, COCO's boxes,
# deploy's pre-processing): DALI's decoders and peek_image_shape otherwise turn a photo by its EXIF
# orientation tag, so its boxes no longer fit its pixels and the two backends feed different images.
STORED_ORIENTATION = {"adjust_orientation": False}


def decoder_options(gpu: bool, training_random: bool) -> dict:
    """Decoder arguments. On GPU (``mixed``), training reserves nvJPEG buffers up front, as NVIDIA's
    ResNet50 pipelines do, so no reallocation stalls a step (the A100's hardware decoder too, sized
    for the largest ImageNet training photo); these are per decoder thread and stay allocated for
    the run, so evaluation keeps DALI's small defaults. Evaluation upsamples
    chroma like libjpeg (the CPU decoder, PIL, deploy's pre-processing), so a model scores the
    same whichever decoder fed it."""
    options = dict(STORED_ORIENTATION)
    if gpu and training_random:
        options.update(device_memory_padding=211025920, host_memory_padding=140544512,
                       preallocate_width_hint=5980, preallocate_height_hint=6430)
    elif gpu:
        options.update(jpeg_fancy_upsampling=True)
    return options


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


class ResumableRandomState:
    """The random state (crops, flips, scales) of a DALI loader's training pipeline between passes.

    One pipeline per run draws each epoch's randomness after the last one's, so a resumed run draws
    the crops of the run it resumes only if it starts from the same state: ``state_dict`` holds the
    pipeline's DALI checkpoint (operator random states), the trainer keeps it with each training
    checkpoint, and ``set_state_dict`` makes the next pipeline start from it. Only pipelines with
    random operators enable DALI's checkpointing (``random``); a pipeline whose state cannot be saved
    gives None, and the resumed run draws afresh and says so.
    """

    _pipe = None
    _restore = None
    _random = False  # the pipelines built track their random state
    conditionals = False  # the graph selects ops per sample (DALI's conditional execution)

    def state_dict(self) -> dict:
        pipe, saved = self._pipe, None
        if pipe is not None and self._random:
            try:
                saved = pipe.checkpoint()
            except RuntimeError as err:
                log.warning("DALI cannot save this pipeline's random state (%s): a run resumed from this checkpoint "
                            "draws its crops afresh", str(err).strip().splitlines()[0][:200])
        return {"dali_checkpoint": saved}

    def set_state_dict(self, state: dict) -> None:
        self._restore, self._pipe = state.get("dali_checkpoint"), None
        if self._restore is None:
            log.info("the checkpoint holds no DALI random state for this loader: its crops and flips are drawn "
                     "afresh (the sample order is the same)")

    def _built(self, graph, random: bool, **pipeline_kwargs):
        """The pipeline of ``graph``, built; with ``random``, trackable by DALI's checkpointing and, the first
        time after ``set_state_dict``, started from the saved state."""
        restore, self._restore = self._restore, None
        self._random = random
        if random and restore is not None:
            try:
                pipe = dali.pipeline_def(graph, enable_conditionals=self.conditionals)(
                    enable_checkpointing=True, checkpoint=restore, **pipeline_kwargs)
                pipe.build()
                return pipe
            except (RuntimeError, ValueError) as err:
                log.warning("the checkpoint's DALI random state does not fit this pipeline (%s): crops and flips "
                            "are drawn afresh from here", str(err).strip().splitlines()[0][:200])
        pipe = dali.pipeline_def(graph, enable_conditionals=self.conditionals)(enable_checkpointing=random,
                                                                               **pipeline_kwargs)
        pipe.build()
        return pipe
