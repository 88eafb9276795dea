"""``StaticProgramStep``: the step strategy of ``train.graph=static``.

Only program building and ``Executor.run`` run in static mode; the loop around them (loaders,
logging, checkpoints, evaluation metrics, collectives for metrics) stays in dygraph mode, so
every data backend feeds the executor unchanged (:mod:`ppdlx.engine.static.feed`).

Checkpoints use the dynamic step's layout: ``.pdparams`` keyed by the Layer's ``state_dict``
names (so static and dynamic checkpoints load into each other and export works from either),
``.pdopt`` keyed by the names the dynamic optimizer would use plus ``LR_Scheduler`` (and
``master_weights`` under AMP O2), ``.pdstates`` with the same keys (the loss scaler's state under
``scaler``, plus ``graph: static``). The scope <-> checkpoint mapping is
:mod:`ppdlx.engine.static.state`.
"""
from __future__ import annotations

import contextlib
from typing import Dict, Optional

import numpy as np
import paddle

from ppdlx import dist
from ppdlx.data.mixing import MixSpec, draw_mix, image_size
from ppdlx.engine.amp import AmpPlan
from ppdlx.engine.ema import ema_decay
from ppdlx.engine.static.feed import as_feed, feed_rows, feed_shape
from ppdlx.engine.static.ir_compat import static_graph
from ppdlx.engine.static.program import ProgramSpec, Programs, build_programs
from ppdlx.engine.static.state import ScopeState, scope_tensor, share_float32_views
from ppdlx.engine.step import Step, StepResult
from ppdlx.optim.weight_copies import WeightAccess


class ProgramEMA:
    """The EMA the train program updates in-graph (shadow variables ``<param>@EMA``); this object
    keeps the update count that sets the next decay, and the checkpoint state."""

    def __init__(self, state: ScopeState, decay: float, dynamic_decay: bool = False):
        self.state, self.decay, self.dynamic_decay = state, decay, dynamic_decay
        self.updates = 0

    def current_decay(self) -> float:
        return ema_decay(self.decay, self.dynamic_decay, self.updates)

    def state_dict(self) -> Optional[dict]:
        return self.state.ema_state(self.updates)

    def set_state_dict(self, state: dict) -> None:
        self.updates = int(state["updates"])
        self.state.set_ema_shadow(state["shadow"])


class ScopeWeights(WeightAccess):
    """:class:`~ppdlx.optim.weight_copies.WeightAccess` over the scope: parameters, AMP O2 masters and EMA
    shadows are scope variables (looked up at each use: the executor owns their memory)."""

    ema_updated_in_step = True  # the program updates the EMA right after the optimizer

    def __init__(self, step: "StaticProgramStep"):
        self.step, self.model = step, step.pr.model

    def copies(self, name: str) -> dict:
        s = self.step
        var = s.var_names[name]
        names = {"param": var, "master": s.master_names.get(var), "ema": s.pr.ema_shadow.get(name)}
        return {kind: (lambda v=v: scope_tensor(s.scope, v)) for kind, v in names.items()
                if v and s.scope.find_var(v) is not None}

    def read(self, name: str) -> np.ndarray:
        var = self.step.var_names[name]
        return self.step.get_var(self.step.master_names.get(var, var)).astype(np.float32, copy=False)


class ProgramModel:
    """Looks like a Layer to an evaluator: calling it runs the eval program."""

    training = False

    def __init__(self, step: "StaticProgramStep"):
        self.step = step
        step.bind_eval_scope()

    def eval(self):
        return self

    def train(self):
        return self

    def __call__(self, images):
        s = self.step
        logits = s.run_program(s.pr.eval, {"images": as_feed(images, "float32")}, [s.pr.logits])[0]
        return paddle.to_tensor(logits)


