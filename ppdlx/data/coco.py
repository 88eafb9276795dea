"""COCO detection input (``data.dataset: coco``): ``build_coco_loader`` picks the backend.

The pieces live by concern and are re-exported here, where the engine, tools and tests import
them: annotations and their validation (``coco_index``), the window/box geometry both backends
share (``coco_geometry``), the paddle.io dataset and loader (``coco_dataset``) and the DALI
pipeline (``dali_coco``, imported only for ``data.backend: dali``). Both loaders yield
``(images [N,3,S,S] float32, gt_boxes [N,max,4] yxyx, gt_classes [N,max] int64 (-1 pad),
image_ids [N] int64, image_scales [N] float32)`` and expose ``classes``, ``cat_ids``, ``coco_gt``
and ``image_size``.
"""
from __future__ import annotations

from ppdlx.data.coco_dataset import CocoDetection, CocoLoader, build_coco_dataset, eval_image
from ppdlx.data.coco_geometry import eval_size, pad_targets, report_capped_boxes, train_window, transform_boxes
from ppdlx.data.coco_index import CocoIndex, coco_from_dict, coco_paths, load_coco_api, shared_index, sharing_indexes
from ppdlx.data.loader_common import dali_required, split_batch_sampler
from ppdlx.errors import ConfigError

__all__ = ["CocoDetection", "CocoIndex", "CocoLoader", "build_coco_dataset", "build_coco_loader", "coco_from_dict",
           "coco_paths", "eval_image", "eval_size", "load_coco_api", "pad_targets", "shared_index", "sharing_indexes",
           "train_window", "transform_boxes"]


def build_coco_loader(cfg, split: str, rank: int = 0, world_size: int = 1, batch_size=None, cat_ids=None,
                      targets=None):
    """Detection loader for ``split`` ("train" or "val"): paddle.io, or DALI with ``data.backend: dali``.
    Training batches are full and shuffled per epoch; val shards are disjoint (every image once). ``targets``:
    a host target assigner whose outputs each batch carries after its image scales."""
    data = cfg.data
    batch_size = batch_size or data.batch_size
    if data.backend == "dali":
        with dali_required():
            from ppdlx.data.dali_coco import build_dali_coco_loader  # the DALI backend: optional (nvidia-dali)
        loader = build_dali_coco_loader(cfg, split, rank, world_size, batch_size=batch_size, cat_ids=cat_ids,
                                        targets=targets)
    elif data.backend == "paddle":
        dataset = build_coco_dataset(cfg, split, cat_ids)
        sampler = split_batch_sampler(split == "train", len(dataset), batch_size, rank, world_size, cfg.global_.seed,
                                      shuffle=data.transforms.random, source=dataset.index.json_path,
                                      last_batch=data.last_batch)
        loader = CocoLoader(dataset, sampler, data.workers, targets)
    else:
        raise ConfigError(f"data.backend={data.backend}: detection (data.dataset=coco) supports paddle or dali; "
                          f"for synthetic detection data run tools/make_synthetic_coco.py")
    if split == "train" and rank == 0:
        report_capped_boxes(loader.index, data.coco.max_instances, data.coco.skip_crowd)
    return loader
