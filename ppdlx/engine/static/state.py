"""Checkpoint state <-> the scope variables of a static train program.

The static step writes and reads the dynamic trainer's checkpoint layout; this module owns the
mapping. What lives where in the scope:

* parameters, under the program names of the Layer's ``state_dict`` (low precision under AMP O2);
* with AMP O2 (``multi_precision``), one float32 master copy per low-precision parameter. Under PIR
  Paddle creates it in the startup program from the parameter's initialiser
  (``Optimizer._create_master_weight``, paddle/optimizer/optimizer.py) and the optimizer updates
  the master and casts it back into the parameter, so every value written into a parameter (model
  weights, resumed state) has to be written into its master too;
* optimizer accumulators (``optimizer._accumulators``: kind -> owner name -> variable; the owner of
  a low-precision parameter's accumulator is its master);
* dynamic loss scaling (``loss_scaling_*``, ``num_good_steps_*``, ``num_bad_steps_*``), saved as
  ``paddle.amp.GradScaler.state_dict()`` is, so dynamic and static checkpoints resume each other;
* EMA shadows (``<param>@EMA``).

``.pdopt`` keys are the dynamic optimizer's: accumulators named after the dynamic model's
parameter names, ``master_weights`` keyed by those names (``Optimizer.state_dict``).
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np
import paddle

from ppdlx.errors import ConfigError

log = logging.getLogger("ppdlx")


def read_var(scope, name: str) -> np.ndarray:
    """A scope variable as numpy (bfloat16 comes out as float32)."""
    tensor = scope.find_var(name).get_tensor()
    value = np.array(tensor)
    if value.dtype == np.uint16 and "bfloat16" in str(tensor._dtype()):  # bf16 bits
        value = (value.astype(np.uint32) << 16).view(np.float32)
    return value


def write_var(scope, name: str, value, place) -> None:
    """Write ``value`` into a scope variable, converted to the variable's dtype (shape checked)."""
    var = scope.find_var(name)
    if var is None:
        raise KeyError(name)
    tensor = var.get_tensor()
    current = np.array(tensor)
    value = np.asarray(value.numpy() if isinstance(value, paddle.Tensor) else value)
    if list(current.shape) != list(value.shape):
        raise ConfigError(f"checkpoint value for '{name}' has shape {list(value.shape)}, "
                          f"the program expects {list(current.shape)}")
    if current.dtype == np.uint16 and value.dtype != np.uint16:  # float -> bf16 bits, round to nearest even
        bits = value.astype(np.float32).view(np.uint32)
        value = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    tensor.set(value.astype(current.dtype, copy=False), place)


def shared_tensor(dense) -> paddle.Tensor:
    """A paddle Tensor over the memory of a ``DenseTensor`` (e.g. a scope variable's): in-place ops
    on it change the variable, on its device. The place must be the tensor's own: paddle copies
    across places (``InitTensorWithFrameworkTensor``, paddle/fluid/pybind/eager.cc)."""
    return paddle.Tensor(dense, place=dense._place())


def scope_tensor(scope, name: str) -> paddle.Tensor:
    return shared_tensor(scope.find_var(name).get_tensor())


def share_float32_views(source_scope, target_scope, bindings: Dict[str, str]) -> None:
    """Make ``target_scope``'s variable ``name`` share the memory of ``source_scope``'s variable
    ``bindings[name]`` (low-precision sources are cast to float32 on their device first): a float32
    program then reads the other program's state without a copy through host memory."""
    for name, source in bindings.items():
        dense = source_scope.find_var(source).get_tensor()
        if dense._dtype() != paddle.float32:
            cast = shared_tensor(dense).astype("float32")
            target_scope.var(name).get_tensor()._share_data_with(cast.get_tensor())
        else:
            target_scope.var(name).get_tensor()._share_data_with(dense)


def inner_optimizer(optimizer):
    """The optimizer that owns accumulators and master weights (under ``paddle.amp.decorate``)."""
    return getattr(optimizer, "_optimizer", optimizer)


