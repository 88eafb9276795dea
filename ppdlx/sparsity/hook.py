"""``ASPHook``: prune at the start of training, keep the n:m masks through every step.

Dense gradients, masked weights: after every applied optimizer step the hook multiplies each
pruned weight in place by its precomputed mask tensor (same dtype and place as the weight, no
numpy round trip). It reaches the weights through the step's
:class:`~ppdlx.optim.weight_copies.WeightAccess` (``trainer.step.weights()``), the same way in every graph
mode, and masks every stored copy of a pruned weight:

* the parameter, and the fp32 master weight an AMP O2 / ``multi_precision`` optimizer keeps
  (dygraph masters appear at the optimizer's first step, so the hook looks them up until then);
* the EMA shadow. When the EMA is updated after the hooks (the EMA hook, dygraph), it is masked
  when training starts and after every epoch (before the checkpoint is written); in between no
  per-step work is needed: ``shadow*d + w*(1-d)`` keeps every masked entry exactly 0
  (``0*d + 0*(1-d) == 0``), which the tests check step by step (``ema_every_step=True`` masks it
  after every step anyway). When the step updates it itself (static programs), it is masked after
  every step with the weights.

Gradient accumulation needs nothing extra: the hook runs once per optimizer step. Outside the
trainer: ``hook.attach(model, optimizer, ema)`` prunes, then call ``hook.apply()`` after each
``optimizer.step()``.

Masks and the rules that made them are saved in the checkpoint (``.pdstates``, key
``hook:asp``); on resume they are restored instead of recomputed, so the run keeps
exactly the same masks.
"""
from __future__ import annotations

import logging
from typing import Dict, Mapping, Optional

import numpy as np
import paddle

from ppdlx.errors import ConfigError
from ppdlx.optim.weight_copies import LayerWeights
from ppdlx.sparsity.masks import KINDS, compute_mask, density, nm_violations, pack_mask, unpack_mask
from ppdlx.sparsity.rules import SparsityRules, scan_model
from ppdlx.sparsity.static import device_mask

log = logging.getLogger("ppdlx.asp")


def _as_float32_numpy(t) -> np.ndarray:
    if t.dtype != paddle.float32:
        t = t.astype("float32")
    return t.numpy()


