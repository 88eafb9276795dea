"""NVIDIA DALI classification pipelines (``data.backend: dali``), CPU and GPU.

Same config keys as the paddle.io path (``data.transforms``), same sample order and
sharding (the file order of every epoch comes from ``TrainBatchSampler`` /
``EvalBatchSampler``, so switching backend changes decoding and augmentation only).

* ``data.dali.device: cpu``: every operator on CPU (``device_id=None``); works on a
  CPU-only Paddle build.  ``gpu``: ``mixed`` (nvJPEG) decoding and GPU resize/augment/normalise;
  on a Paddle build without CUDA it fails with one line (``UnsupportedError``). ``auto`` (the
  default): ``gpu`` where paddle runs on a GPU, else ``cpu``.
  Worker threads: ``data.dali.num_threads`` (``data.workers`` is paddle.io's).
* Reading: one pipeline per loader and run, fed this rank's batches of (file path, label)
  for the epoch, already shuffled and sharded (``dali_feed``: why not ``fn.readers.file``);
  labels are the indices of the sorted class folders (``scan_image_folder``, as
  ImageFolder).  The random crops and flips are seeded once, from ``(global.seed, rank,
  first epoch of the run)``; a resumed run restores the pipeline's random state from the
  checkpoint (``dali_feed.ResumableRandomState``), so it draws the crops of the run it resumes.
* Train: ``decoders.image_random_crop`` (area ``scale``, aspect ``ratio``; fused ROI
  decode) -> resize to ``crop_size`` -> ``crop_mirror_normalize`` (coin-flip mirror with
  probability ``hflip``).  With ``randaugment`` (timm's order): flip, timm's RandAugment on the
  uint8 crop (``dali_augment``; the pipeline then runs DALI's conditionals), normalise; with
  ``random_erasing``, timm's erasing on the normalised image.  ``transforms.random: false`` uses
  the eval transform and order.
* Val: decode the centre square that resize-shorter-to-``resize_short`` + centre-crop
  ``crop_size`` would keep (``decoders.image_crop``), resize it to ``crop_size``,
  normalise.  The last batch is as short as the split leaves it, so every val image is
  counted exactly once across ranks.
* Hand-over: both devices run the pipeline directly and pass its outputs through
  ``dali_handover.to_paddle`` (zero-copy DLPack, on paddle's current stream for GPU
  buffers); everything after it (the label reshape) is the same code on CPU and GPU.
* Corrupt / unreadable files: found by name and skipped or refused
  (``data.dali.corrupt_files``), as ``dali_fed_loader`` describes.
"""
from __future__ import annotations

import os

import nvidia.dali.fn as fn
import nvidia.dali.math as dmath
import nvidia.dali.types as types

from ppdlx.config.randaugment import parse_rand_augment
from ppdlx.data.augment import rand_augment_fill, rand_augment_ops
from ppdlx.data.dali_augment import erase_random_box, rand_augment
from ppdlx.data.dali_fed_loader import FedDaliLoader
from ppdlx.data.dali_feed import STORED_ORIENTATION, decoder_options, read_fed_files
from ppdlx.data.dali_handover import check_device, to_paddle
from ppdlx.data.image_folder import check_same_classes, require_images_in_every_class, scan_image_folder
from ppdlx.data.loader_common import split_batch_sampler

_INTERP = {"bilinear": types.INTERP_LINEAR, "bicubic": types.INTERP_CUBIC}
_DTYPE = {"float32": types.FLOAT, "float16": types.FLOAT16}


