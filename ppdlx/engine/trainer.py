"""The training loop: ``Trainer(step, hooks)``.

The loop knows nothing of graph modes or tasks. Per epoch it feeds micro-batches to a step
strategy (:mod:`ppdlx.engine.step`), counts applied optimizer steps and non-finite windows, and
calls the hooks (:mod:`ppdlx.engine.hooks`), which do everything else -- LR stepping, EMA,
evaluation and best tracking, metric writing, rank sync, checkpoints, ASP -- in this order:

``before_train``; per epoch ``before_epoch``, then per optimizer step ``before_step`` and
``after_step`` (every window, applied or skipped: ``trainer.result`` says which), then
``after_epoch``; ``after_train`` at the end; ``after_resume`` once, after a checkpoint's state is
restored. Within one call, hooks run in the order given.

Run state lives here and is checkpointed with the hooks' and the step's: ``epoch``,
``global_step`` (applied optimizer steps), ``best_metric`` / ``last_metrics`` (written by the
evaluation hook), ``skipped_steps``.
"""
from __future__ import annotations

import logging
import math
import os
import warnings
from typing import Iterable, Optional

import paddle

from ppdlx import checkpoint as ckpt
from ppdlx import dist
from ppdlx.engine.hooks import Hook
from ppdlx.engine.step import NonFiniteWeightsError, Step, StepResult, nonfinite_weights_message
from ppdlx.errors import PpdlxError

log = logging.getLogger("ppdlx.train")

HOOK_METHODS = ("before_train", "before_epoch", "before_step", "after_step", "after_epoch", "after_train",
                "after_resume")


class NonFiniteLossError(PpdlxError):
    exit_code = 4


def optimizer_steps_per_epoch(batches: int, accumulate: int, cap: Optional[int] = None) -> int:
    """Optimizer steps in an epoch of ``batches`` micro-batches (``train.steps_per_epoch`` caps it)."""
    steps = batches // accumulate
    if cap:
        steps = min(steps, cap)
    return max(steps, 1)


class NonFiniteCounter:
    """Consecutive and total non-finite windows; raises after ``max_steps`` in a row. A verdict still
    on the device (loss scaler) is accumulated there and read when the loop logs."""

    def __init__(self, max_steps: int):
        self.max_steps = max_steps
        self.run = 0
        self.skipped = 0
        self._on_device = None  # (current run, longest run, skipped) since the last read

    def update(self, result: StepResult, epoch: int, step: int, note: str) -> None:
        """``epoch`` counted from 1; ``note``: what happened to a non-finite step that was applied."""
        if not isinstance(result.finite, paddle.Tensor):
            if result.finite:
                self.run = 0
            else:
                self._count(1, self.run + 1, epoch, step, note if result.applied else "")
            return
        bad = 1 - result.finite.astype("int64")
        if self._on_device is None:
            zero = paddle.zeros_like(bad)
            self._on_device = (zero + self.run, zero, zero)
        run, longest, skipped = self._on_device
        run = (run + 1) * bad
        self._on_device = (run, paddle.maximum(longest, run), skipped + bad)

    def read(self, epoch: int, step: int) -> None:
        if self._on_device is None:
            return
        run, longest, skipped = (int(v) for v in self._on_device)
        self._on_device = None
        self._count(skipped, longest if longest >= self.max_steps else run, epoch, step, "")

    def _count(self, skipped: int, run: int, epoch: int, step: int, note: str) -> None:
        self.run = run
        self.skipped += skipped
        if run >= self.max_steps:
            raise NonFiniteLossError(
                f"loss was NaN/inf for {run} consecutive steps (epoch {epoch}, step {step}); lower lr.base_lr, "
                f"enable amp loss scaling, or check the data")
        if skipped:
            log.warning("non-finite loss at epoch %d step %d: %s", epoch, step, note or f"{skipped} step(s) skipped")


