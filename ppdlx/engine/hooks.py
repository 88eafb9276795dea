"""Trainer hooks: the behaviour around the loop (detectron2's ``HookBase`` idea).

A hook holds a reference to the trainer (``self.trainer``, set on registration) and overrides
any of ``before_train``, ``before_epoch``, ``before_step``, ``after_step``, ``after_epoch``,
``after_train`` (no arguments; the trainer carries the state: ``trainer.result`` is the last
:class:`~ppdlx.engine.step.StepResult`, ``trainer.step`` the step strategy). A hook with state
defines ``state_dict()`` / ``set_state_dict(state)``, saved in ``.pdstates`` under its
``state_key`` or ``hook:<name>``. There is no call point between backward and the update: no
behaviour needs the gradients there (clipping is the optimizer's ``grad_clip``), and in a static
program they never reach Python.

``ppdlx.engine.run.build_training`` registers the standard hooks around the caller's in this
order, which is the order they run in within each call:

1. :class:`RankSync` -- after an epoch, BN statistics (and their EMA) averaged over ranks and the
   weights checked to agree, before anything evaluates or saves them;
2. :class:`LRScheduler` -- after each applied step;
3. :class:`Evaluation` -- after an epoch (every ``eval.interval``): metrics, best tracking;
4. the caller's hooks (e.g. ``ppdlx.sparsity.ASPHook``: masks after each applied step, before the EMA);
5. :class:`EMA` -- after each applied step, after the hooks that edit weights;
6. :class:`MetricWriter` -- progress lines every ``log_interval`` steps and the eval line;
7. :class:`Checkpoint` -- after an epoch, last: ``epoch_N/``, then ``latest`` and ``best`` pointed at it;
8. :class:`RunAnalysis` -- after training, after ``MetricWriter`` closed ``metrics.jsonl``: ``curves.png`` and
   the final evaluation's per-class analysis.
"""
from __future__ import annotations

import logging
import os
import time

from ppdlx import checkpoint as ckpt
from ppdlx import dist
from ppdlx.analysis import write_run_figures
from ppdlx.engine.logger import MetricLogger, format_eta

log = logging.getLogger("ppdlx")


class Hook:
    """Base class: every method is a no-op; ``name`` keys the hook's state in checkpoints. A hook need not
    derive from it: the trainer calls the call points an object defines (the plug-ins below the engine,
    ``ppdlx.sparsity.ASPHook`` and ``ppdlx.tasks.class_list.ClassList``, define their own)."""

    name = ""
    trainer = None

    def before_train(self):
        pass

    def before_epoch(self):
        pass

    def before_step(self):
        pass

    def after_step(self):
        pass

    def after_epoch(self):
        pass

    def after_train(self):
        pass

    def after_resume(self):
        pass


class RankSync(Hook):
    """DataParallel all-reduces gradients, not buffers: each rank's BatchNorm statistics follow its own
    shard. Average them (and the EMA's) over the ranks before they are evaluated or saved, so that
    every rank evaluates, and rank 0 saves, the same model; and check that the weights agree."""

    name = "rank_sync"

    def after_epoch(self):
        t = self.trainer
        if t.world_size <= 1:
            return
        dist.average_over_ranks(t.step.running_statistics())
        t.step.check_in_sync(f"after epoch {t.epoch}")


class LRScheduler(Hook):
    name, state_key = "lr_schedule", "lr_schedule"

    def __init__(self, lr_schedule):
        self.lr_schedule = lr_schedule

    def after_step(self):
        if self.trainer.result.applied:
            self.lr_schedule.step()

    def state_dict(self):
        return self.lr_schedule.state_dict()

    def set_state_dict(self, state):
        self.lr_schedule.set_state_dict(state)

    def after_resume(self):
        # The schedule's position is the applied step count, which a resume at another number of steps
        # per epoch rescales (Trainer.resume); an unchanged count keeps the restored value bit for bit.
        if self.lr_schedule.last_epoch != self.trainer.global_step:
            self.lr_schedule.step(self.trainer.global_step)


