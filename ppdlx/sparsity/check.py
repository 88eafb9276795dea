"""Verify the n:m pattern on a checkpoint or an exported inference model.

What is checked, by source:

* checkpoint (``output/x/latest``, either layout of ``ppdlx.checkpoint.files``; verified, so a
  damaged file is one line naming it) written by a run with ``ASPHook``: exactly the weights its saved
  masks cover (``.pdstates`` ``hook:asp``), with the saved ``n:m``; the EMA shadow in ``.pdstates`` is
  checked too (one summary row);
* checkpoint without ASP state: the rules of :mod:`ppdlx.sparsity.rules` applied to
  ``model`` when one is given (built from the config), else shape rules on the state
  dict: 4-D ``[Cout, Cin, kh, kw]`` with ``Cin % m == 0`` and 2-D ``[in, out]`` with
  ``in % m == 0``, the last 2-D weight being the classifier;
* ONNX file (``inference.onnx``, e.g. the route to TensorRT's sparse kernels): the weights
  (initializers, or Constant nodes) feeding ``Conv`` (``group == 1``) or ``MatMul``/``Gemm``,
  by the same shape rules as an exported program;
* exported model (``inference.json`` or ``inference.pdmodel`` + ``inference.pdiparams``
  from ``paddle.jit.save``): the program is loaded with
  ``paddle.static.load_inference_model`` and every weight feeding a ``conv2d``
  (``groups == 1``) or ``matmul``/``fc`` is judged by shape (``Cin % m == 0``); the last
  matmul is the classifier. Parameter names there are program names (``conv2d_5.w_0``),
  shown with the op's layer path when the program records it.

An export's files are checked first as deploy checks them (:mod:`ppdlx.sparsity.export_files`), so a damaged
``.pdiparams``/``.json``/``.pdmodel``/``.onnx`` is one line naming it.

A weight passes when no group of ``m`` consecutive input channels holds more than
``n`` non-zeros (what TensorRT's sparse kernels require).
"""
from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import paddle

from ppdlx.checkpoint.files import locate, read_checkpoint
from ppdlx.checkpoint.unit import CheckpointError, is_unit
from ppdlx.errors import DataError, UnsupportedError
from ppdlx.sparsity.export_files import REEXPORT_ONNX, check_inference_files, read_onnx
from ppdlx.sparsity.masks import density, nm_violations, unpack_mask
from ppdlx.sparsity.rules import SparsityRules, scan_model


class SparsityCheckError(DataError):
    """A weight that should be n:m sparse is not."""
    exit_code = 1


@dataclass
class Target:
    layer: str                 # what the table shows
    kind: str                  # "conv2d" | "linear"
    array: np.ndarray = field(repr=False)
    prune: bool = True
    reason: str = ""


def _to_float_numpy(v) -> np.ndarray:
    if isinstance(v, paddle.Tensor):
        return (v if v.dtype == paddle.float32 else v.astype("float32")).numpy()
    arr = np.asarray(v)
    if arr.dtype == np.uint16:  # bfloat16 bit patterns
        return (arr.astype(np.uint32) << 16).view(np.float32)
    return arr


def check_targets(targets: List[Target], n: int, m: int) -> list:
    rows = []
    for t in targets:
        row = {"layer": t.layer, "kind": t.kind, "shape": "x".join(str(s) for s in t.array.shape),
               "params": int(t.array.size), "density": round(density(t.array), 4)}
        if t.prune:
            bad, groups = nm_violations(t.array, t.kind, n, m)
            row.update(status=f"{n}:{m}" if bad == 0 else "VIOLATED", bad_groups=bad, groups=groups,
                       note="" if bad == 0 else f"{bad} of {groups} groups have more than {n} non-zeros of {m}")
        else:
            row.update(status="dense", bad_groups=0, groups=0, note=t.reason)
        rows.append(row)
    return rows


