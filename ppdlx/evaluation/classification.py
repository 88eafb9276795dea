"""Classification evaluation: top-1/top-5 over a sharded split, merged over ranks.

With ``keep_predictions`` the evaluator also keeps, on rank 0, every image's logits, label and path
(``last_predictions``) for the per-class analysis (``ppdlx.analysis.classification_analysis``).
"""
from __future__ import annotations

import time

import numpy as np
import paddle
import paddle.distributed as pdist

from ppdlx import dist


def evaluated_paths(loader) -> list | None:
    """The image paths of this rank's pass, in the order the loader yielded them, without the files it skipped
    as unreadable (both loaders read a val shard in sampler order and only leave out skipped files);
    None for data without files (synthetic)."""
    sampler = getattr(loader, "batch_sampler", None) or getattr(loader, "sampler", None)
    if getattr(loader, "files", None) is not None:
        files = loader.files
    elif getattr(getattr(loader, "dataset", None), "samples", None) is not None:
        files = [path for path, _ in loader.dataset.samples]
    else:
        return None
    skipped = set(getattr(loader, "skipped_files", ()))
    return [files[i] for batch in sampler for i in batch if files[i] not in skipped]


def _gathered(parts: list) -> list:
    """Every rank's ``parts`` concatenated in rank order (this rank's alone on one process)."""
    if dist.world_size() <= 1:
        return [parts]
    out = []
    pdist.all_gather_object(out, parts)
    return out


class ClassificationEvaluator:
    primary = "top1"

    def __init__(self, loader, topk=(1, 5), keep_predictions: bool = False):
        self.loader = loader
        self.topk = tuple(topk)
        self.keep_predictions = keep_predictions
        self.last_predictions = None  # rank 0, with keep_predictions: {"labels", "logits", "paths"}

    @paddle.no_grad()
    def __call__(self, model) -> dict:
        was_training = model.training
        model.eval()
        start = time.perf_counter()
        correct = [0] * len(self.topk)
        seen = 0
        loss_sum = 0.0
        kept_logits, kept_labels = [], []
        for images, labels in self.loader:
            logits = model(images).astype("float32")
            labels = labels.reshape([-1])
            loss_sum += float(paddle.nn.functional.cross_entropy(logits, labels, reduction="sum"))
            k_max = min(max(self.topk), logits.shape[-1])
            top = paddle.topk(logits, k_max, axis=-1)[1]
            hits = (top == labels.unsqueeze(-1)).astype("int64")
            for i, k in enumerate(self.topk):
                correct[i] += int(hits[:, :min(k, k_max)].sum())
            seen += int(labels.shape[0])
            if self.keep_predictions:
                kept_logits.append(logits.numpy())
                kept_labels.append(labels.numpy())
        totals = dist.all_reduce_sum(correct + [seen, loss_sum])
        images = int(round(totals[len(self.topk)]))
        if was_training:
            model.train()
        if self.keep_predictions:
            self._keep(kept_logits, kept_labels)
        result = {f"top{k}": (totals[i] / images if images else 0.0) for i, k in enumerate(self.topk)}
        result.update(images=images, loss=totals[-1] / max(images, 1), seconds=time.perf_counter() - start)
        return result

    def _keep(self, logits: list, labels: list) -> None:
        logits = np.concatenate(logits) if logits else np.zeros((0, 0), np.float32)
        labels = np.concatenate(labels) if labels else np.zeros((0,), np.int64)
        paths = evaluated_paths(self.loader)
        if paths is not None and len(paths) != len(labels):
            paths = None  # not aligned (should not happen): keep the numbers, drop the names
        shards = _gathered([labels, logits, paths])
        if dist.rank() != 0:
            return
        all_paths = None if any(p is None for _, _, p in shards) else [x for _, _, p in shards for x in p]
        self.last_predictions = {"labels": np.concatenate([s[0] for s in shards]),
                                 "logits": np.concatenate([s[1] for s in shards]), "paths": all_paths}
