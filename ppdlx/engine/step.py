"""The step contract: what :class:`ppdlx.engine.trainer.Trainer` asks of a step strategy.

A step strategy does one optimizer step in micro-batches and owns everything graph-mode specific:
the model, optimizer, loss scaler and EMA, how they are evaluated, synchronised over ranks and
saved. Implementations: :class:`ppdlx.engine.dynamic_step.DynamicStep` (dygraph, and
``train.graph=to_static``, which only compiles the model's forward) and
:class:`ppdlx.engine.static.step.StaticProgramStep` (one static program per step).

``run(batch, last_of_window)`` is called once per micro-batch; on the last one of an accumulation
window the update is applied (or skipped) and ``StepResult.applied`` / ``finite`` describe it.
Device values in a result (``loss``, and ``finite`` when a loss scaler decides on the device) are
read by the loop only when it logs: a step itself reads at most what it needs to decide.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Tuple

import numpy as np
import paddle

from ppdlx.errors import PpdlxError


@dataclass
class StepResult:
    loss: Any        # this micro-batch's loss (a device tensor or a number)
    finite: Any      # the window's losses were all finite: a bool, or a device bool tensor (None mid-window)
    applied: bool    # the optimizer update ran (last micro-batch of a window)
    images: int      # images in this micro-batch (this rank)


class WeightAccess:
    """Every stored copy of a weight, by the structured name of ``model.state_dict()``: what a hook
    that edits weights in place (ASP) needs, whichever step holds them.

    ``copies(name)`` -> ``{"param" | "master" | "ema": getter}``, each getter returning a paddle
    Tensor that shares the copy's memory (in-place ops change the weight); ``read(name)`` -> the
    float32 value (the master where AMP O2 keeps one); ``masters_pending(name)``: a master will
    appear at the optimizer's first step; ``ema_updated_in_step``: the EMA is updated inside
    ``run`` (so before the ``after_step`` hooks) rather than by the EMA hook after them.
    """
    model: Any = None
    ema_updated_in_step: bool = False

    def copies(self, name: str) -> Dict[str, Callable[[], Any]]:
        raise NotImplementedError

    def read(self, name: str) -> np.ndarray:
        raise NotImplementedError

    def masters_pending(self, name: str) -> bool:
        return False

    def finite_flags(self) -> Tuple[List[str], Any]:
        """``(labels, flags)``: a label per floating copy of every weight and buffer (``name``, ``name (AMP
        master)``, ``name (EMA shadow)``) and a device bool tensor, one flag per copy, True where the copy
        is finite (None without copies). Nothing is read back here: the caller reads the flags once, after
        reducing them over ranks."""
        labels, flags = [], []
        if self.model is None:
            return labels, None
        for name in self.model.state_dict():
            for kind, get in self.copies(name).items():
                tensor = get()
                if tensor.is_floating_point():
                    labels.append(name + _COPY_LABEL[kind])
                    flags.append(paddle.isfinite(tensor).all())
        return labels, (paddle.stack(flags) if flags else None)


_COPY_LABEL = {"param": "", "master": " (AMP master)", "ema": " (EMA shadow)"}


class NonFiniteWeightsError(PpdlxError):
    exit_code = 4


def nonfinite_weights_message(labels: List[str], flags: np.ndarray, epoch: int, step: int) -> str:
    """The one line naming the first non-finite copy (``flags`` from :meth:`WeightAccess.finite_flags`)."""
    bad = np.flatnonzero(~np.asarray(flags, bool).reshape(-1))
    return (f"weights became NaN/inf at epoch {epoch} step {step}: first non-finite is '{labels[bad[0]]}' "
            f"({bad.size} of {len(labels)} tensors); no checkpoint was written from them; lower lr.base_lr "
            f"or check the data")


class Step:
    """Base of the step strategies (documents the contract; the strategies override every method)."""

    trainer = None                # set by ``attach``: the loop's progress (epoch, global_step)
    ema = None                    # an EMA object (``state_dict``/``set_state_dict``) or None
    unskipped_note = ""           # what happens to a non-finite step that cannot be skipped

    def attach(self, trainer) -> None:
        self.trainer = trainer

    def train_mode(self) -> None:
        """Called at the start of every epoch."""

    def run(self, batch, last_of_window: bool) -> StepResult:
        raise NotImplementedError

    def update_ema(self) -> None:
        """After an applied step (the EMA hook calls it)."""

    def evaluate(self, evaluator, use_ema: bool) -> dict:
        raise NotImplementedError

    def running_statistics(self) -> List[Any]:
        """Tensors to average over ranks before evaluating and saving (BN statistics, their EMA)."""
        return []

    def check_in_sync(self, when: str) -> None:
        """Raise if the ranks' weights differ (where the step can tell cheaply)."""

    def model_state(self) -> dict:
        raise NotImplementedError

    def optimizer_state(self) -> dict:
        raise NotImplementedError

    def state_dict(self) -> dict:
        """Extra ``.pdstates`` entries (loss scaler, graph mode)."""
        return {}

    def load_state(self, model_state: dict, optimizer_state, states: dict) -> None:
        raise NotImplementedError

    def weights(self) -> WeightAccess:
        """Overridden by every step that holds weights; the base holds none (``model`` None: nothing to
        check or edit)."""
        return WeightAccess()
