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
from typing import Any, List

import numpy as np
import paddle

from ppdlx.errors import PpdlxError
from ppdlx.optim.weight_copies import LayerWeights, WeightAccess


@dataclass
class StepResult:
    loss: Any        # this micro-batch's loss (a device tensor or a number)
    finite: Any      # the window's losses were all finite: a bool, or a device bool tensor (None mid-window)
    applied: bool    # the optimizer update ran (last micro-batch of a window)
    images: int      # images in this micro-batch (this rank)


class NonFiniteWeightsError(PpdlxError):
    exit_code = 4


def nonfinite_weights_message(labels: List[str], flags: np.ndarray, epoch: int, step: int) -> str:
    """The one line naming the first non-finite copy (``flags`` from :meth:`WeightAccess.finite_flags`)."""
    bad = np.flatnonzero(~np.asarray(flags, bool).reshape(-1))
    return (f"weights became NaN/inf at epoch {epoch} step {step}: first non-finite is '{labels[bad[0]]}' "
            f"({bad.size} of {len(labels)} tensors); no checkpoint was written from them; lower lr.base_lr "
            f"or check the data")


# use -> what non-finite weights would do there
_CONSEQUENCE = {"export": "an export of these weights would predict NaN/inf",
                "evaluate": "these weights predict NaN/inf, so any accuracy measured from them is meaningless"}


def check_finite_weights(model, weights: str, use: str = "export") -> None:
    """Raise :class:`NonFiniteWeightsError` (exit 4) naming the first parameter or buffer holding NaN or inf;
    ``use`` ("export" | "evaluate") is what the message says the weights were loaded for."""
    labels, flags = LayerWeights(model).finite_flags()
    if flags is None or bool(flags.all()):
        return
    bad = np.flatnonzero(~flags.numpy())
    first = labels[bad[0]]
    kind = "NaN" if bool(paddle.isnan(model.state_dict()[first]).any()) else "inf"
    raise NonFiniteWeightsError(
        f"model.weights={weights}: '{first}' holds {kind} (non-finite tensors: {bad.size} of {len(labels)}); "
        f"{_CONSEQUENCE[use]}: {use} a checkpoint saved before the run diverged (an earlier epoch_N) or retrain "
        f"with a lower lr.base_lr")


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
