"""The dygraph step strategy (``train.graph`` ``dynamic`` and ``to_static``).

``to_static`` is not a separate strategy: the model's forward is compiled (``paddle.jit.to_static``,
AST, ``full_graph=True``; bit-identical to dynamic under PIR and legacy IR) and everything else --
backward, the update, the loss scaler -- is this step, because the train step itself cannot be
AST-converted (``loss.backward``; docs/graph_modes.md).
"""
from __future__ import annotations

import contextlib
from typing import Any, Optional

import paddle

from ppdlx import dist
from ppdlx.checkpoint.files import set_state_cast
from ppdlx.engine.amp import AmpPlan, autocast, evaluated_in_float32, float32_state, resumed_scaler_state
from ppdlx.engine.static.ir_compat import check_graph_flags
from ppdlx.engine.step import Step, StepResult
from ppdlx.errors import UnsupportedError
from ppdlx.optim.weight_copies import LOW_PRECISION, LayerWeights



def check_same_master_weights(optimizer_state: dict, model) -> None:
    """An O2 optimizer keeps its state under its fp32 masters' names (``<param>_fp32_master_0_velocity_0``),
    any other under the parameters' (``<param>_velocity_0``); Paddle looks each accumulator up by the
    name it creates and stops the first step of a resume across that line with an assertion."""
    saved = bool(optimizer_state.get("master_weights"))
    here = any(p.dtype in LOW_PRECISION for p in model.parameters())
    if saved and not here:
        raise UnsupportedError("train.resume: the checkpoint was trained with amp.level=O2 (its optimizer state is "
                               "kept for fp32 master weights) and this run is not O2; resume with amp.level=O2, or "
                               "start a new run from its weights with model.weights=<checkpoint prefix>")
    if here and not saved:
        raise UnsupportedError("train.resume: this run is amp.level=O2 and the checkpoint's optimizer state has no "
                               "fp32 master weights (it was trained without O2); resume with the checkpoint's amp "
                               "settings, or start a new run from its weights with model.weights=<checkpoint prefix>")


class DynamicStep(Step):
    """Forward and backward per micro-batch; on the window's last one, every rank's verdict on its
    losses decides the update (a skipped window is skipped on all ranks, so DataParallel's
    collectives stay paired), through the loss scaler when there is one."""

    def __init__(self, model, raw_model, optimizer, objective, amp: AmpPlan, scaler=None, ema=None,
                 accumulate: int = 1, world_size: int = 1):
        self.model = model          # what runs the forward (DataParallel- or to_static-wrapped)
        self.raw_model = raw_model  # the Layer: checkpoints, EMA and evaluation use its names
        self.optimizer, self.objective, self.amp = optimizer, objective, amp
        self.scaler, self.ema = scaler, ema
        self.accumulate, self.world_size = accumulate, world_size
        self._window_finite = None

    def train_mode(self) -> None:
        self.model.train()

    def _progress(self):
        t = self.trainer
        return (t.epoch, t.global_step) if t is not None else (0, 0)

    def run(self, batch, last_of_window: bool) -> StepResult:
        sync = contextlib.nullcontext()
        if self.world_size > 1 and not last_of_window and hasattr(self.model, "no_sync"):
            sync = self.model.no_sync()
        with sync:
            with autocast(self.amp):
                loss, n_images = self.objective(self.model, batch, *self._progress())
            finite = paddle.isfinite(loss).all()
            self._window_finite = finite if self._window_finite is None else \
                paddle.logical_and(self._window_finite, finite)
            scaled = loss / self.accumulate if self.accumulate > 1 else loss
            (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
        if not last_of_window:
            return StepResult(loss, None, False, n_images)
        finite, self._window_finite = self._all_ranks(self._window_finite), None
        # The window's gradients were all-reduced whatever its losses (every rank ran backward); now
        # step or skip.
        if self.scaler is not None:
            # The scaler skips an update with non-finite gradients itself, identically on every rank:
            # the verdict stays on the device until the loop logs.
            self.scaler.step(self.optimizer)
            self.scaler.update()
            applied = True
        else:
            finite = bool(finite)  # the one host read per optimizer step: the skip decision needs it
            applied = finite
            if applied:
                self.optimizer.step()
        self.optimizer.clear_grad(set_to_zero=False)
        return StepResult(loss, finite, applied, n_images)

    def _all_ranks(self, flag):
        """All ranks' verdict (a device tensor): every rank skips or applies the same steps, and a
        persistent NaN stops them all at the same step."""
        if self.world_size > 1:
            flag = flag.astype("int32")
            dist.all_reduce_min_(flag)
        return flag

    def update_ema(self) -> None:
        if self.ema is not None:
            self.ema.update(self.raw_model, self.optimizer)

    def evaluate(self, evaluator, use_ema: bool) -> dict:
        with evaluated_in_float32(self.raw_model, self.optimizer):
            if self.ema is not None and use_ema:
                with self.ema.swapped_into(self.raw_model):
                    metrics = evaluator(self.raw_model)
                metrics["weights"] = "ema"
                return metrics
            return evaluator(self.raw_model)

    def running_statistics(self) -> list:
        """DataParallel all-reduces gradients, not buffers: each rank's BatchNorm statistics follow
        its own shard (and so do their EMA shadows)."""
        statistics = dist.running_statistics(self.raw_model)
        shadows = [self.ema.shadow[n] for n in statistics if n in self.ema.shadow] if self.ema is not None else []
        return list(statistics.values()) + shadows

    def check_in_sync(self, when: str) -> None:
        dist.check_parameters_in_sync(self.raw_model.named_parameters(), when)

    def model_state(self) -> dict:
        return float32_state(self.raw_model, self.optimizer)

    def optimizer_state(self) -> dict:
        return self.optimizer.state_dict()

    def state_dict(self) -> dict:
        return {"scaler": self.scaler.state_dict()} if self.scaler is not None else {}

    def load_state(self, model_state: dict, optimizer_state: Optional[dict], states: dict) -> None:
        if optimizer_state is not None:
            check_same_master_weights(optimizer_state, self.raw_model)
        set_state_cast(self.raw_model, model_state)  # float32 on disk; O2 parameters are fp16
        if optimizer_state is not None:
            self.optimizer.set_state_dict(optimizer_state)
        if self.scaler is not None and "scaler" in states:
            self.scaler.load_state_dict(resumed_scaler_state(self.scaler.state_dict(), states["scaler"]))

    def weights(self) -> LayerWeights:
        return LayerWeights(self.raw_model, self.optimizer, self.ema)


def compile_forward(model: Any):
    """``train.graph=to_static``: the model's forward as one static program (see the module doc)."""
    check_graph_flags("to_static")  # oneDNN flags break run_program ("dst_tensor ... defined")
    return paddle.jit.to_static(model, full_graph=True)
