"""``ASPHook``: prune at the start of training, keep the n:m masks through every step.

Dense gradients, masked weights: after every optimizer step the hook multiplies each
pruned weight in place by its precomputed mask tensor (same dtype and place as the
weight, no numpy round trip). It also masks

* the fp32 master weights an AMP O2 / ``multi_precision`` optimizer keeps
  (``optimizer._master_weights``; they appear at the optimizer's first step, so the
  hook looks them up until then);
* the EMA shadow (``trainer.ema.shadow``): masked when training starts and after every
  epoch (before the checkpoint is written). In between no per-step work is needed: the
  hook runs before ``ema.update`` and ``shadow*d + w*(1-d)`` keeps every masked entry
  exactly 0 (``0*d + 0*(1-d) == 0``), which the tests check step by step.
  ``ema_every_step=True`` masks it after every step anyway.

Gradient accumulation needs nothing extra: the hook runs once per optimizer step.

Static graph (``ppdlx.engine.static_trainer.StaticTrainer``, recognised by its ``scope``
and ``var_names``): the weights live in the scope, so the hook masks them there by name
with :func:`ppdlx.sparsity.static.apply_masks_to_scope` (in place on their device, masks
built once on that device), and masks the EMA shadow variables every step too (the program
updates them before the hook runs), plus the AMP O2 master weights the trainer lists in
``master_names``.

Masks and the rules that made them are saved in the checkpoint (``.pdstates``, key
``hook:asp``); on resume they are restored instead of recomputed, so the run keeps
exactly the same masks.
"""
from __future__ import annotations

import logging
from typing import Dict, Mapping, Optional

import numpy as np
import paddle

from ppdlx.engine.static_state import shared_tensor
from ppdlx.errors import ConfigError
from ppdlx.sparsity.masks import KINDS, compute_mask, density, nm_violations, pack_mask, unpack_mask
from ppdlx.sparsity.rules import SparsityRules, scan_model
from ppdlx.sparsity.static import apply_masks_to_scope, device_mask

log = logging.getLogger("ppdlx.asp")

_LOW_PRECISION = (paddle.float16, paddle.bfloat16)


def _master_weights(optimizer) -> dict:
    for opt in (optimizer, getattr(optimizer, "_inner_opt", None), getattr(optimizer, "_optimizer", None)):
        mw = getattr(opt, "_master_weights", None)
        if isinstance(mw, dict) and mw:
            return mw
    return {}


def _as_float32_numpy(t) -> np.ndarray:
    if t.dtype != paddle.float32:
        t = t.astype("float32")
    return t.numpy()


def _mask_tensor(mask: np.ndarray, like) -> paddle.Tensor:
    t = paddle.to_tensor(mask.astype(np.float32), place=like.place)
    return t if like.dtype == paddle.float32 else t.astype(like.dtype)