def first_violation(rows) -> Optional[dict]:
    return next((r for r in rows if r["status"] == "VIOLATED"), None)


# --------------------------------------------------------------------- sources
def resolve_source(path: str):
    """``("checkpoint" | "inference" | "onnx", prefix or file)`` for a file, prefix or directory."""
    if path.endswith(".onnx"):
        if not os.path.isfile(path):
            raise DataError(f"--check {path}: file not found")
        return "onnx", path
    if os.path.isdir(path) and not is_unit(path):
        found = sorted(glob.glob(os.path.join(path, "*.pdiparams")))
        if found:
            preferred = os.path.join(path, "inference.pdiparams")
            return "inference", (preferred if preferred in found else found[0])[: -len(".pdiparams")]
        kind, where = locate(os.path.join(path, "latest"))  # a run's output directory
        if kind:
            return "checkpoint", where
        raise DataError(f"--check {path}: the directory holds no *.pdiparams (exported model) "
                        f"and no latest checkpoint")
    kind, where = locate(path)  # a checkpoint (either layout), by any of its names
    if kind:
        return "checkpoint", where
    prefix = path
    for suffix in (".pdiparams.info", ".pdiparams", ".json", ".pdmodel", ".pdparams", ".pdopt", ".pdstates"):
        if prefix.endswith(suffix):
            prefix = prefix[: -len(suffix)]
            break
    if os.path.isfile(prefix + ".pdiparams") and (os.path.isfile(prefix + ".json")
                                                 or os.path.isfile(prefix + ".pdmodel")):
        return "inference", prefix
    raise DataError(f"--check {path}: neither a checkpoint ({prefix}.pdparams) nor an exported model "
                    f"({prefix}.pdiparams + {prefix}.json or .pdmodel)")


def _checkpoint_targets(prefix: str, rules: SparsityRules, model=None):
    try:  # verified (a unit's manifest) or loaded whole (earlier layout): damage is one line naming the file
        loaded = read_checkpoint(prefix, ("model", "states"), require=("model",))
    except CheckpointError as err:
        raise DataError(f"--check {prefix}: {err}") from None
    state, states = loaded["model"], loaded["states"] or {}
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        state = state["model"]
    asp_state = states.get("hook:asp") if isinstance(states, dict) else None
    extra = []
    if asp_state is not None:
        saved = asp_state["rules"]
        rules = SparsityRules(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in saved.items()})
        masked = set(asp_state["masks"])
        targets = []
        for name, value in state.items():
            arr = _to_float_numpy(value)
            kind = {4: "conv2d", 2: "linear"}.get(arr.ndim)
            if kind is None:
                continue
            layer = name[: -len(".weight")] if name.endswith(".weight") else name
            if name in masked:
                targets.append(Target(layer, kind, arr))
            else:
                targets.append(Target(layer, kind, arr, prune=False, reason="no ASP mask (not eligible)"))
        missing = sorted(masked - set(state))
        if missing:
            raise DataError(f"--check {prefix}: the ASP state masks '{missing[0]}' but the .pdparams has no such "
                            f"weight")
        ema = states.get("ema", {}).get("shadow", {}) if isinstance(states.get("ema"), dict) else {}
        if ema:
            ema_arrays = {k: _to_float_numpy(ema[k]) for k in sorted(masked) if k in ema}
            bad = [(k, nm_violations(a, {4: "conv2d", 2: "linear"}[a.ndim], rules.n, rules.m)[0])
                   for k, a in ema_arrays.items()]
            bad = [(k, b) for k, b in bad if b]
            total = sum(a.size for a in ema_arrays.values())
            nz = sum(int(np.count_nonzero(a)) for a in ema_arrays.values())
            extra.append({"layer": f"ema shadow ({len(ema_arrays)} masked weights)", "kind": "ema",
                          "shape": "-", "params": int(total), "density": round(nz / max(total, 1), 4),
                          "status": f"{rules.n}:{rules.m}" if not bad else "VIOLATED",
                          "bad_groups": int(sum(b for _, b in bad)), "groups": 0,
                          "note": "" if not bad else f"first violating EMA weight '{bad[0][0]}'"})
        # the saved masks themselves must be n:m (cheap consistency check)
        for name in sorted(masked):
            mask = unpack_mask(asp_state["masks"][name])
            kind = {4: "conv2d", 2: "linear"}[mask.ndim]
            if nm_violations(mask, kind, rules.n, rules.m)[0]:
                raise DataError(f"--check {prefix}: the saved ASP mask of '{name}' is not {rules.pattern}")
        return targets, rules, extra, "checkpoint with ASP state"
    if model is not None:
        targets = []
        for e in scan_model(model, rules):
            if e.param not in state:
                continue
            targets.append(Target(e.layer, e.kind, _to_float_numpy(state[e.param]), e.prune, e.reason))
        return targets, rules, extra, "checkpoint, rules from the config's model"
    candidates = []
    for name, value in state.items():
        arr = _to_float_numpy(value)
        if arr.ndim in (2, 4):
            candidates.append((name, arr))
    last_2d = max((i for i, (_, a) in enumerate(candidates) if a.ndim == 2), default=None)
    targets = []
    for i, (name, arr) in enumerate(candidates):
        kind = "conv2d" if arr.ndim == 4 else "linear"
        layer = name[: -len(".weight")] if name.endswith(".weight") else name
        targets.append(_shape_rule_target(layer, kind, arr, rules, i == last_2d, names=(layer, name)))
    return targets, rules, extra, "checkpoint, shape rules"


