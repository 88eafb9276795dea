"""NVIDIA DALI COCO detection pipeline (``data.dataset: coco``, ``data.backend: dali``), CPU and GPU.

Same output contract, sample order, sharding and augmentations as the paddle.io path
(``ppdlx.data.coco_dataset``): ``(images [N,3,S,S] float32, gt_boxes [N,max,4] yxyx, gt_classes [N,max]
int64 (-1 pad), image_ids [N] int64, image_scales [N] float32)``.

* Annotations are validated by ``CocoIndex`` (same report / ``data.coco.invalid`` switch as
  paddle.io); the kept images and valid annotations, without segmentations, are written to a
  temporary json that ``fn.readers.coco`` reads (``ltrb=True, ratio=True``,
  ``avoid_class_remapping=True``: raw category ids, mapped to 0-based classes on the host;
  ``include_iscrowd=False`` in training when ``skip_crowd``; ``image_ids=True``).
* Order: the reader gets this rank's file list for the epoch (``images=``) from
  ``TrainBatchSampler`` / ``EvalBatchSampler``, so both backends read the same samples; the
  pipeline is rebuilt per training epoch (seeded from (seed, rank, epoch)). Val pads its last
  batch (``pad_last_batch``) and the loader trims the repeats: every image counted once.
* Graph: ``peek_image_shape`` -> decode (``cpu``, or ``mixed`` nvJPEG on GPU) -> train:
  ``random.coin_flip`` + ``flip`` of the image and ``bb_flip`` of the boxes (bbox-aware flip),
  scale factor ``r ~ U(scale_range)``, integer scaled size and crop offset computed exactly as
  ``coco_geometry.train_window``; eval: longer side to S (``coco_geometry.eval_size``) -> ``resize`` of
  only the window that survives the crop (``roi_start``/``roi_end``) -> ``crop_mirror_normalize`` with
  mean/std, CHW/HWC, padded bottom/right with 0 (after normalisation) to S x S.
  Boxes leave the pipeline normalised (plus the per-sample scaled size / offset); the host scales,
  shifts, clips, drops empty boxes and pads to ``max_instances`` (``coco_geometry.transform_boxes`` /
  ``pad_targets``).
* Hand-over: both devices run the pipeline directly; images go through
  ``dali_handover.to_paddle`` (zero-copy DLPack, on paddle's current stream for GPU buffers) to
  paddle's device, the small box/id/scale outputs are always CPU and are read as numpy. Only the
  decode/resize/normalise device differs between ``data.dali.device: cpu`` and ``gpu``; on a
  Paddle build without CUDA, ``gpu`` is one ``UnsupportedError`` line.
"""
from __future__ import annotations

import atexit
import json
import math
import os
import shutil
import tempfile

import nvidia.dali as dali
import nvidia.dali.fn as fn
import nvidia.dali.math as dmath
import nvidia.dali.types as types
import numpy as np
import paddle

from ppdlx.config.preprocess import require_detection_resolved
from ppdlx.data.coco_geometry import pad_targets, transform_boxes
from ppdlx.data.coco_index import CocoIndex, IndexedByCoco, coco_paths, shared_index
from ppdlx.data.dali_handover import check_device, dali_device_id, to_paddle
from ppdlx.data.loader_common import split_batch_sampler
from ppdlx.errors import DataError

_INTERP = {"bilinear": types.INTERP_LINEAR, "bicubic": types.INTERP_CUBIC}


def write_reader_json(index: CocoIndex, path: str) -> None:
    """The validated annotations as a plain COCO json for ``fn.readers.coco`` (no segmentations)."""
    ds = index.gt_dataset
    anns = [{k: a[k] for k in ("id", "image_id", "category_id", "bbox", "iscrowd", "area") if k in a}
            for a in ds["annotations"]]
    for a in anns:
        a.setdefault("iscrowd", 0)
        a.setdefault("area", float(a["bbox"][2] * a["bbox"][3]))
    images = [{k: im[k] for k in ("id", "file_name", "width", "height")} for im in ds["images"]]
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"images": images, "annotations": anns, "categories": ds["categories"]}, f)


def _graph(image_dir, json_path, files, size, mean, std, training_random, include_crowd, hflip, scale_range,
           interpolation, data_format, device):
    gpu = device == "gpu"
    decode_dev, op_dev = ("mixed", "gpu") if gpu else ("cpu", "cpu")
    jpegs, bboxes, labels, ids = fn.readers.coco(
        file_root=image_dir, annotations_file=json_path, images=files, ltrb=True, ratio=True, image_ids=True,
        include_iscrowd=include_crowd, avoid_class_remapping=True, skip_empty=False, size_threshold=0.0,
        random_shuffle=False, pad_last_batch=True, name="Reader")
    shape = fn.peek_image_shape(jpegs, dtype=types.FLOAT)
    h, w = shape[0], shape[1]
    images = fn.decoders.image(jpegs, device=decode_dev, output_type=types.RGB)
    s = float(size)
    if training_random:
        if hflip > 0:
            flip = fn.random.coin_flip(probability=hflip, dtype=types.INT32)
            images = fn.flip(images, device=op_dev, horizontal=flip)
            bboxes = fn.bb_flip(bboxes, ltrb=True, horizontal=flip)
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
    params = fn.stack(sw, sh, ox, oy, inv_scale)
    return images, bboxes, labels, ids, params


