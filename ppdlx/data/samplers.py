"""Rank-aware batch samplers.

Train: a permutation seeded by (seed, epoch), padded to a multiple of the world
size, each rank takes a strided share, full batches only: the last partial batch of a rank's share
is dropped, or (``fill_last``, as NVIDIA's DALI iterator does) completed with the first samples of
that share, so every sample is seen and the epoch has ``ceil(share / batch)`` steps.
Eval: each rank takes a disjoint strided share with no padding, so that merged
counts see every image exactly once.
"""
from __future__ import annotations

import math

import numpy as np


class TrainBatchSampler:
    def __init__(self, num_samples, batch_size, rank=0, world_size=1, seed=0, shuffle=True, fill_last=False):
        self.num_samples, self.batch_size = num_samples, batch_size
        self.rank, self.world_size = rank, world_size
        self.seed, self.shuffle, self.fill_last = seed, shuffle, fill_last
        self.epoch = 0
        self.per_rank = math.ceil(num_samples / world_size)

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        if self.shuffle:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(self.num_samples)
        else:
            order = np.arange(self.num_samples)
        pad = self.per_rank * self.world_size - self.num_samples
        if pad:
            order = np.concatenate([order, order[:pad]])
        mine = order[self.rank::self.world_size]
        short = (-len(mine)) % self.batch_size
        if self.fill_last and short:
            mine = np.concatenate([mine, np.resize(mine, short)])  # np.resize repeats from the start
        for start in range(0, len(mine) - len(mine) % self.batch_size, self.batch_size):
            yield mine[start:start + self.batch_size].tolist()

    def __len__(self):
        return math.ceil(self.per_rank / self.batch_size) if self.fill_last else self.per_rank // self.batch_size


class EvalBatchSampler:
    def __init__(self, num_samples, batch_size, rank=0, world_size=1):
        self.indices = list(range(rank, num_samples, world_size))
        self.batch_size = batch_size

    def set_epoch(self, epoch):
        pass

    def __iter__(self):
        for start in range(0, len(self.indices), self.batch_size):
            yield self.indices[start:start + self.batch_size]

    def __len__(self):
        return math.ceil(len(self.indices) / self.batch_size)
