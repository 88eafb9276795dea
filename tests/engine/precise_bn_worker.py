"""A rank of tests/engine/test_distributed.py's precise-BN test, started by ``paddle.distributed.launch``:
``coco_eval.recompute_bn_stats`` over this rank's shard (``EvalBatchSampler``, eval batch 2) of 5 samples,
where rank 0 has 2 batches and rank 1 one, then of 1 sample, where rank 1 has none; writes
``rank<N>.npz`` to OUT_DIR.
usage: precise_bn_worker.py OUT_DIR
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import paddle  # noqa: E402

from ppdlx import dist  # noqa: E402
from ppdlx.data.samplers import EvalBatchSampler  # noqa: E402
from ppdlx.evaluation.precise_bn import recompute_bn_stats  # noqa: E402

SAMPLES = np.stack([np.random.default_rng(i).normal(i, 1 + i, (3, 4, 4)).astype(np.float32) for i in range(5)])


def statistics(samples, rank, world):
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.BatchNorm2D(3))
    loader = [(paddle.to_tensor(samples[b]),) for b in EvalBatchSampler(len(samples), 2, rank, world)]
    used = recompute_bn_stats(model, loader, 8)
    return used, model[0]._mean.numpy()


def main(out):
    dist.init("cpu")
    rank, world = dist.rank(), dist.world_size()
    used, mean = statistics(SAMPLES, rank, world)
    used_one, mean_one = statistics(SAMPLES[:1], rank, world)
    np.savez(os.path.join(out, f"rank{rank}.npz"), used=used, mean=mean, used_one=used_one, mean_one=mean_one)


if __name__ == "__main__":
    main(sys.argv[1])