class ASPHook:
    """Trainer hook (``ppdlx.engine.hooks``) for n:m structured sparsity (``name = "asp"``).

    ``ASPHook(n=2, m=4, mask_algo="mask_1d", exclude=(), prune_classifier=False,
    layer_types=("conv2d", "linear"))`` or ``ASPHook.from_config(cfg.asp)``.
    """

    name = "asp"
    trainer = None  # set when a Trainer registers the hook

    def __init__(self, n: int = 2, m: int = 4, mask_algo: str = "mask_1d", exclude=(),
                 prune_classifier: bool = False, layer_types=KINDS, ema_every_step: bool = False):
        self.rules = SparsityRules(n=n, m=m, mask_algo=mask_algo, exclude=tuple(exclude),
                                   prune_classifier=prune_classifier, layer_types=tuple(layer_types))
        self.ema_every_step = ema_every_step
        self.masks: Optional[Dict[str, np.ndarray]] = None   # structured param name -> bool mask
        self.restored = False
        self.model = None
        self.entries = []
        self._access = None          # the WeightAccess the masks are applied through
        self._step_targets = []      # (getter, mask): masked after every step
        self._ema_targets = []       # (getter, mask): masked at the start and after every epoch
        self._master_targets = []    # the AMP O2 masters among the step targets
        self._pending_masters = []   # names whose master is not created yet
        self._mask_cache = {}        # (name, dtype, place) -> mask tensor

    @classmethod
    def from_config(cls, asp_cfg, **kwargs) -> "ASPHook":
        rules = SparsityRules.from_config(asp_cfg)
        return cls(n=rules.n, m=rules.m, mask_algo=rules.mask_algo, exclude=rules.exclude,
                   prune_classifier=rules.prune_classifier, layer_types=rules.layer_types, **kwargs)

    # ------------------------------------------------------------------ masks
    def _access_for(self, model, optimizer=None):
        if self._access is not None and model is self._access.model:
            return self._access
        return LayerWeights(model, optimizer)

    def compute_masks(self, model, optimizer=None) -> Dict[str, np.ndarray]:
        """Masks from the current weights (fp32 master copies when the optimizer has them)."""
        access = self._access_for(model, optimizer)
        return {e.param: compute_mask(access.read(e.param), e.kind, self.rules.n, self.rules.m, self.rules.mask_algo)
                for e in scan_model(model, self.rules) if e.prune}

    def attach(self, model, optimizer=None, ema=None) -> None:
        """Compute (or take the restored) masks and apply them to weights, master weights and EMA."""
        self.attach_to(LayerWeights(model, optimizer, ema))

    def attach_to(self, access) -> None:
        """:meth:`attach` through a :class:`~ppdlx.optim.weight_copies.WeightAccess` (``trainer.step.weights()``)."""
        self._access, self.model = access, access.model
        self.entries = scan_model(self.model, self.rules)
        pruned = {e.param: e for e in self.entries if e.prune}
        if self.masks is None:
            self.masks = self.compute_masks(self.model)
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
        self._build_targets(pruned)
        self.apply(include_ema=True)
        total = sum(int(np.prod(e.shape)) for e in self.entries)
        kept = sum(int(np.prod(e.shape)) for e in pruned.values())
        skipped = [f"{e.layer} ({e.reason})" for e in self.entries if not e.prune]
        log.info("asp: %s %s masks %s on %d of %d conv/linear weights (%.1f%% of their parameters); dense: %s",
                 self.rules.pattern, self.rules.mask_algo, "restored from the checkpoint" if self.restored
                 else "computed", len(pruned), len(self.entries), 100.0 * kept / max(total, 1),
                 ", ".join(skipped) or "none")

    def _mask_like(self, name: str, tensor) -> paddle.Tensor:
        key = (name, str(tensor.dtype), str(tensor.place))
        if key not in self._mask_cache:
            self._mask_cache[key] = device_mask(self.masks[name], tensor)
        return self._mask_cache[key]

    def _add_target(self, name: str, kind: str, get) -> None:
        target = (get, self._mask_like(name, get()))
        ema_later = kind == "ema" and not (self._access.ema_updated_in_step or self.ema_every_step)
        (self._ema_targets if ema_later else self._step_targets).append(target)
        if kind == "master":
            self._master_targets.append(target)

    def _build_targets(self, pruned) -> None:
        self._step_targets, self._ema_targets, self._master_targets = [], [], []
        self._pending_masters, self._mask_cache = [], {}
        for name in pruned:
            copies = self._access.copies(name)
            for kind, get in copies.items():
                self._add_target(name, kind, get)
            if "master" not in copies and self._access.masters_pending(name):
                self._pending_masters.append(name)

    def _resolve_masters(self) -> None:
        still = []
        for name in self._pending_masters:
            master = self._access.copies(name).get("master")
            if master is not None:
                self._add_target(name, "master", master)
            else:
                still.append(name)
        self._pending_masters = still

    @paddle.no_grad()
    def apply(self, include_ema: bool = False) -> None:
        """Multiply every pruned weight (and master copy) by its mask, in place."""
        if self._pending_masters:
            self._resolve_masters()
        for get, mk in self._step_targets:
            get().multiply_(mk)
        if include_ema:
            self.apply_to_ema()

    @paddle.no_grad()
    def apply_to_ema(self) -> None:
        for get, mk in self._ema_targets:
            get().multiply_(mk)

    # ------------------------------------------------------------- trainer API
    def before_train(self) -> None:
        self.attach_to(self.trainer.step.weights())

    def after_step(self) -> None:
        if self.trainer.result.applied:
            self.apply()

    def after_epoch(self) -> None:
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
        if self._access is not None:  # restored after attach: re-target and re-apply
            self.attach_to(self._access)

    # ---------------------------------------------------------------- reports
    def layer_report(self, model=None) -> list:
        """One row per Conv2D/Linear weight: status, density, n:m violations (current weights)."""
        model = model if model is not None else self.model
        rows = []
        for e in scan_model(model, self.rules):
            w = self._access.read(e.param) if self._access is not None and model is self.model \
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
