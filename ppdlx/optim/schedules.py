"""LR schedules (registered in ``LR_SCHEDULES``), stepped once per optimizer step (not per epoch),
so warm-up and decay are smooth and resume restores them exactly from ``last_epoch``."""
from __future__ import annotations

import paddle

from ppdlx.registry import LR_SCHEDULES


def scaled_lr(cfg, global_batch: int) -> float:
    lr = cfg.lr
    return lr.base_lr * (global_batch / lr.base_batch if lr.scale_with_batch else 1.0)


def global_batch_record(cfg, world_size: int) -> dict:
    """What a checkpoint records of the global batch it was trained with, and the peak learning rate that follows."""
    batch = cfg.data.batch_size * world_size * cfg.train.accumulate
    return {"batch_size": cfg.data.batch_size, "ranks": world_size, "accumulate": cfg.train.accumulate,
            "global": batch, "peak_lr": scaled_lr(cfg, batch)}


def _describe_batch(record: dict) -> str:
    ranks = record["ranks"]
    return (f"global batch {record['global']} ({record['batch_size']} x {ranks} rank{'s' if ranks != 1 else ''} x "
            f"{record['accumulate']} accumulate), peak lr {record['peak_lr']:.4g}")


def batch_change_line(saved, now: dict, shown: str):
    """One line when a resumed run trains at another global batch than its checkpoint (``saved``, None for a
    checkpoint that records none): what each used and how the learning rate changes; None when nothing did."""
    if not saved or (saved.get("global"), saved.get("peak_lr")) == (now["global"], now["peak_lr"]):
        return None
    ratio = now["peak_lr"] / saved["peak_lr"] if saved.get("peak_lr") else float("nan")
    lr = f"the learning rate schedule goes on at {ratio:.3g}x the checkpoint's" if ratio != 1 else \
        "the learning rate schedule is unchanged (lr.scale_with_batch=false)"
    return (f"{shown} was trained with {_describe_batch(saved)}; this run uses {_describe_batch(now)}: {lr}, and "
            f"the schedule continues from the same fraction of the training (its step count is carried over); "
            f"resume with the checkpoint's data.batch_size / train.accumulate / ranks to keep its recipe")


def _with_warmup(schedule, peak_lr, warmup_steps, start_lr):
    if warmup_steps <= 0:
        return schedule
    return paddle.optimizer.lr.LinearWarmup(schedule, warmup_steps, start_lr, peak_lr)


@LR_SCHEDULES.register("cosine")
def cosine(peak_lr, total_steps, warmup_steps, cfg):
    decay_steps = max(1, total_steps - warmup_steps)
    sched = paddle.optimizer.lr.CosineAnnealingDecay(peak_lr, decay_steps, eta_min=cfg.lr.min_lr)
    return _with_warmup(sched, peak_lr, warmup_steps, cfg.lr.warmup_start_lr)


@LR_SCHEDULES.register("step")
def step_decay(peak_lr, total_steps, warmup_steps, cfg, steps_per_epoch=1):
    """timm's StepLRScheduler, per step: after warm-up ``peak * decay_rate ** floor(step / period)``,
    ``period = decay_epochs * steps_per_epoch``, counted from step 0 as timm's ``epoch // decay_t``
    (warm-up included: after 3 warm-up epochs with decay 2.4 the lr is already ``peak * rate``)."""
    period = max(1.0, cfg.lr.decay_epochs * steps_per_epoch)
    rate = cfg.lr.decay_rate
    sched = paddle.optimizer.lr.LambdaDecay(peak_lr, lambda s: rate ** int((s + warmup_steps) / period + 1e-9))
    return _with_warmup(sched, peak_lr, warmup_steps, cfg.lr.warmup_start_lr)


@LR_SCHEDULES.register("constant")
def constant(peak_lr, total_steps, warmup_steps, cfg):
    sched = paddle.optimizer.lr.LambdaDecay(peak_lr, lambda _: 1.0)
    return _with_warmup(sched, peak_lr, warmup_steps, cfg.lr.warmup_start_lr)


def build_lr_schedule(cfg, global_batch: int, steps_per_epoch: int):
    total = cfg.train.epochs * steps_per_epoch
    warmup = int(round(cfg.lr.warmup_epochs * steps_per_epoch))
    kwargs = dict(peak_lr=scaled_lr(cfg, global_batch), total_steps=total, warmup_steps=min(warmup, total), cfg=cfg)
    if cfg.lr.name == "step":
        kwargs["steps_per_epoch"] = steps_per_epoch
    return LR_SCHEDULES.build(cfg.lr.name, **kwargs)
