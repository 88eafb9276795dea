"""NVIDIA DALI classification pipelines (``data.backend: dali``), CPU and GPU.

Same config keys as the paddle.io path (``data.transforms``), same sample order and
sharding (the file order of every epoch comes from ``TrainBatchSampler`` /
``EvalBatchSampler``, so switching backend changes decoding and augmentation only).

* ``data.dali.device: cpu``: every operator on CPU (``device_id=None``); works on a
  CPU-only Paddle build.  ``gpu``: ``mixed`` (nvJPEG) decoding and GPU resize/normalise;
  on a Paddle build without CUDA it fails with one line (``UnsupportedError``).
  Worker threads: ``data.dali.num_threads`` (``data.workers`` is paddle.io's).
* Reading: one pipeline per loader and run, fed this rank's batches of (file path, label)
  for the epoch, already shuffled and sharded (``dali_feed``: why not ``fn.readers.file``);
  labels are the indices of the sorted class folders (``scan_image_folder``, as
  ImageFolder).  The random crops and flips are seeded once, from ``(global.seed, rank,
  first epoch of the run)``; a resumed run restores the pipeline's random state from the
  checkpoint (``dali_feed.ResumableRandomState``), so it draws the crops of the run it resumes.
* Train: ``decoders.image_random_crop`` (area ``scale``, aspect ``ratio``; fused ROI
  decode) -> resize to ``crop_size`` -> ``crop_mirror_normalize`` (coin-flip mirror with
  probability ``hflip``).  ``transforms.random: false`` uses the eval transform and order.
* Val: decode the centre square that resize-shorter-to-``resize_short`` + centre-crop
  ``crop_size`` would keep (``decoders.image_crop``), resize it to ``crop_size``,
  normalise.  The last batch is as short as the split leaves it, so every val image is
  counted exactly once across ranks.
* Hand-over: both devices run the pipeline directly and pass its outputs through
  ``dali_handover.to_paddle`` (zero-copy DLPack, on paddle's current stream for GPU
  buffers); everything after it (the label reshape) is the same code on CPU and GPU.
* Corrupt / unreadable files: DALI stops the pipeline, and the batch it stops at need not
  hold the file (it runs batches ahead).  The loader then tries the files of the batches
  in flight one at a time (``find_undecodable``: the bytes read here, an empty file named
  as such, the rest through a synchronous CPU decoder) and, with
  ``data.dali.corrupt_files: skip`` (default, as the paddle.io path), logs one warning
  per file, leaves it out for the rest of the run and builds a new pipeline (DALI
  invalidates one after an error) that goes on from the same position (training batches
  stay full and ``len(loader)`` stays exact, so ranks stay in step).  With ``error`` it
  raises ``DataError`` naming the file.  If no single file fails on its own, ``DataError``
  carries DALI's message; if no file of this rank's pass is readable, ``DataError`` says
  so.  Nothing hangs.
"""
from __future__ import annotations

import math
import os

import nvidia.dali as dali
import nvidia.dali.fn as fn
import nvidia.dali.math as dmath
import nvidia.dali.types as types
import numpy as np
import paddle

from ppdlx.data.dali_feed import EpochFeed, ResumableRandomState, drained, read_fed_files
from ppdlx.data.dali_handover import check_device, dali_device_id, to_paddle
from ppdlx.data.image_folder import check_same_classes, require_images_in_every_class, scan_image_folder
from ppdlx.data.loader_common import nothing_readable, report_unreadable, split_batch_sampler
from ppdlx.errors import DataError, UnsupportedError

_INTERP = {"bilinear": types.INTERP_LINEAR, "bicubic": types.INTERP_CUBIC}
_DTYPE = {"float32": types.FLOAT, "float16": types.FLOAT16}


