"""Precise BatchNorm statistics: the running mean and variance re-estimated from training batches with the
weights being evaluated (the detection evaluator before scoring, and export so that it predicts what the
evaluator scored)."""
from __future__ import annotations

import paddle
import paddle.distributed as pdist
from paddle.nn.layer.norm import _BatchNormBase

from ppdlx import dist


@paddle.no_grad()
def recompute_bn_stats(model, loader, num_batches: int) -> int:
    """"Precise BN": set every BatchNorm's running mean/variance to the average of its batch
    statistics over ``num_batches`` training batches, computed with the current weights (the
    momentum-averaged statistics lag behind fast-changing weights in short runs). Each batch weighs
    by its images, over all ranks: every rank joins the reduction, one whose shard gave no batch
    too, and divides by the images of all ranks, so they all hold the same statistics. Only the
    BatchNorm layers run in training mode, the rest computes as it is evaluated: dropout and drop-path
    off, and a quantization-aware model's activation ranges fixed (its quanters in training mode would
    move them to these batches', and an evaluation would change the model it scores). Returns the
    number of batches this rank used."""
    bns = [layer for layer in model.sublayers(include_self=True)
           if isinstance(layer, _BatchNormBase) and not getattr(layer, "_use_global_stats", False)]
    if not bns or num_batches <= 0:
        return 0
    def statistics():  # read afresh: the layers' buffers, as their forward left them
        return [t for bn in bns for t in (bn._mean, bn._variance)]

    momenta = [bn._momentum for bn in bns]
    sums = [paddle.zeros_like(t) for t in statistics()]
    was_training = model.training
    model.eval()
    used = images = 0
    try:
        for bn in bns:
            bn.train()
            bn._momentum = 0.0  # running stats := this batch's stats
        for batch in loader:
            size = int(batch[0].shape[0])
            model(batch[0])
            for acc, value in zip(sums, statistics()):
                acc.add_(value * size)
            used, images = used + 1, images + size
            if used >= num_batches:
                break
    finally:
        for bn, m in zip(bns, momenta):
            bn._momentum = m
        model.train(was_training)
    flat = paddle.concat([t.reshape([-1]) for t in sums] + [paddle.to_tensor([float(images)], sums[0].dtype)])
    if dist.world_size() > 1:
        pdist.all_reduce(flat)
    total = float(flat[-1])
    if total > 0:
        offset = 0
        for target in statistics():
            target.set_value((flat[offset:offset + target.size] / total).reshape(target.shape))
            offset += target.size
    return used
