"""NVIDIA DALI COCO detection pipeline (``data.dataset: coco``, ``data.backend: dali``), CPU and GPU.

Same output contract, sample order, sharding and augmentations as the paddle.io path
(``ppdlx.data.coco_dataset``): ``(images [N,3,S,S] float32, gt_boxes [N,max,4] yxyx, gt_classes [N,max]
int64 (-1 pad), image_ids [N] int64, image_scales [N] float32)``.

* Annotations are validated by ``CocoIndex`` (same report / ``data.coco.invalid`` switch as
  paddle.io), and the boxes stay on the host: DALI gets each image's file and record index.
* Order: one pipeline per loader and run, fed this rank's batches of the epoch from
  ``TrainBatchSampler`` / ``EvalBatchSampler`` (``dali_feed``, ``dali_fed_loader``: also how an
  unreadable image is found by name and skipped or refused), so both backends read the same
  samples. Random flips and scales are seeded once, from (seed, rank, first epoch of the run), and
  restored from the checkpoint on resume (``dali_feed.ResumableRandomState``).
  Val's last batch is as short as the split leaves it: every image counted once.
* Graph: ``peek_image_shape`` -> decode (``cpu``, or ``mixed`` nvJPEG on GPU) -> train:
  ``random.coin_flip`` + ``flip`` of the image, scale factor ``r ~ U(scale_range)``, integer
  scaled size and crop offset computed exactly as ``coco_geometry.train_window``; eval: longer
  side to S (``coco_geometry.eval_size``) -> ``resize`` of only the window that survives the crop
  (``roi_start``/``roi_end``) -> ``crop_mirror_normalize`` with mean/std, CHW/HWC, padded
  bottom/right with 0 (after normalisation) to S x S. The pipeline also returns, per image, the
  flip, the scaled size, the offset and the image size; the host takes the record's boxes (crowd
  left out in training when ``skip_crowd``), mirrors, scales, shifts, clips, drops empty boxes and
  pads to ``max_instances`` with the same ``coco_geometry`` functions as the paddle.io path.
* Hand-over: both devices run the pipeline directly; images go through
  ``dali_handover.to_paddle`` (zero-copy DLPack, on paddle's current stream for GPU buffers) to
  paddle's device; the small per-image outputs are always CPU and are read as numpy, and the host
  arrays of a batch (boxes, classes, ids, scales and, for training, the anchor targets of the task's
  host assigner) reach paddle's device in one copy (``dali_handover.upload_together``). Only the
  decode/resize/normalise device differs between ``data.dali.device: cpu`` and ``gpu``; on a
  Paddle build without CUDA, ``gpu`` is one ``UnsupportedError`` line.
"""
from __future__ import annotations

import nvidia.dali.fn as fn
import nvidia.dali.math as dmath
import nvidia.dali.types as types
import numpy as np

from ppdlx.config.preprocess import require_detection_resolved
from ppdlx.data.coco_geometry import pad_targets, record_boxes, transform_boxes
from ppdlx.data.coco_index import IndexedByCoco, coco_paths, shared_index
from ppdlx.data.dali_fed_loader import FedDaliLoader
from ppdlx.data.dali_feed import STORED_ORIENTATION, decoder_options, read_fed_files
from ppdlx.data.dali_handover import check_device, to_paddle, upload_together
from ppdlx.data.loader_common import split_batch_sampler

_INTERP = {"bilinear": types.INTERP_LINEAR, "bicubic": types.INTERP_CUBIC}