class Evaluation(Hook):
    """Evaluates every ``interval`` epochs and after the last one (the EMA weights when ``use_ema``
    and the step keeps an EMA); tracks the best value of ``evaluator.primary``."""

    name = "evaluation"

    def __init__(self, evaluator, interval: int = 1, use_ema: bool = True):
        self.evaluator, self.interval, self.use_ema = evaluator, interval, use_ema

    def evaluate(self) -> dict:
        return self.trainer.step.evaluate(self.evaluator, self.use_ema)

    def after_epoch(self):
        t = self.trainer
        if self.evaluator is None or not (t.epoch % self.interval == 0 or t.epoch == t.epochs):
            return
        t.epoch_metrics = t.last_metrics = self.evaluate()
        primary = t.epoch_metrics.get(self.evaluator.primary)
        t.improved = primary is not None and primary > t.best_metric
        if t.improved:
            t.best_metric = primary


class EMA(Hook):
    """Updates the step's EMA after each applied step; its state is ``.pdstates["ema"]``."""

    name, state_key = "ema", "ema"
    restored = False  # set_state_dict ran: the checkpoint held an EMA

    def after_step(self):
        if self.trainer.result.applied:
            self.trainer.step.update_ema()

    def state_dict(self):
        return self.trainer.step.ema.state_dict()

    def set_state_dict(self, state):
        self.trainer.step.ema.set_state_dict(state)
        self.restored = True

    def after_resume(self):
        # The shadow was made from the weights the run was built with, random ones when it resumes:
        # a checkpoint trained without the EMA has none to restore, so it starts from the resumed weights.
        if not self.restored:
            self.trainer.step.ema.set_state_dict({"updates": 0, "shadow": self.trainer.step.model_state()})
            log.info("resume: the checkpoint holds no EMA (trained with ema.enabled=false): the EMA starts "
                     "from its weights")


class MetricWriter(Hook):
    """Progress lines (stdout on rank 0, ``metrics.jsonl``, VisualDL scalars) every log interval and
    after the last step of an epoch, and one line per evaluation. Global vs per-device throughput
    is explicit; the loss is read from the device only here."""

    name = "metric_writer"

    def __init__(self, output_dir: str, rank: int, lr_schedule):
        self.logger = MetricLogger(output_dir, rank)
        self.lr_schedule = lr_schedule
        self._epoch_start = self._window_start = time.perf_counter()
        self._images_logged = 0

    def before_epoch(self):
        self._epoch_start = self._window_start = time.perf_counter()
        self._images_logged = 0

    def after_step(self):
        t = self.trainer
        if not t.at_log_step:
            return
        steps, done = t.optimizer_steps_per_epoch(), t.step_in_epoch
        now = time.perf_counter()
        ips_device = (t.images_in_epoch - self._images_logged) / max(now - self._window_start, 1e-9)
        ips_global = ips_device * t.world_size
        remaining = (steps - done) + (t.epochs - t.epoch - 1) * steps
        eta = remaining * (now - self._epoch_start) / max(done, 1)
        lr = float(self.lr_schedule())
        loss = float(t.result.loss)
        self.logger.record(
            "train", f"epoch {t.epoch + 1}/{t.epochs} step {done}/{steps} loss {loss:.4f} lr {lr:.5f} ips "
                     f"{ips_global:.1f} img/s global ({ips_device:.1f}/device x {t.world_size}) eta {format_eta(eta)}",
            t.global_step, epoch=t.epoch + 1, loss=loss, lr=lr, ips_global=ips_global, ips_per_device=ips_device,
            eta_s=round(eta, 1), skipped_steps=t.skipped_steps)
        self._images_logged, self._window_start = t.images_in_epoch, time.perf_counter()

    def after_epoch(self):
        t, metrics = self.trainer, self.trainer.epoch_metrics
        if not metrics:
            return
        shown = " ".join(f"{k} {v:.4f}" for k, v in metrics.items() if isinstance(v, float) and k not in
                         ("seconds", "loss"))
        self.logger.record("eval", f"eval epoch {t.epoch}: {shown} ({metrics.get('images', 0)} images, "
                           f"{metrics.get('seconds', 0.0):.1f} s)", t.global_step, epoch=t.epoch,
                           **{k: v for k, v in metrics.items() if isinstance(v, (int, float))})

    def after_train(self):
        self.logger.close()