class DaliCocoLoader(IndexedByCoco):
    """Detection batches from a DALI pipeline, one epoch per ``iter()``; same interface as ``CocoLoader``."""

    def __init__(self, cfg, split: str, rank: int = 0, world_size: int = 1, batch_size=None, cat_ids=None):
        require_detection_resolved(cfg)
        data = cfg.data
        self.dali_cfg, self.transforms, self.coco_cfg = data.dali, data.transforms, data.coco
        check_device(self.dali_cfg.device)
        self.data_format = cfg.model.data_format
        self.batch_size = batch_size or data.batch_size
        self.training = split == "train"
        self.rank, self.seed = rank, cfg.global_.seed
        json_path, self.image_dir = coco_paths(cfg, split)
        self.index = shared_index(json_path, self.image_dir, self.coco_cfg.invalid, cat_ids)
        self.label_of = {cid: i for i, cid in enumerate(self.index.cat_ids)}
        self._tmp = tempfile.mkdtemp(prefix="ppdlx_dali_coco_")
        atexit.register(shutil.rmtree, self._tmp, True)
        self.reader_json = os.path.join(self._tmp, f"{split}.json")
        write_reader_json(self.index, self.reader_json)
        self.sampler = split_batch_sampler(self.training, len(self.index.records), self.batch_size, rank, world_size,
                                           self.seed, shuffle=self.transforms.random, source=json_path)
        self.epoch = 0
        self.skipped_files: list = []
        self._pipe = None
        self.device = paddle.get_device()  # where images go: paddle's device, whatever DALI runs on

    # ------------------------------------------------------------ interface
    @property
    def num_images(self):
        return len(self.index.records)

    @property
    def image_size(self):
        return self.coco_cfg.image_size

    def __len__(self):
        return len(self.sampler)

    # ------------------------------------------------------------ pipeline
    def _order(self):
        self.sampler.set_epoch(self.epoch)
        return [i for batch in self.sampler for i in batch]

    def _build(self, order):
        c, t, cc = self.dali_cfg, self.transforms, self.coco_cfg
        files = [self.index.records[i]["file"] for i in order]
        seed = (self.seed * 1_000_003 + self.rank * 7_919 + self.epoch * 104_729) % (2 ** 31 - 1)

        def graph():
            return _graph(self.image_dir, self.reader_json, files, cc.image_size, t.mean, t.std,
                          self.training and t.random, not (self.training and cc.skip_crowd), t.hflip,
                          cc.scale_range, t.interpolation, self.data_format, c.device)

        pipe = dali.pipeline_def(graph)(batch_size=self.batch_size, num_threads=c.num_threads,
                                        device_id=dali_device_id(c.device), seed=seed,
                                        prefetch_queue_depth=c.prefetch_queue_depth, exec_dynamic=True)
        try:
            pipe.build()
        except RuntimeError as err:
            raise DataError(f"{self.index.json_path}: DALI could not build the COCO reader: "
                            f"{str(err).strip().splitlines()[0][:300]}") from None
        return pipe

    def _targets(self, bboxes, labels, params, count):
        s, m = self.coco_cfg.image_size, self.coco_cfg.max_instances
        boxes_out = np.zeros((count, m, 4), np.float32)
        classes_out = np.full((count, m), -1, np.int64)
        for i in range(count):
            sw, sh, ox, oy = (float(v) for v in params[i][:4])
            b = np.asarray(bboxes.at(i), np.float32).reshape(-1, 4)
            lab = np.asarray(labels.at(i)).reshape(-1)
            b, keep = transform_boxes(b, sw, sh, ox, oy, s)  # ratio=True boxes: the scaled size is the factor
            cls = np.asarray([self.label_of.get(int(v), -1) for v in lab], np.int64)
            keep &= cls >= 0
            boxes_out[i], classes_out[i] = pad_targets(b[keep], cls[keep], m)
        return boxes_out, classes_out

    def __iter__(self):
        order = self._order()
        if not order:
            return
        bs = self.batch_size
        batches = len(self) if self.training else math.ceil(len(order) / bs)
        if self._pipe is not None and self._pipe[1] == order:
            pipe = self._pipe[0]
        else:
            pipe = self._build(order)
        self._pipe = None
        position = 0
        for _ in range(batches):
            try:
                images, bboxes, labels, ids, params = pipe.run()
            except RuntimeError as err:
                raise DataError(f"{self.index.json_path}: DALI pipeline failed at batch {position // bs + 1} of "
                                f"epoch {self.epoch + 1}: {str(err).strip().splitlines()[0][:300]}") from None
            count = min(bs, len(order) - position)
            params = np.asarray(params.as_array(), np.float32)
            gt_boxes, gt_classes = self._targets(bboxes, labels, params, count)
            image_ids = np.asarray(ids.as_array()).reshape(-1)[:count].astype(np.int64)
            images = to_paddle(images, self.device)
            if count < bs:
                images = images[:count]
            position += count
            yield (images, paddle.to_tensor(gt_boxes), paddle.to_tensor(gt_classes), paddle.to_tensor(image_ids),
                   paddle.to_tensor(params[:count, 4].copy()))
        # The reader pads its last batch, so after a whole pass it is back at the start: reuse it.
        if position == len(order):
            self._pipe = (pipe, order)


def build_dali_coco_loader(cfg, split: str, rank: int = 0, world_size: int = 1, batch_size=None, cat_ids=None):
    return DaliCocoLoader(cfg, split, rank, world_size, batch_size=batch_size, cat_ids=cat_ids)