def _shape_rule_target(layer, kind, arr, rules: SparsityRules, is_classifier, groups=1, names=()):
    cin = arr.shape[1] if kind == "conv2d" else arr.shape[0]
    reason = ""
    if groups > 1:
        reason = "depthwise conv" if cin == 1 else f"grouped conv (groups={groups})"
    elif kind == "conv2d" and cin == 1:
        reason = "depthwise conv"
    elif cin % rules.m:
        reason = f"{cin} input channels not a multiple of {rules.m}"
    elif kind not in rules.layer_types:
        reason = f"layer type {kind} not in asp.layer_types"
    elif is_classifier and not rules.prune_classifier:
        reason = "classifier (last matmul/linear)"
    else:
        pattern = rules.excluded(*(names or (layer,)))
        if pattern is not None:
            reason = f"excluded by pattern '{pattern}'"
    return Target(layer, kind, arr, prune=not reason, reason=reason)


_PIR_CONV = {"pd_op.conv2d": 1, "pd_op.fused_conv2d_add_act": 1}
_PIR_DWCONV = {"pd_op.depthwise_conv2d": 1}
_PIR_MATMUL = {"pd_op.matmul": 1, "pd_op.fc": 1}
_LEGACY_CONV = {"conv2d": "Filter", "fused_conv2d_add_act": "Filter", "conv2d_fusion": "Filter"}
_LEGACY_DWCONV = {"depthwise_conv2d": "Filter"}
_LEGACY_MATMUL = {"matmul_v2": "Y", "matmul": "Y", "mul": "Y", "fc": "W"}


def _pir_uses(program):
    """(op kind, param name, groups, transposed, layer path) for every weight-consuming op."""
    uses = []
    for op in program.global_block().ops:
        name = op.name()
        kind = "conv2d" if name in _PIR_CONV or name in _PIR_DWCONV else "linear" if name in _PIR_MATMUL else None
        if kind is None or op.num_operands() < 2:
            continue
        src = op.operand_source(1)
        d = src.get_defining_op()
        if d is None or d.name() != "builtin.parameter":
            continue
        attrs = op.attrs()
        groups = int(attrs.get("groups", 1) or 1)
        if name in _PIR_DWCONV:
            groups = max(groups, 2)
        transposed = bool(attrs.get("transpose_y", False))
        uses.append((kind, d.attrs()["parameter_name"], groups, transposed, str(attrs.get("struct_name", ""))))
    return uses


