"""The dynamic-graph training loop: a short explicit loop with hooks.

Hooks are plain objects; any of these methods is called if present:
``before_train(trainer)``, ``after_optimizer_step(trainer)`` (before the EMA
update, e.g. to re-apply sparsity masks), ``after_epoch(trainer, metrics)``,
``state_dict()`` / ``set_state_dict(state)`` (saved in ``.pdstates`` under the
hook's ``name``).
"""
from __future__ import annotations

import logging
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional

import paddle

from ppdlx.engine import checkpoint as ckpt
from ppdlx.engine import dist
from ppdlx.engine.amp import AmpPlan, autocast, evaluated_in_float32, float32_state, set_state_cast
from ppdlx.engine.logger import MetricLogger, format_eta
from ppdlx.errors import PpdlxError

log = logging.getLogger("ppdlx.train")


class NonFiniteLossError(PpdlxError):
    exit_code = 4


@dataclass
class Trainer:
    model: Any                      # the Layer being trained (possibly DataParallel-wrapped)
    raw_model: Any                  # the unwrapped Layer: checkpoints and EMA use its names
    optimizer: Any
    lr_schedule: Any
    objective: Callable
    train_loader: Any
    evaluator: Optional[Callable]
    output_dir: str
    epochs: int
    amp: AmpPlan
    scaler: Any = None
    ema: Any = None
    eval_with_ema: bool = True
    accumulate: int = 1
    steps_per_epoch: Optional[int] = None
    log_interval: int = 10
    max_nonfinite_steps: int = 10
    eval_interval: int = 1
    save_interval: int = 1
    keep_epoch_checkpoints: bool = True
    hooks: List[Any] = field(default_factory=list)
    rank: int = 0
    world_size: int = 1
    # state
    epoch: int = 0
    global_step: int = 0
    best_metric: float = -math.inf
    last_metrics: dict = field(default_factory=dict)

    def __post_init__(self):
        self.logger = MetricLogger(self.output_dir, self.rank)
        self._nonfinite_run = 0
        self._skipped_steps = 0
        # With a loss scaler the finite check stays on the device until the next log line: (current run
        # of non-finite steps, longest run since the last read, steps skipped since the last read)
        self._nonfinite_on_device = None

    # ----------------------------------------------------------------- helpers
    def _call_hooks(self, method, *args):
        for hook in self.hooks:
            fn = getattr(hook, method, None)
            if fn is not None:
                fn(self, *args)

    def optimizer_steps_per_epoch(self) -> int:
        steps = len(self.train_loader) // self.accumulate
        if self.steps_per_epoch:
            steps = min(steps, self.steps_per_epoch)
        return max(steps, 1)

    def _states(self) -> dict:
        states = {"epoch": self.epoch, "global_step": self.global_step, "best_metric": self.best_metric,
                  "lr_schedule": self.lr_schedule.state_dict(), "rng": ckpt.capture_rng(),
                  "last_metrics": self.last_metrics}
        if self.scaler is not None:
            states["scaler"] = self.scaler.state_dict()
        if self.ema is not None:
            states["ema"] = self.ema.state_dict()
        for hook in self.hooks:
            if hasattr(hook, "state_dict"):
                states[f"hook:{hook.name}"] = hook.state_dict()
        return states

    def save(self, improved: bool) -> None:
        if self.rank != 0:
            return
        latest = os.path.join(self.output_dir, "latest")
        ckpt.save_checkpoint(latest, float32_state(self.raw_model, self.optimizer), self.optimizer.state_dict(),
                             self._states())
        copies = []
        if improved:
            copies.append("best")
        if self.keep_epoch_checkpoints and (self.epoch % self.save_interval == 0 or self.epoch == self.epochs):
            copies.append(f"epoch_{self.epoch}")
        for name in copies:
            target = os.path.join(self.output_dir, name)
            for suffix in ckpt.SUFFIXES:  # .pdstates last: marks the copy complete
                tmp = f"{target}{suffix}.tmp.{os.getpid()}"
                shutil.copyfile(latest + suffix, tmp)
                os.replace(tmp, target + suffix)

    def resume(self, prefix: str) -> None:
        model_state, opt_state, states = ckpt.load_checkpoint(prefix)
        set_state_cast(self.raw_model, model_state)  # float32 on disk; O2 parameters are fp16
        if opt_state is not None:
            self.optimizer.set_state_dict(opt_state)
        self.epoch = int(states["epoch"])
        self.global_step = int(states["global_step"])
        self.best_metric = float(states["best_metric"])
        self.last_metrics = states.get("last_metrics", {})
        self.lr_schedule.set_state_dict(states["lr_schedule"])
        if self.scaler is not None and "scaler" in states:
            self.scaler.load_state_dict(states["scaler"])
        if self.ema is not None and "ema" in states:
            self.ema.set_state_dict(states["ema"])
        for hook in self.hooks:
            key = f"hook:{getattr(hook, 'name', '')}"
            if hasattr(hook, "set_state_dict") and key in states:
                hook.set_state_dict(states[key])
        ckpt.restore_rng(states["rng"])
        log.info("resumed from %s at epoch %d (step %d)", prefix, self.epoch, self.global_step)

    # ------------------------------------------------------------------- steps
    def _backward(self, loss):
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()

    def _optimizer_step(self):
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.clear_grad(set_to_zero=False)
        self.lr_schedule.step()
        self.global_step += 1
        self._call_hooks("after_optimizer_step")
        if self.ema is not None:
            self.ema.update(self.raw_model, self.optimizer)

    def _window_finite(self, flag):
        """All ranks' verdict on this window's losses (a device tensor): every rank skips or applies
        the same steps, and a persistent NaN stops them all at the same step."""
        if self.world_size > 1:
            flag = flag.astype("int32")
            dist.all_reduce_min_(flag)
        return flag

    def _apply_window(self, finite) -> None:
        """The window's gradients were all-reduced whatever its losses (every rank ran backward, so
        DataParallel's collectives stay in order); now step or skip."""
        if self.scaler is not None:
            # The scaler itself skips an update with non-finite gradients, identically on every rank
            # (the gradients are all-reduced): count the losses on the device, read them when logging.
            self._optimizer_step()
            bad = 1 - finite.astype("int64")
            if self._nonfinite_on_device is None:
                zero = paddle.zeros_like(bad)
                self._nonfinite_on_device = (zero + self._nonfinite_run, zero, zero)
            run, longest, skipped = self._nonfinite_on_device
            run = (run + 1) * bad
            self._nonfinite_on_device = (run, paddle.maximum(longest, run), skipped + bad)
            return
        if bool(finite):  # the one host read per optimizer step: the skip decision needs it
            self._nonfinite_run = 0
            self._optimizer_step()
            return
        self.optimizer.clear_grad(set_to_zero=False)
        self._count_nonfinite(1, self._nonfinite_run + 1)

    def _count_nonfinite(self, skipped: int, run: int) -> None:
        self._nonfinite_run = run
        self._skipped_steps += skipped
        if run >= self.max_nonfinite_steps:
            raise NonFiniteLossError(
                f"loss was NaN/inf for {run} consecutive steps (epoch {self.epoch + 1}, "
                f"step {self.global_step}); lower lr.base_lr, enable amp loss scaling, or check the data")
        if skipped:
            log.warning("non-finite loss at epoch %d step %d: %d step(s) skipped", self.epoch + 1,
                        self.global_step, skipped)

    def _read_device_counts(self) -> None:
        if self._nonfinite_on_device is None:
            return
        run, longest, skipped = (int(v) for v in self._nonfinite_on_device)
        self._nonfinite_on_device = None
        self._count_nonfinite(skipped, longest if longest >= self.max_nonfinite_steps else run)

    def train_one_epoch(self) -> None:
        self.model.train()
        self.train_loader.set_epoch(self.epoch)
        steps = self.optimizer_steps_per_epoch()
        micro_total = steps * self.accumulate
        window_images = 0
        window_start = time.perf_counter()
        epoch_start = window_start
        done_micro = 0
        window_finite = None
        for micro, batch in enumerate(self.train_loader):
            if micro >= micro_total:
                break
            last_of_window = (micro + 1) % self.accumulate == 0
            sync = contextlib_nullcontext()
            if self.world_size > 1 and not last_of_window and hasattr(self.model, "no_sync"):
                sync = self.model.no_sync()
            with sync:
                with autocast(self.amp):
                    loss, n_images = self.objective(self.model, batch, self.epoch, self.global_step)
                finite = paddle.isfinite(loss).all()
                window_finite = finite if window_finite is None else paddle.logical_and(window_finite, finite)
                self._backward(loss / self.accumulate if self.accumulate > 1 else loss)
            window_images += n_images
            done_micro += 1
            if not last_of_window:
                continue
            self._apply_window(self._window_finite(window_finite))
            window_finite = None
            step_in_epoch = done_micro // self.accumulate
            if step_in_epoch % self.log_interval == 0 or step_in_epoch == steps:
                self._read_device_counts()
                now = time.perf_counter()
                ips_device = window_images / max(now - window_start, 1e-9)
                ips_global = ips_device * self.world_size
                remaining = (steps - step_in_epoch) + (self.epochs - self.epoch - 1) * steps
                eta = remaining * (now - epoch_start) / max(step_in_epoch, 1)
                lr = self.optimizer.get_lr()
                loss_v = float(loss)
                self.logger.record(
                    "train",
                    f"epoch {self.epoch + 1}/{self.epochs} step {step_in_epoch}/{steps} loss {loss_v:.4f} "
                    f"lr {lr:.5f} ips {ips_global:.1f} img/s global ({ips_device:.1f}/device x "
                    f"{self.world_size}) eta {format_eta(eta)}",
                    self.global_step, epoch=self.epoch + 1, loss=loss_v, lr=lr, ips_global=ips_global,
                    ips_per_device=ips_device, eta_s=round(eta, 1), skipped_steps=self._skipped_steps)
                window_images, window_start = 0, time.perf_counter()

    def evaluate(self) -> dict:
        if self.evaluator is None:
            return {}
        with evaluated_in_float32(self.raw_model, self.optimizer):
            if self.ema is not None and self.eval_with_ema:
                with self.ema.swapped_into(self.raw_model):
                    metrics = self.evaluator(self.raw_model)
                metrics["weights"] = "ema"
            else:
                metrics = self.evaluator(self.raw_model)
        return metrics

    def sync_ranks(self) -> None:
        """DataParallel all-reduces gradients, not buffers: each rank's BatchNorm statistics follow its
        own shard. Average them (and the EMA's) over the ranks before they are evaluated or saved, so that
        every rank evaluates, and rank 0 saves, the same model; and check that the parameters agree."""
        if self.world_size <= 1:
            return
        statistics = dist.running_statistics(self.raw_model)
        shadows = [self.ema.shadow[n] for n in statistics if n in self.ema.shadow] if self.ema is not None else []
        dist.average_over_ranks(list(statistics.values()) + shadows)
        dist.check_parameters_in_sync(self.raw_model, f"after epoch {self.epoch}")

    def fit(self) -> dict:
        self._call_hooks("before_train")
        while self.epoch < self.epochs:
            self.train_one_epoch()
            self.epoch += 1
            self.sync_ranks()
            metrics = {}
            if self.evaluator is not None and (self.epoch % self.eval_interval == 0 or self.epoch == self.epochs):
                metrics = self.evaluate()
                self.last_metrics = metrics
                shown = " ".join(f"{k} {v:.4f}" for k, v in metrics.items()
                                 if isinstance(v, float) and k not in ("seconds", "loss"))
                self.logger.record("eval", f"eval epoch {self.epoch}: {shown} ({metrics.get('images', 0)} images, "
                                   f"{metrics.get('seconds', 0.0):.1f} s)", self.global_step, epoch=self.epoch,
                                   **{k: v for k, v in metrics.items() if isinstance(v, (int, float))})
            primary = metrics.get(getattr(self.evaluator, "primary", ""), None)
            improved = primary is not None and primary > self.best_metric
            if improved:
                self.best_metric = primary
            self._call_hooks("after_epoch", metrics)
            self.save(improved)
        self.logger.close()
        return self.last_metrics


def contextlib_nullcontext():
    import contextlib
    return contextlib.nullcontext()
