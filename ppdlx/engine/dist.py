"""Thin helpers over ``paddle.distributed`` (the launcher sets the env; we never spawn)."""
from __future__ import annotations

import os

import paddle
import paddle.distributed as dist


def world_size() -> int:
    return int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))


def rank() -> int:
    return int(os.environ.get("PADDLE_TRAINER_ID", "0"))


def init() -> tuple:
    """Initialise collective data parallel when launched with several processes."""
    if world_size() > 1 and not dist.is_initialized():
        dist.init_parallel_env()
    return rank(), world_size()


def all_reduce_sum(values):
    """Sum a list of Python numbers over ranks (float64 to keep counts exact)."""
    if world_size() <= 1:
        return list(values)
    t = paddle.to_tensor([float(v) for v in values], dtype="float64")
    dist.all_reduce(t)
    return t.numpy().tolist()


def barrier():
    if world_size() > 1:
        dist.barrier()