class StaticProgramStep(Step):
    """One ``Executor.run`` of the train program per micro-batch (forward, backward, the in-graph
    update, EMA and all-reduce); ``var_names``/``get_var``/``set_var`` reach the scope by the
    Layer's structured names."""

    def __init__(self, pr: Programs, exe, scope, place, lr_schedule, amp: AmpPlan, dyn_names: Dict[str, str],
                 param_order=(), mix: MixSpec = MixSpec(), seed: int = 0, ema_decay_value: float = 0.9999,
                 ema_dynamic_decay: bool = False, channels_last: bool = False):
        self.pr, self.exe, self.scope, self.place = pr, exe, scope, place
        self.lr_schedule, self.amp = lr_schedule, amp
        self.mix, self.seed, self.channels_last = mix, seed, channels_last
        self.var_names = {n: v.name for n, v in pr.model.state_dict().items()}  # structured -> scope name
        self.dyn_names = dyn_names  # structured -> the dynamic model's parameter names (.pdopt keys)
        self.state = ScopeState(scope, place, self.var_names, dyn_names, pr.optimizer, param_order,
                                pr.loss_scaling, pr.ema_shadow)
        self.master_names = self.state.master_names  # param -> float32 master variable (AMP O2)
        self.ema = ProgramEMA(self.state, ema_decay_value, ema_dynamic_decay) if pr.ema_shadow else None
        self.unskipped_note = "" if pr.conditional else pr.unskipped_note
        # O2: the float32 eval program reads float32 views (masters, or the EMA) from its own scope
        self.eval_scope = paddle.static.Scope() if self.master_names else scope
        self._eval_shadows = None
        self._window_finite = True

    # ------------------------------------------------------------------ scope access
    def run_program(self, program, feed, fetch_list):
        scope = self.eval_scope if program is self.pr.eval else self.scope
        # scope_guard too: Paddle's PIR executor writes the LR variable into global_scope()
        with static_graph(), paddle.static.scope_guard(scope):
            return self.exe.run(program, feed=feed, fetch_list=fetch_list, scope=scope, use_program_cache=True)

    def bind_eval_scope(self) -> None:
        """Point a separate eval scope (AMP O2) at the float32 state to evaluate: the masters, or
        the EMA shadows inside :meth:`ema_swapped_in`."""
        if self.eval_scope is not self.scope:
            share_float32_views(self.scope, self.eval_scope, self.state.float32_sources(self._eval_shadows))

    def get_var(self, name: str) -> np.ndarray:
        return self.state.get(name)

    def set_var(self, name: str, value) -> None:
        self.state.set(name, value)

    def set_model_state(self, state: dict) -> None:
        """Weights into the parameters and, under AMP O2, their float32 masters."""
        self.state.set_model_state(state)

    def set_optimizer_state(self, state: dict) -> None:
        self.state.set_optimizer_state(state)

    # ------------------------------------------------------------------ the step
    def _progress(self):
        t = self.trainer
        return (t.epoch, t.global_step) if t is not None else (0, 0)

    def feed(self, batch, last_of_window: bool) -> dict:
        images, labels = batch[0], batch[1]
        feed = {"images": as_feed(images, "float32"), "labels": as_feed(labels, "int64", flat=True)}
        if self.mix.enabled:  # the dynamic objective's draw: the same Mixup / CutMix per step
            size = image_size(feed_shape(feed["images"]), self.channels_last)
            feed.update(draw_mix(self.mix, self.seed, *self._progress(), *size).feed())
        if "apply_now" in self.pr.feeds:
            feed["apply_now"] = np.asarray([last_of_window])
        if "ema_decay" in self.pr.feeds:
            d = self.ema.current_decay() if last_of_window else 1.0
            feed["ema_decay"] = np.asarray([d], np.float32)
            feed["ema_rest"] = np.asarray([1.0 - d], np.float32)
        return feed

    def run(self, batch, last_of_window: bool) -> StepResult:
        feed = self.feed(batch, last_of_window)
        loss, finite = self.run_program(self.pr.main, feed, self.pr.fetch)
        # the program skipped the update iff not finite (any rank); legacy IR and static AMP cannot
        # skip it (counted all the same, as the dynamic step counts scaler steps)
        finite = bool(np.asarray(finite).all())
        self._window_finite = self._window_finite and finite
        result = StepResult(float(np.asarray(loss).reshape(-1)[0]), None, False, feed_rows(feed["images"]))
        if last_of_window:
            result.finite, result.applied = self._window_finite, self._window_finite or not self.pr.conditional
            self._window_finite = True
        return result

    def update_ema(self) -> None:
        if self.ema is not None:
            self.ema.updates += 1  # the program did the arithmetic

    # ------------------------------------------------------------------ evaluation
    @contextlib.contextmanager
    def ema_swapped_in(self):
        """Within the block the eval program sees the EMA weights (swapped into the model's variables,
        or, under O2, bound into the eval scope)."""
        if not self.pr.ema_shadow:
            yield
            return
        if self.eval_scope is not self.scope:  # nothing to swap: the eval scope reads the shadows
            self._eval_shadows = self.pr.ema_shadow
            try:
                yield
            finally:
                self._eval_shadows = None
            return
        backup = {n: self.get_var(self.var_names[n]) for n in self.pr.ema_shadow}
        for n, s in self.pr.ema_shadow.items():
            self.set_var(self.var_names[n], self.get_var(s))
        try:
            yield
        finally:
            for n, value in backup.items():
                self.set_var(self.var_names[n], value)

    def evaluate(self, evaluator, use_ema: bool) -> dict:
        if self.pr.ema_shadow and use_ema:
            with self.ema_swapped_in():
                metrics = evaluator(ProgramModel(self))
            metrics["weights"] = "ema"
            return metrics
        return evaluator(ProgramModel(self))

    def running_statistics(self) -> list:
        """BatchNorm statistics and other floating buffers (and their EMA shadows) as tensors over
        the scope's memory: averaged in place (the program all-reduces gradients, not statistics)."""
        names = [n for n in dist.running_statistics(self.pr.model) if n in self.var_names]
        variables = [self.var_names[n] for n in names] + [self.pr.ema_shadow[n] for n in names
                                                           if n in self.pr.ema_shadow]
        return [scope_tensor(self.scope, name) for name in variables]

    def check_in_sync(self, when: str) -> None:
        """The program all-reduces gradients inside itself; this names a parameter whose ranks differ."""
        dist.check_parameters_in_sync([(n, scope_tensor(self.scope, self.var_names[n]))
                                       for n, _ in self.pr.model.named_parameters() if n in self.var_names], when)

    # ------------------------------------------------------------------ checkpoint state
    def model_state(self) -> Dict[str, np.ndarray]:
        return self.state.model_state()

    def optimizer_state(self) -> dict:
        state = self.state.optimizer_state()
        state["LR_Scheduler"] = self.lr_schedule.state_dict()
        return state

    def state_dict(self) -> dict:
        states = {"graph": "static"}
        scaler = self.state.scaler_state()
        if scaler is not None:
            states["scaler"] = scaler
        return states

    def load_state(self, model_state: dict, optimizer_state, states: dict) -> None:
        self.set_model_state(model_state)
        if optimizer_state is not None:
            self.set_optimizer_state(optimizer_state)
        if "scaler" in states:
            self.state.set_scaler_state(states["scaler"])

    def weights(self) -> ScopeWeights:
        return ScopeWeights(self)