def _graph(feed, t, dali_cfg, data_format, training_random: bool):
    """The DALI graph (traced inside a ``pipeline_def``)."""
    gpu = dali_cfg.device == "gpu"
    decode_dev, op_dev = ("mixed", "gpu") if gpu else ("cpu", "cpu")
    dec_kw = dict(device_memory_padding=211025920, host_memory_padding=140544512) if gpu else {}
    jpegs, label = read_fed_files(feed)
    crop, interp = t.crop_size, _INTERP[t.interpolation]
    mirror = 0
    if training_random:
        images = fn.decoders.image_random_crop(jpegs, device=decode_dev, output_type=types.RGB,
                                               random_area=list(t.scale), random_aspect_ratio=list(t.ratio),
                                               num_attempts=10, **dec_kw)
        images = fn.resize(images, device=op_dev, resize_x=crop, resize_y=crop, interp_type=interp)
        if t.hflip > 0:
            mirror = fn.random.coin_flip(probability=t.hflip)
    elif crop <= t.resize_short:
        # resize-shorter(S) + centre-crop(C) == centre square of side short*C/S, resized to C.
        shape = fn.peek_image_shape(jpegs, dtype=types.FLOAT)
        side = dmath.min(shape[0], shape[1]) * (crop / float(t.resize_short))
        images = fn.decoders.image_crop(jpegs, device=decode_dev, output_type=types.RGB, crop_w=side,
                                        crop_h=side, **dec_kw)
        images = fn.resize(images, device=op_dev, resize_x=crop, resize_y=crop, interp_type=interp)
    else:
        images = fn.decoders.image(jpegs, device=decode_dev, output_type=types.RGB, **dec_kw)
        images = fn.resize(images, device=op_dev, resize_shorter=t.resize_short, interp_type=interp)
    images = fn.crop_mirror_normalize(
        images, device=op_dev, dtype=_DTYPE[dali_cfg.output_dtype],
        output_layout="CHW" if data_format == "NCHW" else "HWC", crop=(crop, crop), mean=list(t.mean),
        std=list(t.std), mirror=mirror, pad_output=dali_cfg.pad_output, out_of_bounds_policy="pad")
    if gpu:
        label = label.gpu()
    return images, label


def _run_pipeline_def(graph_fn, **pipe_kwargs):
    return dali.pipeline_def(graph_fn)(**pipe_kwargs)


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
            pipe = _run_pipeline_def(graph, batch_size=1, num_threads=1, device_id=None, prefetch_queue_depth=1,
                                     exec_pipelined=False, exec_async=False)
            pipe.build()
        pipe.feed_input("encoded", [np.frombuffer(data, np.uint8)])
        try:
            pipe.run()
        except RuntimeError as err:
            detail = _first_line(err)
            bad.append((path, "DALI's decoder rejects it" + (f" ({detail})" if detail else "")))
            pipe = None  # DALI invalidates a pipeline after an error
    return bad


# What DALI wraps around the reason of an operator's error: the pipeline/operator header, the Python
# traceback of the graph definition, the C++ source location, the trailer, and the batch position of a sample
# (always #0 when files are tried one at a time).
_DALI_WRAPPING = ("critical error in pipeline", "error in cpu operator", "error in gpu operator",
                  "error in mixed operator", "which was used in the pipeline", "c++ context",
                  "current pipeline object is no longer valid", "unknown error", "failed to decode sample #")


def _first_line(err, default=""):
    """The line of a DALI error that says what went wrong (e.g. ``File mapping failed: <path>``)."""
    text = str(err)
    if "encountered:" in text:
        text = text.rsplit("encountered:", 1)[1]
    lines = [ln.strip().rstrip(":").strip() for ln in text.splitlines()]
    useful = [ln for ln in lines if ln and not ln.lower().startswith(_DALI_WRAPPING)]
    return (useful or [default])[0][:200]