class ASPHook:
    """Trainer hook for n:m structured sparsity (``name = "asp"``).

    ``ASPHook(n=2, m=4, mask_algo="mask_1d", exclude=(), prune_classifier=False,
    layer_types=("conv2d", "linear"))`` or ``ASPHook.from_config(cfg.asp)``. Outside the
    trainer: ``hook.attach(model, optimizer, ema)`` prunes, then call ``hook.apply()``
    after each ``optimizer.step()``.
    """

    name = "asp"

    def __init__(self, n: int = 2, m: int = 4, mask_algo: str = "mask_1d", exclude=(),
                 prune_classifier: bool = False, layer_types=KINDS, ema_every_step: bool = False):
        self.rules = SparsityRules(n=n, m=m, mask_algo=mask_algo, exclude=tuple(exclude),
                                   prune_classifier=prune_classifier, layer_types=tuple(layer_types))
        self.ema_every_step = ema_every_step
        self.masks: Optional[Dict[str, np.ndarray]] = None   # structured param name -> bool mask
        self.restored = False
        self.model = None
        self.entries = []
        self._optimizer = None
        self._ema = None
        self._param_targets = []     # (param, mask in the param's dtype)
        self._master_targets = []    # (fp32 master weight, fp32 mask)
        self._pending_masters = []   # (param, fp32 mask): low-precision params whose master is not created yet
        self._ema_targets = []       # (fp32 shadow, fp32 mask)
        self._static = None          # a StaticTrainer: weights are scope variables
        self._scope_masks = {}       # scope variable name -> mask tensor (its dtype, its device)

    @classmethod
    def from_config(cls, asp_cfg, **kwargs) -> "ASPHook":
        rules = SparsityRules.from_config(asp_cfg)
        return cls(n=rules.n, m=rules.m, mask_algo=rules.mask_algo, exclude=rules.exclude,
                   prune_classifier=rules.prune_classifier, layer_types=rules.layer_types, **kwargs)

    # ------------------------------------------------------------------ masks
    def compute_masks(self, model, optimizer=None) -> Dict[str, np.ndarray]:
        """Masks from the current weights (fp32 master copies when the optimizer has them)."""
        masters = _master_weights(optimizer) if optimizer is not None else {}
        masks = {}
        for e in scan_model(model, self.rules):
            if e.prune:
                if self._static is not None:
                    w = self._read_static(e.param)
                else:
                    w = _as_float32_numpy(masters.get(e.tensor.name, e.tensor))
                masks[e.param] = compute_mask(w, e.kind, self.rules.n, self.rules.m, self.rules.mask_algo)
        return masks

    def _read_static(self, name: str) -> np.ndarray:
        t = self._static
        var = t.var_names[name]
        w = t.get_var(getattr(t, "master_names", {}).get(var, var))
        return w.astype(np.float32, copy=False)

    def attach(self, model, optimizer=None, ema=None) -> None:
        """Compute (or take the restored) masks and apply them to weights, master weights and EMA."""
        self.model, self._optimizer, self._ema = model, optimizer, ema
        self.entries = scan_model(model, self.rules)
        pruned = {e.param: e for e in self.entries if e.prune}
        if self.masks is None:
            self.masks = self.compute_masks(model, optimizer)
        else:
            missing = sorted(set(pruned) - set(self.masks))
            extra = sorted(set(self.masks) - set(pruned))
            if missing or extra:
                name = (missing or extra)[0]
                raise ConfigError(f"asp: the checkpoint's masks do not fit this model ({len(missing)} prunable "
                                  f"weights without a mask, {len(extra)} masks without a prunable weight, e.g. "
                                  f"'{name}'); resume with the same model.name/num_classes and asp settings")
            for name, e in pruned.items():
                if list(self.masks[name].shape) != e.shape:
                    raise ConfigError(f"asp: saved mask for '{name}' has shape {list(self.masks[name].shape)} "
                                      f"but the weight has {e.shape}")
        if self._static is not None:
            self._build_scope_targets(pruned)
        else:
            self._build_targets(pruned)
        self.apply(include_ema=True)
        total = sum(int(np.prod(e.shape)) for e in self.entries)
        kept = sum(int(np.prod(e.shape)) for e in pruned.values())
        skipped = [f"{e.layer} ({e.reason})" for e in self.entries if not e.prune]
        log.info("asp: %s %s masks %s on %d of %d conv/linear weights (%.1f%% of their parameters); dense: %s",
                 self.rules.pattern, self.rules.mask_algo, "restored from the checkpoint" if self.restored
                 else "computed", len(pruned), len(self.entries), 100.0 * kept / max(total, 1),
                 ", ".join(skipped) or "none")

    def _build_targets(self, pruned) -> None:
        self._param_targets, self._master_targets, self._pending_masters, self._ema_targets = [], [], [], []
        masters = _master_weights(self._optimizer) if self._optimizer is not None else {}
        shadow = getattr(self._ema, "shadow", None) or {}
        for name, e in pruned.items():
            p = e.tensor
            mask = self.masks[name]
            mk = _mask_tensor(mask, p)
            self._param_targets.append((p, mk))
            mk32 = mk if p.dtype == paddle.float32 else _mask_tensor(mask, paddle.zeros([1], "float32"))
            if p.name in masters:
                self._master_targets.append((masters[p.name], mk32))
            elif p.dtype in _LOW_PRECISION and self._optimizer is not None:
                self._pending_masters.append((p, mk32))
            if name in shadow:
                self._ema_targets.append((shadow[name], mk32 if shadow[name].dtype == paddle.float32
                                          else _mask_tensor(mask, shadow[name])))

    def attach_static(self, trainer) -> None:
        """:meth:`attach` for a static-graph trainer (``scope``, ``var_names``, ``place``, ``model``)."""
        self._static = trainer
        self.attach(trainer.model)

    def _build_scope_targets(self, pruned) -> None:
        t = self._static
        shadow = getattr(getattr(t, "pr", None), "ema_shadow", None) or {}
        masters = getattr(t, "master_names", {})
        self._scope_masks = {}
        for name in pruned:
            param = t.var_names[name]
            for var_name in (param, masters.get(param), shadow.get(name)):
                var = t.scope.find_var(var_name) if var_name else None
                if var is not None:
                    self._scope_masks[var_name] = device_mask(self.masks[name], shared_tensor(var.get_tensor()))

    def _resolve_masters(self) -> None:
        masters = _master_weights(self._optimizer)
        if not masters:
            return
        still = []
        for p, mk32 in self._pending_masters:
            if p.name in masters:
                self._master_targets.append((masters[p.name], mk32))
            else:
                still.append((p, mk32))
        self._pending_masters = still

    @paddle.no_grad()
    def apply(self, include_ema: bool = False) -> None:
        """Multiply every pruned weight (and master copy) by its mask, in place."""
        if self._static is not None:  # the program updated the EMA already: mask it every step
            apply_masks_to_scope(self._static.scope, self._scope_masks)
            return
        if self._pending_masters:
            self._resolve_masters()
        for p, mk in self._param_targets:
            p.multiply_(mk)
        for w, mk in self._master_targets:
            w.multiply_(mk)
        if include_ema or self.ema_every_step:
            for s, mk in self._ema_targets:
                s.multiply_(mk)

    def apply_to_ema(self) -> None:
        if self._static is not None:
            return self.apply()
        with paddle.no_grad():
            for s, mk in self._ema_targets:
                s.multiply_(mk)

    # ------------------------------------------------------------- trainer API
    def before_train(self, trainer) -> None:
        if hasattr(trainer, "scope") and hasattr(trainer, "var_names"):
            self.attach_static(trainer)
        else:
            self.attach(trainer.raw_model, trainer.optimizer, trainer.ema)

    def after_optimizer_step(self, trainer) -> None:
        self.apply()

    def after_epoch(self, trainer, metrics) -> None:
        self.apply_to_ema()

    def state_dict(self) -> dict:
        return {"version": 1, "rules": self.rules.to_dict(),
                "masks": {k: pack_mask(v) for k, v in (self.masks or {}).items()}}

    def set_state_dict(self, state: Mapping) -> None:
        saved = dict(state["rules"])
        mine = self.rules.to_dict()
        for key in mine:
            if saved.get(key) != mine[key]:
                raise ConfigError(f"asp.{key}={mine[key]!r} but the checkpoint being resumed was pruned with "
                                  f"asp.{key}={saved.get(key)!r}; resume with the checkpoint's asp settings "
                                  f"(masks must not change mid-run) or start a new run from its weights")
        self.masks = {k: unpack_mask(v) for k, v in state["masks"].items()}
        self.restored = True
        if self._static is not None:  # restored after attach: re-target and re-apply
            self.attach_static(self._static)
        elif self.model is not None:
            self.attach(self.model, self._optimizer, self._ema)

    # ---------------------------------------------------------------- reports
    def layer_report(self, model=None) -> list:
        """One row per Conv2D/Linear weight: status, density, n:m violations (current weights)."""
        model = model if model is not None else self.model
        rows = []
        for e in scan_model(model, self.rules):
            w = self._read_static(e.param) if self._static is not None and model is self.model \
                else _as_float32_numpy(e.tensor)
            row = {"layer": e.layer, "kind": e.kind, "shape": "x".join(map(str, e.shape)),
                   "params": int(np.prod(e.shape)), "density": round(density(w), 4)}
            if e.prune:
                bad, groups = nm_violations(w, e.kind, self.rules.n, self.rules.m)
                row.update(status=self.rules.pattern if bad == 0 else "VIOLATED", bad_groups=bad, note="")
            else:
                row.update(status="dense", bad_groups=0, note=e.reason)
            rows.append(row)
        return rows


def ensure_asp_hook(cfg, hooks=()) -> list:
    """``hooks`` plus an ``ASPHook`` from ``cfg.asp`` when ``asp.enabled`` and none is there yet."""
    hooks = list(hooks)
    if getattr(cfg.asp, "enabled", False) and not any(getattr(h, "name", None) == ASPHook.name for h in hooks):
        hooks.append(ASPHook.from_config(cfg.asp))
    return hooks