def _legacy_uses(program):
    uses = []
    block = program.global_block()
    # an int8 export's weights reach their op through a dequantize_linear (int8 tensor + scales)
    dequantized = {op.output("Y")[0]: op.input("X")[0] for op in block.ops if op.type == "dequantize_linear"}
    for op in block.ops:
        t = op.type
        if t in _LEGACY_CONV or t in _LEGACY_DWCONV:
            kind, slot = "conv2d", (_LEGACY_CONV.get(t) or _LEGACY_DWCONV[t])
        elif t in _LEGACY_MATMUL:
            kind, slot = "linear", _LEGACY_MATMUL[t]
        else:
            continue
        names = [dequantized.get(name, name) for name in op.input(slot)]
        if not names or not block.has_var(names[0]) or not block.var(names[0]).persistable:
            continue
        groups = int(op.attr("groups")) if op.has_attr("groups") else 1
        if t in _LEGACY_DWCONV:
            groups = max(groups, 2)
        transposed = bool(op.attr("trans_y")) if op.has_attr("trans_y") else \
            bool(op.attr("transpose_Y")) if op.has_attr("transpose_Y") else False
        uses.append((kind, names[0], groups, transposed, ""))
    return uses


def _pir_enabled() -> bool:
    try:
        return bool(paddle.get_flags(["FLAGS_enable_pir_api"])["FLAGS_enable_pir_api"])
    except Exception:  # noqa: BLE001 - older builds without the flag are legacy
        return False


def _inference_targets(prefix: str, rules: SparsityRules):
    has_json, has_pdmodel = os.path.isfile(prefix + ".json"), os.path.isfile(prefix + ".pdmodel")
    pir = _pir_enabled()
    if pir and not has_json:
        raise UnsupportedError(f"--check {prefix}.pdmodel: Paddle {paddle.__version__} reads the legacy "
                               f".pdmodel format only with FLAGS_enable_pir_api=0 (tools/prune_asp.py --check "
                               f"sets it itself)")
    if not pir and not has_pdmodel:
        raise UnsupportedError(f"--check {prefix}.json: a PIR (.json) model needs FLAGS_enable_pir_api=1")
    check_inference_files(prefix, ".json" if pir else ".pdmodel")
    was_dynamic = paddle.in_dynamic_mode()
    paddle.enable_static()
    try:
        exe = paddle.static.Executor(paddle.CPUPlace())
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope):
            try:
                program, _, _ = paddle.static.load_inference_model(prefix, exe)
            except Exception as err:  # noqa: BLE001 - corrupt/foreign files: one line
                raise DataError(f"--check {prefix}: cannot load the exported model ({type(err).__name__}: "
                                f"{str(err).splitlines()[0][:200]})") from None
            uses = _pir_uses(program) if pir else _legacy_uses(program)
            arrays = {}
            for _, pname, _, _, _ in uses:
                if pname not in arrays:
                    var = scope.find_var(pname)
                    if var is not None:
                        arrays[pname] = _to_float_numpy(np.array(var.get_tensor()))
    finally:
        if was_dynamic:
            paddle.disable_static()
    last_linear = max((i for i, u in enumerate(uses) if u[0] == "linear"), default=None)
    targets, seen = [], set()
    for i, (kind, pname, groups, transposed, path) in enumerate(uses):
        if pname in seen or pname not in arrays:
            continue
        seen.add(pname)
        arr = arrays[pname]
        if kind == "linear" and arr.ndim != 2 or kind == "conv2d" and arr.ndim != 4:
            continue
        if kind == "linear" and transposed:
            arr = arr.T  # stored [out, in]: check along the input dimension all the same
        layer = f"{pname} {path.strip('/')}" if path else pname
        targets.append(_shape_rule_target(layer, kind, arr, rules, i == last_linear, groups=groups,
                                          names=(pname, path.strip("/"))))
    return targets, rules, [], "exported model (" + (".json" if pir else ".pdmodel") + ")"


