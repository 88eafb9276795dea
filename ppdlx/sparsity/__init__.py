"""n:m structured sparsity (ASP, 2:4 by default) owned by ppdlx.

Paddle's ``paddle.incubate.asp.decorate`` fails in dynamic mode under PIR and its
ASP-wrapped optimizer breaks ``minimize``-style loops, so ppdlx computes and keeps the
masks itself (masks match ``paddle.incubate.asp.create_mask`` for 2:4; tests check it):

* :mod:`.masks` -- ``compute_mask(weight, kind, n, m, algo)`` (``mask_1d``,
  ``mask_2d_greedy``), ``nm_violations``, matrix views of conv / linear weights;
* :mod:`.rules` -- ``SparsityRules`` and ``scan_model``: which weights are pruned and why not;
* :mod:`.hook` -- ``ASPHook`` for ``ppdlx.engine.trainer.Trainer``;
* :mod:`.static` -- ``apply_masks`` / ``apply_masks_to_scope`` by parameter name
  (static-graph trainers);
* :mod:`.check` -- ``check_path`` for checkpoints and exported models;
* :mod:`.flops` -- per-layer MACs for the "share of FLOPs made sparse" report.
"""
from ppdlx.sparsity.check import SparsityCheckError, check_path, raise_on_violation  # noqa: F401
from ppdlx.sparsity.hook import ASPHook, ensure_asp_hook  # noqa: F401
from ppdlx.sparsity.masks import (compute_mask, is_nm_sparse, mask_1d, mask_2d_greedy,  # noqa: F401
                                  nm_violations)
from ppdlx.sparsity.rules import SparsityRules, scan_model  # noqa: F401
from ppdlx.sparsity.static import apply_masks, apply_masks_to_scope, masks_by_param_name  # noqa: F401

__all__ = ["ASPHook", "ensure_asp_hook", "SparsityRules", "scan_model", "compute_mask", "mask_1d",
           "mask_2d_greedy", "nm_violations", "is_nm_sparse", "apply_masks", "apply_masks_to_scope",
           "masks_by_param_name", "check_path", "raise_on_violation", "SparsityCheckError"]