class Checkpoint(Hook):
    """After every epoch rank 0 writes the epoch's checkpoint, one directory ``epoch_N/`` that appears whole
    (model, optimizer, states and a manifest verified on reading: ``ppdlx.checkpoint.unit``), then
    points the symlink ``latest`` at it, and ``best`` when the evaluation improved; each pointer moves in one
    rename, so ``latest`` and ``best`` always name a complete checkpoint. ``epoch_N`` directories are kept
    every ``save_interval`` epochs and after the last (``keep_epoch_checkpoints``); another is removed when
    no pointer names it any more. A failed write (disk full, directory gone read-only) stops the run with
    one line, the previous checkpoint untouched. Weights holding NaN/inf stop the run instead
    (``Trainer.check_weights``). ``identity``: the model's registry ``name`` and ``num_classes``, recorded
    in the manifest so that resuming another model is refused before training."""

    name = "checkpoint"

    def __init__(self, output_dir: str, rank: int = 0, save_interval: int = 1, keep_epoch_checkpoints: bool = True,
                 identity: dict | None = None):
        self.output_dir, self.rank = output_dir, rank
        self.save_interval, self.keep_epoch_checkpoints = save_interval, keep_epoch_checkpoints
        self.identity = identity

    def after_epoch(self):
        self.save(self.trainer.improved)

    def kept(self, epoch: int) -> bool:
        return self.keep_epoch_checkpoints and (epoch % self.save_interval == 0 or epoch == self.trainer.epochs)

    def save(self, improved: bool) -> None:
        t = self.trainer
        t.check_weights(t.epoch)  # every rank (the verdict is reduced over ranks): NaN weights are never saved
        t.gather_rank_states()  # every rank: each draws its own random numbers and crops
        if self.rank != 0:
            return
        ckpt.save_epoch(self.output_dir, t.epoch, *t.checkpoint(), identity=self.identity, improved=improved,
                        keep=self.kept)


class RunAnalysis(Hook):
    """After training, on rank 0: ``curves.png`` (``ppdlx.analysis.write_run_figures``) and, when the final
    evaluation was kept (``write_analysis`` given), its per-class analysis in ``<output_dir>/analysis``. Sets
    ``trainer.analysis`` (the analysis dict, or ``{"skipped": reason}``). Never fails the run: what cannot be
    drawn or computed here is one log line."""

    name = "run_analysis"

    def __init__(self, output_dir: str, rank: int = 0, write_analysis=None, skipped: str = ""):
        self.output_dir, self.rank = output_dir, rank
        self.write_analysis, self.skipped = write_analysis, skipped

    def after_train(self):
        if self.rank != 0:
            return
        write_run_figures(self.output_dir)
        reason = self.skipped
        if self.write_analysis is not None:
            try:
                result = self.write_analysis(os.path.join(self.output_dir, "analysis"))
            except ImportError as err:  # scikit-learn is the plot extra's, not training's
                result, reason = None, f"not written: {err} (pip install 'ppdlx[plot]')"
            if result is not None:
                self.trainer.analysis = result
                log.info("analysis: %s", ", ".join(result["files"].values()))
                return
            reason = reason or "not written: the final evaluation kept no predictions"
        self.trainer.analysis = {"skipped": reason}
        log.info("analysis: %s", reason)