class DaliLoader(ResumableRandomState):
    """``(images, labels)`` paddle tensors from a DALI pipeline, one epoch per ``iter()``.

    Same interface as ``ImageFolderLoader``: ``len()`` (batches of this rank),
    ``set_epoch``, ``num_images`` (images in the split), ``classes``, ``skipped_files``;
    and ``state_dict``/``set_state_dict`` (``ResumableRandomState``).
    """

    def __init__(self, cfg, split: str, rank: int = 0, world_size: int = 1, batch_size=None, classes=None):
        data = cfg.data
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.dali_cfg, self.transforms = data.dali, data.transforms
        self.data_format = cfg.model.data_format
        self.batch_size = batch_size or data.batch_size
        self.training = split == "train"
        self.split_dir = os.path.join(data.root, data.train_split if self.training else data.val_split)
        check_device(self.dali_cfg.device)
        if self.training and self.transforms.random:
            for key in ("randaugment", "random_erasing"):  # paddle.io-only extras (ppdlx.data.augment)
                if getattr(self.transforms, key, None):
                    raise UnsupportedError(f"data.transforms.{key}={getattr(self.transforms, key)!r} is applied by the "
                                           f"paddle.io path only; set data.backend=paddle or turn it off")
        found, samples = scan_image_folder(self.split_dir)
        if classes is not None:
            check_same_classes(self.split_dir, found, classes, "the training split's")
        if not self.training:
            require_images_in_every_class(self.split_dir, found, samples)
        self.classes = found
        self.files = [path for path, _ in samples]
        self.labels = [label for _, label in samples]
        self._feed = EpochFeed(self.files, self.labels, self.batch_size)
        self.seed = cfg.global_.seed
        self.sampler = split_batch_sampler(self.training, len(samples), self.batch_size, rank, world_size, self.seed,
                                           shuffle=self.transforms.random, source=self.split_dir)
        self.epoch = 0
        self.skipped_files: list = []
        self._bad: set = set()
        self._pipe = None          # the pipeline, between passes
        self.device = paddle.get_device()  # where batches go: paddle's device, whatever DALI runs on

    # ------------------------------------------------------------ interface
    @property
    def num_images(self) -> int:
        return len(self.files)

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
            raise nothing_readable(self.split_dir, len(self._bad), self.skipped_files[0])
        out = list(order)
        while len(out) < need:
            out += pool[: need - len(out)]
        return out[:need]

    # ------------------------------------------------------------ pipeline
    def _build(self, position: int):
        c = self.dali_cfg
        seed = (self.seed * 1_000_003 + self.rank * 7_919 + self.epoch * 104_729 + position) % (2 ** 31 - 1)
        random = self.training and self.transforms.random

        def graph():
            return _graph(self._feed, self.transforms, c, self.data_format, random)

        return self._built(graph, random, batch_size=self.batch_size, num_threads=c.num_threads,
                           device_id=dali_device_id(c.device), seed=seed,
                           prefetch_queue_depth=c.prefetch_queue_depth, exec_dynamic=True)

    def _next(self, pipe):
        images, labels = pipe.run()
        return to_paddle(images, self.device), to_paddle(labels, self.device).reshape([-1])

    # ------------------------------------------------------------ iterate
    def __iter__(self):
        order = self._order()
        bs = self.batch_size
        batches = len(self) if self.training else math.ceil(len(order) / bs)
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            pipe.reset()  # DALI's end of the last pass (the feed's StopIteration) back to a first iteration
            self._feed.start(order)
        position, done = 0, 0
        try:
            while done < batches and position < len(order):
                if pipe is None:
                    self._feed.start(order[position:])
                    pipe = self._build(position)
                try:
                    images, labels = self._next(pipe)
                except RuntimeError as err:
                    pipe = None
                    order = self._skip_unreadable(order, position, err)
                    if not self.training:
                        batches = math.ceil(len(order) / bs)
                    continue
                position += int(labels.shape[0])
                done += 1
                yield images, labels
        except GeneratorExit:
            pass  # the consumer left the pass early; the pipeline is drained below
        if pipe is not None:
            self._pipe = drained(pipe, self._feed)

    def _skip_unreadable(self, order, position, err):
        window = self.batch_size * (self.dali_cfg.prefetch_queue_depth + 2)
        candidates = order[position: position + window]
        bad = find_undecodable([self.files[i] for i in candidates])
        where = (f"{self.split_dir}: DALI pipeline failed at batch {position // self.batch_size + 1} of epoch "
                 f"{self.epoch + 1}")
        if not bad:
            raise DataError(f"{where} and no single file of the batches in flight fails on its own: "
                            f"{_first_line(err, type(err).__name__)}") from None
        if self.dali_cfg.corrupt_files == "error":
            path, reason = bad[0]
            raise DataError(f"{path}: {reason}; the data.backend=dali loader cannot read it: delete or replace it, "
                            f"or set data.dali.corrupt_files=skip to leave such files out") from None
        index_of = {self.files[i]: i for i in candidates}
        for path, reason in bad:
            self._bad.add(index_of[path])
            report_unreadable(self.skipped_files, path, reason)
        kept = order[:position] + [i for i in order[position:] if i not in self._bad]
        if not kept:
            raise nothing_readable(self.split_dir, len(set(order)), self.files[order[0]]) from None
        return self._top_up(kept)


def build_dali_loader(cfg, split: str, rank: int = 0, world_size: int = 1, batch_size=None, classes=None):
    """A ``DaliLoader`` for ``split`` ("train" or "val") of ``cfg.data``."""
    return DaliLoader(cfg, split, rank, world_size, batch_size=batch_size, classes=classes)
