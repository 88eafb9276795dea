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


def local_world_size() -> int:
    """Processes of this job on this machine (the launcher's ``PADDLE_LOCAL_SIZE``)."""
    return int(os.environ.get("PADDLE_LOCAL_SIZE", world_size() if world_size() > 1 else 1))


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def configure_cpu_threads(cfg) -> int:
    """Resolve ``global.cpu_threads`` (null = this machine's usable cores shared by the local
    processes) and apply it. Paddle's own default is 1 math thread, which left half of a 2-core
    machine idle and made ResNet50 training 1.6x slower (issue 9). The resolved value is written
    back into the config so that the run's saved config.yaml records it."""
    threads = cfg.global_.cpu_threads or max(1, usable_cores() // max(1, local_world_size()))
    cfg.global_.cpu_threads = threads
    paddle.base.core.set_num_threads(threads)
    return threads