def master_weight_names(optimizer) -> Dict[str, str]:
    """Parameter program name -> its float32 master variable name (empty without AMP O2)."""
    if optimizer is None:
        return {}
    masters = getattr(inner_optimizer(optimizer), "_master_weights", None) or {}
    return {param: var.name for param, var in masters.items()}


@dataclass
class LossScaling:
    """The loss-scaling variables of a static AMP program and the scaler's fixed settings."""
    scale: str
    incr_count: Optional[str] = None   # num_good_steps (dynamic loss scaling only)
    decr_count: Optional[str] = None   # num_bad_steps
    settings: Dict[str, object] = field(default_factory=dict)  # incr_ratio, ..., use_dynamic_loss_scaling


class ScopeState:
    """Reads and writes a static program's state in the dynamic trainer's checkpoint layout.

    ``var_names``: structured name -> program name; ``dyn_names``: structured name -> the dynamic
    model's parameter name (``.pdopt`` keys); ``param_order``: program names in the dynamic
    optimizer's parameter order.
    """

    def __init__(self, scope, place, var_names: Dict[str, str], dyn_names: Dict[str, str], optimizer=None,
                 param_order: Sequence[str] = (), loss_scaling: Optional[LossScaling] = None,
                 ema_shadow: Optional[Dict[str, str]] = None):
        self.scope, self.place = scope, place
        self.var_names, self.dyn_names = var_names, dyn_names
        self.optimizer = inner_optimizer(optimizer) if optimizer is not None else None
        self.param_order = list(param_order)
        self.loss_scaling = loss_scaling
        self.ema_shadow = ema_shadow or {}
        self.master_names = master_weight_names(optimizer)

    def get(self, name: str) -> np.ndarray:
        return read_var(self.scope, name)

    def set(self, name: str, value) -> None:
        write_var(self.scope, name, value, self.place)

    # ------------------------------------------------------------------ model
    def model_state(self) -> Dict[str, np.ndarray]:
        """Structured name -> float32 value: the fp32 master where AMP O2 keeps one (the parameter is
        its rounded copy), as the dynamic trainer saves (``ppdlx.engine.amp.float32_state``)."""
        state = {}
        for n, v in self.var_names.items():
            value = self.get(self.master_names.get(v, v))
            state[n] = value.astype(np.float32) if value.dtype == np.float16 else value
        return state

    def float32_sources(self, shadows: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        """Program name -> the scope variable holding its float32 value: ``shadows`` (structured name
        -> variable, e.g. the EMA's) first, then the master, then the variable itself."""
        shadows = shadows or {}
        return {v: shadows.get(n) or self.master_names.get(v, v) for n, v in self.var_names.items()}

    def set_model_state(self, state: dict) -> None:
        """Write weights into the parameters and, under AMP O2, into their float32 masters (the
        optimizer steps from the master: a parameter written alone is overwritten at the first update)."""
        for name, value in state.items():
            var = self.var_names.get(name)
            if var is None:
                continue
            self.set(var, value)
            if var in self.master_names:
                self.set(self.master_names[var], np.asarray(
                    value.numpy() if isinstance(value, paddle.Tensor) else value, dtype=np.float32))

    # ------------------------------------------------------------------ optimizer
    def accumulators(self) -> List[tuple]:
        """``(key in .pdopt, scope variable, accumulator kind)`` in the dynamic optimizer's order."""
        if self.optimizer is None:
            return []
        struct_of = {v: n for n, v in self.var_names.items()}
        param_of_master = {m: p for p, m in self.master_names.items()}
        order = {name: i for i, name in enumerate(self.param_order)}
        rows = []
        for kind, per_owner in self.optimizer._accumulators.items():
            kind_rows = []
            for owner, var in per_owner.items():
                param = param_of_master.get(owner, owner)
                struct = struct_of.get(param)
                key = var.name
                if struct is not None and key.startswith(param):
                    key = self.dyn_names.get(struct, param) + key[len(param):]
                kind_rows.append((order.get(param, len(order)), key, var.name, kind))
            rows += [r[1:] for r in sorted(kind_rows)]
        return rows

    def _masters_in_order(self) -> List[tuple]:
        """``(structured name, master variable)`` in the dynamic optimizer's parameter order."""
        struct_of = {v: n for n, v in self.var_names.items()}
        return [(struct_of[p], self.master_names[p]) for p in self.param_order if p in self.master_names]

    def optimizer_state(self) -> dict:
        state = {key: paddle.to_tensor(self.get(var)) for key, var, _ in self.accumulators()}
        masters = self._masters_in_order()
        if masters:
            state["master_weights"] = {self.dyn_names.get(n, self.var_names[n]): paddle.to_tensor(self.get(m))
                                       for n, m in masters}
        return state

    def set_optimizer_state(self, state: dict) -> None:
        rows = self.accumulators()
        values = {k: v for k, v in state.items() if k not in ("LR_Scheduler", "master_weights")}
        if all(key in values for key, _, _ in rows):
            for key, var, _ in rows:
                self.set(var, values[key])
        else:
            # The file's parameter names come from another process (another build history): match
            # per accumulator kind in the dynamic optimizer's parameter order, checking shapes.
            for kind in dict.fromkeys(r[2] for r in rows):
                mine = [r for r in rows if r[2] == kind]
                pattern = re.compile(rf"_{re.escape(kind)}_\d+$")
                theirs = [k for k in values if pattern.search(k)]
                self._set_in_order(f"'{kind}' entries", [values[k] for k in theirs], [r[1] for r in mine])
            log.info("optimizer state matched by parameter order (names came from another process)")
        if state.get("master_weights") and self.master_names:
            self._set_masters(state["master_weights"])

    def _set_masters(self, saved: dict) -> None:
        masters = self._masters_in_order()
        by_key = {self.dyn_names.get(n, self.var_names[n]): m for n, m in masters}
        if all(k in saved for k in by_key):
            for key, var in by_key.items():
                self.set(var, saved[key])
        else:  # other process: the dynamic optimizer keeps masters in its parameter order too
            self._set_in_order("master weights", list(saved.values()), [m for _, m in masters])

    def _set_in_order(self, what: str, values: list, variables: List[str]) -> None:
        ok = len(values) == len(variables) and all(
            list(np.shape(v)) == list(self.get(var).shape) for v, var in zip(values, variables))
        if not ok:
            raise ConfigError(f"optimizer state: the checkpoint's {what} do not match this model's parameters "
                              f"({len(values)} vs {len(variables)}); resume with model.weights=<prefix> instead "
                              f"to start the optimizer fresh")
        for value, var in zip(values, variables):
            self.set(var, value)

    # ------------------------------------------------------------------ loss scaling
    def scaler_state(self) -> Optional[dict]:
        """``GradScaler.state_dict()``'s layout, or None without loss scaling."""
        ls = self.loss_scaling
        if ls is None:
            return None
        count = (lambda name: int(self.get(name).reshape(-1)[0]) if name else 0)
        return {**ls.settings, "scale": self.get(ls.scale).astype(np.float32).reshape(1),
                "incr_count": count(ls.incr_count), "decr_count": count(ls.decr_count)}

    def set_scaler_state(self, state: dict) -> None:
        """Scale and step counts from a checkpoint; ratios and intervals stay the config's (they are
        attributes of the program's ops)."""
        ls = self.loss_scaling
        if ls is None:
            return
        self.set(ls.scale, np.asarray(state["scale"], np.float32).reshape(1))
        for name, key in ((ls.incr_count, "incr_count"), (ls.decr_count, "decr_count")):
            if name:
                self.set(name, np.asarray([int(state.get(key, 0))], np.int32))

    # ------------------------------------------------------------------ EMA
    def ema_state(self, updates: int) -> Optional[dict]:
        if not self.ema_shadow:
            return None
        return {"updates": updates, "shadow": {n: self.get(s) for n, s in self.ema_shadow.items()}}

    def set_ema_shadow(self, shadow: dict) -> None:
        for n, value in shadow.items():
            if n in self.ema_shadow:
                self.set(self.ema_shadow[n], np.asarray(value, np.float32))
