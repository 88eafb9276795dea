"""What differs between Paddle's two static IRs (PIR, legacy) and the guards static programs need.

IR modes: PIR (Paddle's default) is the primary path. Legacy IR (``FLAGS_enable_pir_api=0``)
also trains, bit-identically for ResNets: Paddle 3.3.1's generated ``paddle.sum`` accepts only
PIR values in static mode, so while tracing under legacy IR it is routed to the legacy
``reduce_sum`` op (:func:`legacy_ir_ops`); the other ops used in programs are built from ones both
IRs accept (:func:`is_finite_scalar`, :func:`both`).
"""
from __future__ import annotations

import contextlib
from typing import Optional

import paddle
from paddle.base.framework import Variable, _dygraph_guard
from paddle.base.layer_helper import LayerHelper

from ppdlx.errors import UnsupportedError


def use_pir() -> bool:
    return bool(paddle.base.framework.use_pir_api())


def ir_name() -> str:
    return "PIR" if use_pir() else "legacy IR (FLAGS_enable_pir_api=0)"


@contextlib.contextmanager
def static_graph():
    """Static mode for the duration (program building, ``Executor.run``) without touching the
    dygraph state around it (``paddle.enable_static()`` would swap the unique-name generator and
    the default programs; this only switches the tracer off)."""
    if not paddle.in_dynamic_mode():
        yield
        return
    with _dygraph_guard(None):
        yield


@contextlib.contextmanager
def legacy_ir_ops():
    """Under legacy IR, route ``paddle.sum`` / ``Tensor.sum`` to the legacy ``reduce_sum`` op.

    Paddle 3.3.1's generated ``sum`` (like ``isfinite``, ``all``, ``logical_*``, ``sigmoid``,
    ``floor``) accepts only PIR values in static mode ("must be Value, but got Variable"); the
    loss needs ``sum``, and the programs avoid the others. A no-op under PIR; restored on exit.
    """
    if use_pir():
        yield
        return
    orig_sum, orig_method = paddle.sum, Variable.sum

    def legacy_sum(x, axis=None, dtype=None, keepdim=False, name=None):
        if not isinstance(x, Variable) or dtype is not None:
            return orig_sum(x, axis=axis, dtype=dtype, keepdim=keepdim, name=name)
        helper = LayerHelper("reduce_sum")
        out = helper.create_variable_for_type_inference(dtype=x.dtype)
        dims = [] if axis is None else ([axis] if isinstance(axis, int) else list(axis))
        helper.append_op(type="reduce_sum", inputs={"X": x}, outputs={"Out": out},
                         attrs={"dim": dims, "keep_dim": bool(keepdim), "reduce_all": axis is None})
        return out

    paddle.sum, Variable.sum = legacy_sum, legacy_sum
    try:
        yield
    finally:
        paddle.sum, Variable.sum = orig_sum, orig_method


def is_finite_scalar(x):
    """``x - x == 0`` is False exactly for NaN and +-inf; built from ops both IRs accept."""
    return (x - x) == 0.0


def both(a, b):
    """Logical and of two bool scalars without ``paddle.logical_and`` (PIR-only in 3.3.1)."""
    return (paddle.cast(a, "float32") * paddle.cast(b, "float32")) > 0.5


def global_var(name: str, shape, dtype="float32", value=0.0):
    """A persistable variable initialised to ``value`` in the startup program."""
    if use_pir():  # create_global_var mixes VarType/DataType under PIR in 3.3.1
        return paddle.pir.core.create_persistable_value(
            dtype, list(shape), name=name, initializer=paddle.nn.initializer.Constant(value))
    return paddle.static.create_global_var(shape=list(shape), value=value, dtype=dtype, persistable=True,
                                           name=name)


def collective_value(out, fallback):
    """``paddle.distributed.all_reduce`` returns the reduced value in PIR, None/task in legacy."""
    return out if isinstance(out, (paddle.pir.Value, paddle.base.framework.Variable)) else fallback


def onednn_flag() -> Optional[str]:
    """The oneDNN flag that is switched on (``FLAGS_use_onednn`` / ``FLAGS_use_mkldnn``), if any."""
    for name in ("FLAGS_use_onednn", "FLAGS_use_mkldnn"):
        try:
            if paddle.get_flags(name)[name]:
                return name
        except Exception:  # noqa: BLE001 - flag unknown to this build
            continue
    return None


def check_graph_flags(graph: str) -> None:
    """``to_static`` and ``static`` training crash with oneDNN switched on (dygraph ignores it)."""
    flag = onednn_flag()
    if flag:
        raise UnsupportedError(
            f"train.graph={graph} with {flag}=1: Paddle {paddle.__version__}'s oneDNN kernels fail in static "
            f"training programs (to_static: 'dst_tensor shall be defined' or a segfault; static: dnnl::error in "
            f"pool2d_grad); unset {flag} (dynamic training ignores it) or use train.graph=dynamic")