def build_static_step(spec: ProgramSpec, lr_schedule, amp: AmpPlan, world: int, device: str,
                      init_state: Optional[dict] = None, dyn_names: Optional[Dict[str, str]] = None,
                      mix: MixSpec = MixSpec(), seed: int = 0, ema_decay_value: float = 0.9999,
                      ema_dynamic_decay: bool = False) -> StaticProgramStep:
    """Trace the programs, run the startup program in a fresh scope, then load ``init_state`` (the
    dynamic model's initial or loaded weights; the EMA starts from them, as ``ModelEMA`` does).
    ``dyn_names``: structured name -> the dynamic model's parameter name (``.pdopt`` keys)."""
    with static_graph():
        pr = build_programs(spec, lr_schedule, amp, world)
        place = paddle.CUDAPlace(int(device.split(":")[1])) if device.startswith("gpu") else paddle.CPUPlace()
        exe = paddle.static.Executor(place)
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope):
            exe.run(pr.startup, scope=scope)
    param_order = [p.name for g in spec.param_groups(pr.model) for p in g["params"]]
    names = dyn_names or {n: v.name for n, v in pr.model.state_dict().items()}
    step = StaticProgramStep(pr, exe, scope, place, lr_schedule, amp, names, param_order, mix, seed,
                             ema_decay_value, ema_dynamic_decay, spec.data_format == "NHWC")
    if init_state is not None:
        step.set_model_state(init_state)
        for n, s in pr.ema_shadow.items():
            step.set_var(s, init_state[n].astype(np.float32))
    return step