def _graph(feed, t, device: str, data_format, training_random: bool, output_dtype: str):
    """The DALI graph (traced inside a ``pipeline_def``; with RandAugment, one with ``enable_conditionals``)."""
    gpu = device == "gpu"
    decode_dev, op_dev = ("mixed", "gpu") if gpu else ("cpu", "cpu")
    dec_kw = decoder_options(gpu, training_random)
    jpegs, label = read_fed_files(feed)
    crop, interp = t.crop_size, _INTERP[t.interpolation]
    layout = "CHW" if data_format == "NCHW" else "HWC"
    mirror = 0
    if training_random:
        images = fn.decoders.image_random_crop(jpegs, device=decode_dev, output_type=types.RGB,
                                               random_area=list(t.scale), random_aspect_ratio=list(t.ratio),
                                               num_attempts=10, **dec_kw)
        images = fn.resize(images, device=op_dev, resize_x=crop, resize_y=crop, interp_type=interp)
        if t.hflip > 0:
            mirror = fn.random.coin_flip(probability=t.hflip)
        if t.randaugment:  # timm's order: flip, then RandAugment on the uint8 crop
            images = fn.flip(images, horizontal=mirror) if t.hflip > 0 else images
            mirror = 0
            spec = parse_rand_augment(t.randaugment)
            images = rand_augment(images, spec, rand_augment_ops(spec), crop, rand_augment_fill(t.mean))[0]
    elif crop <= t.resize_short:
        # resize-shorter(S) + centre-crop(C) == centre square of side short*C/S, resized to C.
        shape = fn.peek_image_shape(jpegs, dtype=types.FLOAT, **STORED_ORIENTATION)
        side = dmath.min(shape[0], shape[1]) * (crop / float(t.resize_short))
        images = fn.decoders.image_crop(jpegs, device=decode_dev, output_type=types.RGB, crop_w=side,
                                        crop_h=side, **dec_kw)
        images = fn.resize(images, device=op_dev, resize_x=crop, resize_y=crop, interp_type=interp)
    else:
        images = fn.decoders.image(jpegs, device=decode_dev, output_type=types.RGB, **dec_kw)
        images = fn.resize(images, device=op_dev, resize_shorter=t.resize_short, interp_type=interp)
    erasing = training_random and t.random_erasing > 0
    images = fn.crop_mirror_normalize(
        images, device=op_dev, dtype=types.FLOAT if erasing else _DTYPE[output_dtype], output_layout=layout,
        crop=(crop, crop), mean=list(t.mean), std=list(t.std), mirror=mirror, out_of_bounds_policy="pad")
    if erasing:  # timm: on the normalised image
        images = erase_random_box(images, t.random_erasing, t.random_erasing_mode, crop, layout)
        images = fn.cast(images, dtype=_DTYPE[output_dtype])
    if gpu:
        label = label.gpu()
    return images, label


class DaliLoader(FedDaliLoader):
    """``(images, labels)`` paddle tensors from a DALI pipeline, one epoch per ``iter()``.

    Same interface as ``ImageFolderLoader``: ``len()`` (batches of this rank),
    ``set_epoch``, ``num_images`` (images in the split), ``classes``, ``skipped_files``;
    and ``state_dict``/``set_state_dict`` (``dali_feed.ResumableRandomState``).
    """

    def __init__(self, cfg, split: str, rank: int = 0, world_size: int = 1, batch_size=None, classes=None):
        data = cfg.data
        self.cfg, self.world_size = cfg, world_size
        self.transforms = data.transforms
        self.data_format = cfg.model.data_format
        training = split == "train"
        self.split_dir = os.path.join(data.root, data.train_split if training else data.val_split)
        check_device(data.dali.device)
        found, samples = scan_image_folder(self.split_dir)
        if classes is not None:
            check_same_classes(self.split_dir, found, classes, "the training split's")
        if not training:
            require_images_in_every_class(self.split_dir, found, samples)
        self.classes = found
        self.files = [path for path, _ in samples]
        labels = [label for _, label in samples]
        batch_size = batch_size or data.batch_size
        sampler = split_batch_sampler(training, len(samples), batch_size, rank, world_size, cfg.global_.seed,
                                      shuffle=True, source=self.split_dir, last_batch=data.last_batch)
        self._setup(cfg, training, self.files, labels, sampler, self.split_dir, batch_size, rank)
        self.draws_randomly = training and self.transforms.random
        self.conditionals = self.draws_randomly and bool(self.transforms.randaugment)  # DALI's op selection

    @property
    def num_images(self) -> int:
        return len(self.files)

    def _graph(self):
        # data.dali.output_dtype is the training batches' dtype: evaluation runs the float32 weights a
        # checkpoint holds, without autocast, so validation batches stay float32.
        dtype = self.dali_cfg.output_dtype if self.training else "float32"
        return _graph(self._feed, self.transforms, self.dali_device, self.data_format, self.draws_randomly, dtype)

    def _batch(self, outputs):
        images, labels = outputs
        labels = to_paddle(labels, self.device).reshape([-1])
        return (to_paddle(images, self.device), labels), int(labels.shape[0])


def build_dali_loader(cfg, split: str, rank: int = 0, world_size: int = 1, batch_size=None, classes=None):
    """A ``DaliLoader`` for ``split`` ("train" or "val") of ``cfg.data``."""
    return DaliLoader(cfg, split, rank, world_size, batch_size=batch_size, classes=classes)
