"""``data.last_batch``: NVIDIA's DALI iterator fills each rank's last partial batch, ppdlx used to drop it."""
import numpy as np

from ppdlx.config import load_config
from ppdlx.data.loader_common import split_batch_sampler
from ppdlx.data.samplers import TrainBatchSampler

IMAGENET_TRAIN = 1281167


def test_the_resnet50_recipe_takes_nvidias_626_steps_per_epoch_at_8_x_256():
    cfg = load_config("configs/rn50_amp.yaml")
    assert cfg.data.last_batch == "fill" and cfg.data.batch_size == 256
    steps = [len(split_batch_sampler(True, IMAGENET_TRAIN, 256, rank, 8, 42, True, "imagenet", cfg.data.last_batch))
             for rank in range(8)]
    assert steps == [626] * 8
    assert len(TrainBatchSampler(IMAGENET_TRAIN, 256, 0, 8)) == 625  # drop: the last 145 images of a rank's share


def test_a_filled_epoch_sees_every_sample_in_full_batches():
    for rank in range(3):
        sampler = TrainBatchSampler(100, 16, rank, 3, seed=5, fill_last=True)
        sampler.set_epoch(2)
        batches = list(sampler)
        share = np.random.default_rng([5, 2]).permutation(100)
        share = np.concatenate([share, share[:2]])[rank::3]  # padded to 102, 34 per rank
        assert len(batches) == len(sampler) == 3 and all(len(b) == 16 for b in batches)
        flat = [i for b in batches for i in b]
        assert flat[:34] == share.tolist() and flat[34:] == share[:14].tolist()  # filled from the share's start