def _onnx_targets(path: str, rules: SparsityRules):
    """Weights of an ONNX file (initializers or Constant nodes) feeding ``Conv`` (with its ``group``)
    and ``MatMul``/``Gemm``, judged by shape like an exported program's; the last matmul is the classifier."""
    import onnx  # optional (ppdlx[onnx]): only an ONNX file needs it
    from onnx import numpy_helper  # optional, as above
    graph = read_onnx(path).graph
    arrays = {t.name: t for t in graph.initializer}
    arrays.update({n.output[0]: a.t for n in graph.node if n.op_type == "Constant" for a in n.attribute
                   if a.name == "value"})
    # a QDQ graph's weights are int8 initializers behind a DequantizeLinear
    arrays.update({n.output[0]: arrays[n.input[0]] for n in graph.node
                   if n.op_type == "DequantizeLinear" and n.input[0] in arrays})
    uses = []
    for node in graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "Conv" and len(node.input) > 1 and node.input[1] in arrays:
            uses.append(("conv2d", node.input[1], int(attrs.get("group", 1)), False))
        elif node.op_type in ("MatMul", "Gemm") and len(node.input) > 1 and node.input[1] in arrays:
            uses.append(("linear", node.input[1], 1, bool(attrs.get("transB", 0))))
    last_linear = max((i for i, u in enumerate(uses) if u[0] == "linear"), default=None)
    targets, seen = [], set()
    for i, (kind, name, groups, transposed) in enumerate(uses):
        try:
            arr = numpy_helper.to_array(arrays[name]).astype(np.float32)
        except ValueError as err:  # raw data shorter than the shape says: a file cut where protobuf still parses
            raise DataError(f"--check {path}: weight '{name}' is damaged ({err}); {REEXPORT_ONNX}") from None
        if name in seen or arr.ndim != (4 if kind == "conv2d" else 2):
            continue
        seen.add(name)
        targets.append(_shape_rule_target(name, kind, arr.T if transposed else arr, rules, i == last_linear,
                                          groups=groups, names=(name,)))
    return targets, rules, [], "ONNX model (.onnx weights)"


def check_path(path: str, rules: Optional[SparsityRules] = None, model=None) -> dict:
    """Check a checkpoint or an exported model. Returns ``{"source", "format", "pattern",
    "rows", "violations", "first_violation"}``; never raises for a violation (see
    :func:`raise_on_violation`)."""
    rules = rules or SparsityRules()
    fmt, prefix = resolve_source(path)
    if fmt == "checkpoint":
        targets, rules, extra, how = _checkpoint_targets(prefix, rules, model)
    elif fmt == "onnx":
        targets, rules, extra, how = _onnx_targets(prefix, rules)
    else:
        targets, rules, extra, how = _inference_targets(prefix, rules)
    rows = check_targets(targets, rules.n, rules.m) + extra
    bad = [r for r in rows if r["status"] == "VIOLATED"]
    pruned = [r for r in rows if r["status"] not in ("dense",) and r["kind"] != "ema"]
    return {"source": prefix, "format": how, "pattern": rules.pattern, "rows": rows, "checked": len(pruned),
            "violations": len(bad), "first_violation": bad[0]["layer"] if bad else None}


def raise_on_violation(result: dict) -> None:
    row = first_violation(result["rows"])
    if row is not None:
        raise SparsityCheckError(f"{result['source']}: layer '{row['layer']}' violates the {result['pattern']} "
                                 f"pattern ({row['note']}); {result['violations']} violating layer(s) in total")
    if result["checked"] == 0:
        raise SparsityCheckError(f"{result['source']}: no weight is eligible for the {result['pattern']} pattern "
                                 f"({result['format']}), nothing was checked")
