"""Classification evaluation: top-1/top-5 over a sharded split, merged over ranks."""
from __future__ import annotations

import time

import paddle

from ppdlx.engine import dist


class ClassificationEvaluator:
    primary = "top1"

    def __init__(self, loader, topk=(1, 5)):
        self.loader = loader
        self.topk = tuple(topk)

    @paddle.no_grad()
    def __call__(self, model) -> dict:
        was_training = model.training
        model.eval()
        start = time.perf_counter()
        correct = [0] * len(self.topk)
        seen = 0
        loss_sum = 0.0
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
        totals = dist.all_reduce_sum(correct + [seen, loss_sum])
        images = int(round(totals[len(self.topk)]))
        if was_training:
            model.train()
        result = {f"top{k}": (totals[i] / images if images else 0.0) for i, k in enumerate(self.topk)}
        result.update(images=images, loss=totals[-1] / max(images, 1), seconds=time.perf_counter() - start)
        return result
