"""Whether static AMP trains on this machine: one throwaway AMP step of the configured model.

Paddle 3.3.1's CPU build here: no float16 conv2d/matmul/momentum kernels (PIR refuses the ops
while building); bf16 O1/O2 cast batch_norm's input to bf16, which has no CPU kernel, bf16
momentum/adamw have none either, and bf16 matmul/conv2d raise ``dnnl::error`` in oneDNN without
AVX512-BF16. The one bf16 optimizer kernel, sgd, ignores the fp32 master weights
(paddle/phi/kernels/cpu/sgd_kernel.cc), so O2 would train the bf16 copies while the masters --
what is saved, evaluated and averaged -- stay put: the probe checks that the masters moved.
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import Tuple

import numpy as np
import paddle

from ppdlx.data.mixing import MixDraw
from ppdlx.engine.amp import AmpPlan
from ppdlx.engine.static import amp as static_amp
from ppdlx.engine.static.ir_compat import static_graph, use_pir
from ppdlx.engine.static.program import ProgramSpec, Programs, build_programs
from ppdlx.engine.static.state import master_weight_names, read_var
from ppdlx.errors import paddle_error_line


def _probe_feed(pr: Programs, data_format: str, size: int, num_classes: int) -> dict:
    shape = [2, 3, size, size] if data_format == "NCHW" else [2, size, size, 3]
    half = np.asarray([0.5], np.float32)
    values = {"images": np.random.default_rng(0).standard_normal(shape).astype(np.float32),
              "labels": np.asarray([0, 1 % num_classes], np.int64), **MixDraw(0.5, 0.5).feed(),
              "ema_decay": half, "ema_rest": half, "apply_now": np.asarray([True])}
    return {name: values[name] for name in pr.feeds}


def amp_step_trains_here(spec: ProgramSpec, input_size: int, num_classes: int, optimizer_name: str, dtype: str,
                         level: str) -> Tuple[bool, str]:
    """One AMP train step built by :func:`build_programs` (batch of 2, throwaway programs and scope,
    CPU). Returns ``(True, "")`` or ``(False, why)``."""
    spec = dataclasses.replace(spec, accumulate=1)  # accumulation is refused with AMP separately
    scope = paddle.static.Scope()
    try:
        with warnings.catch_warnings(), static_graph(), paddle.static.scope_guard(scope):
            warnings.simplefilter("ignore")
            pr = build_programs(spec, 0.1, AmpPlan(True, dtype, level, False), world=1)
            exe = paddle.static.Executor(paddle.CPUPlace())
            exe.run(pr.startup, scope=scope)
            masters = {n: read_var(scope, n).copy() for n in master_weight_names(pr.optimizer).values()}
            feed = _probe_feed(pr, spec.data_format, input_size, num_classes)
            out = exe.run(pr.main, feed=feed, fetch_list=[pr.loss], scope=scope)
        if not np.isfinite(out[0]).all():
            return False, "the probe step's loss is not finite"
        if masters and all(np.array_equal(v, read_var(scope, n)) for n, v in masters.items()):
            return False, (f"the {optimizer_name} step left the fp32 master weights unchanged: its CPU "
                           f"kernel ignores multi_precision")
        return True, ""
    except Exception as err:  # noqa: BLE001 - any failure means "not usable"
        return False, paddle_error_line(err)


def plan_static_amp(amp_cfg, device: str, spec: ProgramSpec, input_size: int, num_classes: int,
                    optimizer_name: str) -> AmpPlan:
    """What static AMP does for these programs on ``device`` (:func:`ppdlx.engine.static.amp.plan`)."""
    return static_amp.plan(amp_cfg, device, use_pir(), probe=lambda dtype, level: amp_step_trains_here(
        spec, input_size, num_classes, optimizer_name, dtype, level))