def _graph(feed, size, mean, std, training_random, hflip, scale_range, interpolation, data_format, device):
    gpu = device == "gpu"
    decode_dev, op_dev = ("mixed", "gpu") if gpu else ("cpu", "cpu")
    jpegs, record = read_fed_files(feed)
    shape = fn.peek_image_shape(jpegs, dtype=types.FLOAT, **STORED_ORIENTATION)
    h, w = shape[0], shape[1]
    images = fn.decoders.image(jpegs, device=decode_dev, output_type=types.RGB,
                               **decoder_options(gpu, training_random))
    s = float(size)
    flipped = w * 0.0
    if training_random:
        if hflip > 0:
            flip = fn.random.coin_flip(probability=hflip, dtype=types.INT32)
            images = fn.flip(images, device=op_dev, horizontal=flip)
            flipped = fn.cast(flip, dtype=types.FLOAT)
        r = fn.random.uniform(range=list(scale_range))
        target = dmath.floor(r * s)
        scale = dmath.min(target / h, target / w)
        sw, sh = dmath.max(dmath.floor(w * scale), 1.0), dmath.max(dmath.floor(h * scale), 1.0)
        ox = dmath.floor(dmath.max(sw - s, 0.0) * fn.random.uniform(range=[0.0, 1.0]))
        oy = dmath.floor(dmath.max(sh - s, 0.0) * fn.random.uniform(range=[0.0, 1.0]))
        inv_scale = w / sw
    else:
        scale = dmath.min(s / h, s / w)
        sw, sh = dmath.max(dmath.floor(w * scale + 1e-4), 1.0), dmath.max(dmath.floor(h * scale + 1e-4), 1.0)
        ox = oy = sw * 0.0
        inv_scale = 1.0 / scale
    fx, fy = sw / w, sh / h
    cw, ch = dmath.min(sw - ox, s), dmath.min(sh - oy, s)
    images = fn.resize(images, device=op_dev, resize_x=cw, resize_y=ch,
                       roi_start=fn.stack(oy / fy, ox / fx), roi_end=fn.stack((oy + ch) / fy, (ox + cw) / fx),
                       roi_relative=False, subpixel_scale=False, interp_type=_INTERP[interpolation], antialias=True)
    images = fn.crop_mirror_normalize(
        images, device=op_dev, dtype=types.FLOAT, output_layout="CHW" if data_format == "NCHW" else "HWC",
        crop=(size, size), crop_pos_x=0.0, crop_pos_y=0.0, out_of_bounds_policy="pad", fill_values=[0.0],
        mean=list(mean), std=list(std))
    geometry = fn.stack(sw, sh, ox, oy, inv_scale, flipped, w, h)
    return images, record, geometry


class DaliCocoLoader(FedDaliLoader, IndexedByCoco):
    """Detection batches from a DALI pipeline, one epoch per ``iter()``; same interface as ``CocoLoader``."""

    def __init__(self, cfg, split: str, rank: int = 0, world_size: int = 1, batch_size=None, cat_ids=None,
                 targets=None):
        require_detection_resolved(cfg)
        data = cfg.data
        self.transforms, self.coco_cfg = data.transforms, data.coco
        check_device(data.dali.device)
        self.data_format = cfg.model.data_format
        training = split == "train"
        json_path, self.image_dir = coco_paths(cfg, split)
        self.index = shared_index(json_path, self.image_dir, self.coco_cfg.invalid, cat_ids)
        records = self.index.records
        batch_size = batch_size or data.batch_size
        sampler = split_batch_sampler(training, len(records), batch_size, rank, world_size, cfg.global_.seed,
                                      shuffle=self.transforms.random, source=json_path, last_batch=data.last_batch)
        self._setup(cfg, training, [r["path"] for r in records], range(len(records)), sampler, self.image_dir,
                    batch_size, rank)
        self.draws_randomly = training and self.transforms.random
        self.targets = targets  # a host target assigner: its outputs follow the image scales

    @property
    def num_images(self):
        return len(self.index.records)

    @property
    def image_size(self):
        return self.coco_cfg.image_size

    def _graph(self):
        t, cc = self.transforms, self.coco_cfg
        return _graph(self._feed, cc.image_size, t.mean, t.std, self.draws_randomly, t.hflip, cc.scale_range,
                      t.interpolation, self.data_format, self.dali_device)

    def _targets(self, records, geometry):
        s, m = self.coco_cfg.image_size, self.coco_cfg.max_instances
        skip_crowd = self.training and self.coco_cfg.skip_crowd
        boxes_out = np.zeros((len(records), m, 4), np.float32)
        classes_out = np.full((len(records), m), -1, np.int64)
        for i, (index, (sw, sh, ox, oy, _, flipped, w, h)) in enumerate(zip(records, geometry)):
            rec = self.index.records[index]
            boxes, labels = record_boxes(rec, skip_crowd, float(w) if flipped else None)
            boxes, keep = transform_boxes(boxes.reshape(-1, 4), sw / w, sh / h, ox, oy, s)
            boxes_out[i], classes_out[i] = pad_targets(boxes[keep], labels[keep], m)
        return boxes_out, classes_out

    def _batch(self, outputs):
        images, records, geometry = outputs
        records = np.asarray(records.as_array()).reshape(-1)
        geometry = np.asarray(geometry.as_array(), np.float32)
        gt_boxes, gt_classes = self._targets(records, geometry)
        image_ids = np.asarray([self.index.records[i]["id"] for i in records], np.int64)
        host = (gt_boxes, gt_classes, image_ids, geometry[:, 4])
        if self.targets is not None:
            host += self.targets(gt_boxes, gt_classes)
        tensors, self._staging = upload_together(host, self.device)  # the boxes are host data: one copy for all
        return (to_paddle(images, self.device), *tensors), len(records)


def build_dali_coco_loader(cfg, split: str, rank: int = 0, world_size: int = 1, batch_size=None, cat_ids=None,
                           targets=None):
    return DaliCocoLoader(cfg, split, rank, world_size, batch_size=batch_size, cat_ids=cat_ids, targets=targets)