class Trainer:
    """``Trainer(step, hooks, train_loader=..., epochs=...)``; ``fit()`` trains and returns the last
    evaluation's metrics."""

    def __init__(self, step: Step, hooks: Iterable = (), *, train_loader, epochs: int, accumulate: int = 1,
                 steps_per_epoch: Optional[int] = None, log_interval: int = 10, max_nonfinite_steps: int = 10,
                 rank: int = 0, world_size: int = 1, output_dir: Optional[str] = None):
        self.step = step
        self.output_dir = output_dir  # where the checkpoints are (named when a peer rank is lost)
        self.train_loader, self.epochs, self.accumulate = train_loader, epochs, accumulate
        self.steps_per_epoch, self.log_interval = steps_per_epoch, log_interval
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        self.global_step = 0
        self.best_metric = -math.inf
        self.last_metrics: dict = {}
        self.epoch_metrics: dict = {}   # this epoch's evaluation ({} when it did not evaluate)
        self.improved = False           # this epoch's evaluation beat best_metric
        self.step_in_epoch = 0          # optimizer-step windows done in this epoch
        self.images_in_epoch = 0        # this rank's
        self.result: Optional[StepResult] = None
        self.at_log_step = False        # this window ends a log interval (device values are read)
        self.nonfinite = NonFiniteCounter(max_nonfinite_steps)
        self.rank_states: Optional[list] = None  # every rank's own states (rng, train loader) at the last save
        self.hooks = []
        step.attach(self)
        self.register_hooks(hooks)

    @property
    def skipped_steps(self) -> int:
        return self.nonfinite.skipped

    def register_hooks(self, hooks: Iterable) -> None:
        for hook in hooks:
            hook.trainer = self
            self.hooks.append(hook)
        # bound methods once, not a getattr per hook per step; a Hook's inherited no-ops are left out
        self._calls = {m: [getattr(h, m) for h in self.hooks if callable(getattr(h, m, None))
                           and getattr(type(h), m, None) is not getattr(Hook, m)] for m in HOOK_METHODS}

    def find_hook(self, cls):
        """The first registered hook of type ``cls`` (None if there is none)."""
        return next((h for h in self.hooks if isinstance(h, cls)), None)

    def call_hooks(self, method: str) -> None:
        for fn in self._calls[method]:
            fn()

    def optimizer_steps_per_epoch(self) -> int:
        return optimizer_steps_per_epoch(len(self.train_loader), self.accumulate, self.steps_per_epoch)

    def _steps_per_epoch_or_none(self) -> Optional[int]:
        return None if self.train_loader is None else self.optimizer_steps_per_epoch()

    # ------------------------------------------------------------------ loop
    def train_one_epoch(self) -> None:
        self.step.train_mode()
        self.train_loader.set_epoch(self.epoch)
        steps = self.optimizer_steps_per_epoch()
        micro_total = steps * self.accumulate
        self.step_in_epoch = self.images_in_epoch = 0
        self.call_hooks("before_epoch")
        # zip takes from the range first: no batch past the last whole window is read.
        for micro, batch in zip(range(micro_total), self.train_loader):
            last_of_window = (micro + 1) % self.accumulate == 0
            if micro % self.accumulate == 0:
                self.call_hooks("before_step")
            result = self.step.run(batch, last_of_window)
            self.images_in_epoch += result.images
            if not last_of_window:
                continue
            self.result = result
            if result.applied:
                self.global_step += 1
            self.step_in_epoch += 1
            self.at_log_step = self.step_in_epoch % self.log_interval == 0 or self.step_in_epoch == steps
            self.nonfinite.update(result, self.epoch + 1, self.global_step, self.step.unskipped_note)
            if self.at_log_step:
                self.nonfinite.read(self.epoch + 1, self.global_step)
            self.call_hooks("after_step")
            if self.at_log_step:  # after the hooks: the EMA and ASP have touched the weights by now
                self.check_weights(self.epoch + 1)

    def fit(self) -> dict:
        with dist.stop_on_lost_peer(self.lost_peer_line, cleanup=self._release_output_dir):
            self.call_hooks("before_train")
            while self.epoch < self.epochs:
                self.train_one_epoch()
                self.epoch += 1
                self.epoch_metrics, self.improved = {}, False
                self.call_hooks("after_epoch")
            self.call_hooks("after_train")
        return self.last_metrics

    def lost_peer_line(self, collective: str, message: str) -> str:
        """What this rank says when a peer rank is lost (``message``: gloo's): which rank, during what, and how
        to go on."""
        lost = f"{dist.lost_peer(message)} was lost (its connection closed during {collective})"
        try:
            path, epoch, _ = ckpt.newest_complete(self.output_dir) if self.output_dir else (None, None, None)
        except PpdlxError:  # a refused (planted) file: nothing to recommend resuming from
            path = None
        if path is None:
            return f"{lost}; no checkpoint is complete yet: rerun the same command to start again"
        return (f"{lost}; {path} (epoch {epoch}) is the newest complete checkpoint: rerun the same command with "
                f"train.resume=auto to continue from it")

    def _release_output_dir(self) -> None:
        if self.output_dir:
            ckpt.release_output_dir(self.output_dir)

    def check_weights(self, epoch: int) -> None:
        """Raise :class:`NonFiniteWeightsError` if any copy of a weight (parameter, AMP master, EMA
        shadow) or buffer holds NaN/inf: a finite loss does not imply finite weights (fast CPU kernels
        kept the loss finite over NaN weights). One device reduction per tensor and one scalar host
        read, on every rank alike (the flags are reduced over ranks first, so all ranks stop together)."""
        labels, flags = self.step.weights().finite_flags()
        if flags is None:
            return
        if self.world_size > 1:
            flags = flags.astype("int32")
            dist.all_reduce_min_(flags)
            flags = flags.astype("bool")
        if bool(flags.all()):  # a scalar read; the per-tensor flags only when something is wrong
            return
        raise NonFiniteWeightsError(nonfinite_weights_message(labels, flags.numpy(), epoch, self.global_step))

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """The ``.pdstates`` content: run state, the step's extras, every hook's state, RNG."""
        states = {"epoch": self.epoch, "global_step": self.global_step, "best_metric": self.best_metric,
                  "last_metrics": self.last_metrics, "steps_per_epoch": self._steps_per_epoch_or_none(),
                  **self.step.state_dict()}
        for hook in self.hooks:
            key = state_key(hook)
            if key is not None:
                states[key] = hook.state_dict()
        ranks = self.rank_states if self.rank_states is not None else [self._own_states()]
        states["rng"] = [own["rng"] for own in ranks]
        if "train_loader" in ranks[0]:
            states["train_loader"] = [own["train_loader"] for own in ranks]
        return states

    def _own_states(self) -> dict:
        own = {"rng": ckpt.capture_rng()}
        if callable(getattr(self.train_loader, "state_dict", None)):
            own["train_loader"] = self.train_loader.state_dict()
        return own

    def gather_rank_states(self) -> None:
        """On every rank before a save: what each rank draws from on its own -- its random generators (a GPU
        rank its own GPU's) and its train loader's state (a DALI pipeline's random state) -- for rank 0 to
        write with the checkpoint, one entry per rank."""
        own = self._own_states()
        if self.world_size > 1:
            gathered: list = []
            paddle.distributed.all_gather_object(gathered, own)
            self.rank_states = gathered
        else:
            self.rank_states = [own]

    def checkpoint(self):
        """``(model state, optimizer state, .pdstates)`` in the layout every graph mode reads."""
        return self.step.model_state(), self.step.optimizer_state(), self.state_dict()

    def resume(self, prefix: str) -> None:
        model_state, optimizer_state, states = ckpt.load_checkpoint(prefix)
        with warnings.catch_warnings():
            # Paddle's LinearWarmup saves its inner schedule under a key of its own, then warns on every
            # load that the key is unused (paddle/optimizer/lr.py): a warm-up schedule is restored whole.
            warnings.filterwarnings("ignore", message="There are some unused values in state_dict")
            self.step.load_state(model_state, optimizer_state, states)
            for hook in self.hooks:
                key = state_key(hook)
                if key is not None and key in states:
                    hook.set_state_dict(states[key])
        self.epoch = int(states["epoch"])
        self.global_step = int(states["global_step"])
        self.best_metric = float(states["best_metric"])
        self.last_metrics = states.get("last_metrics", {})
        shown = f"{prefix} -> {os.readlink(prefix)}" if os.path.islink(prefix) else prefix
        self._restore_rng(states.get("rng"), shown)
        self._restore_loader_state(states.get("train_loader"), prefix)
        self._continue_schedule(states.get("steps_per_epoch"), shown)
        self.call_hooks("after_resume")
        log.info("resumed from %s at epoch %d (step %d)", shown, self.epoch, self.global_step)

    def _continue_schedule(self, saved_steps: Optional[int], shown: str) -> None:
        """A run resumed with another global batch (ranks, ``data.batch_size``, ``train.accumulate``) or
        ``train.steps_per_epoch`` makes another number of optimizer steps per epoch, while the learning-rate
        schedule is placed by the applied step count: that count is carried over at the same fraction of the
        training, so the schedule goes on from where the checkpoint's epoch ends."""
        steps = self._steps_per_epoch_or_none()
        if steps is None:
            return
        if saved_steps is None and self.epoch and self.global_step > self.epoch * steps:
            saved_steps = round(self.global_step / self.epoch)  # older checkpoints: only a certain change shows
        if not saved_steps or int(saved_steps) == steps:
            return
        position = round(self.global_step * steps / int(saved_steps))
        log.warning("%s was trained at %d optimizer steps per epoch and this run makes %d (the global batch or "
                    "train.steps_per_epoch changed): its step %d continues as step %d of %d, so the learning-rate "
                    "schedule goes on from the end of epoch %d", shown, saved_steps, steps, self.global_step,
                    position, self.epochs * steps, self.epoch)
        self.global_step = position

    def _restore_rng(self, saved, shown: str) -> None:
        saved = [saved] if isinstance(saved, dict) else saved  # older checkpoints: rank 0's state only
        if saved is not None and len(saved) == self.world_size:
            ckpt.restore_rng(saved[self.rank])
            return
        held = "no random state" if saved is None else f"the random state of {len(saved)} rank(s)"
        log.info("%s holds %s for this run's %d rank(s): random draws (dropout, drop path, mixup) go on from "
                 "this run's seed", shown, held, self.world_size)

    def _restore_loader_state(self, loader_states, prefix: str) -> None:
        if not callable(getattr(self.train_loader, "set_state_dict", None)):
            return
        if loader_states is not None and len(loader_states) == self.world_size:
            self.train_loader.set_state_dict(loader_states[self.rank])
            return
        held = "no data loader state" if loader_states is None else f"the loader states of {len(loader_states)} ranks"
        log.info("%s holds %s for this run's %d rank(s): the data pipeline's crops and flips are drawn afresh "
                 "(the sample order is the same)", prefix, held, self.world_size)


def state_key(hook) -> Optional[str]:
    """Where a hook's ``state_dict()`` goes in ``.pdstates``: its ``state_key``, else ``hook:<name>``;
    None for a hook without state."""
    if not callable(getattr(hook, "state_dict", None)):
        return None
    return getattr(hook, "state_key", None) or f"hook:{hook.name}"
