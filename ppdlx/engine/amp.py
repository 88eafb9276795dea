"""Automatic mixed precision: what the config asks for vs what this build can do.

Paddle 3.3.1's CPU build has no bf16 conv/matmul/batch_norm kernels and its
``auto_cast`` needs a CUDAPlace, so bf16 autocast on CPU changes nothing. We probe
that once; on CPU, bf16 then runs where ppdlx's oneDNN convolutions make it real and faster
(``ppdlx.models.cpu_bf16`` decides where), and elsewhere one line says why training runs in float32.
"""
from __future__ import annotations

import contextlib
import logging
import warnings
from dataclasses import dataclass

import numpy as np
import paddle

from ppdlx.checkpoint.files import set_state_cast
from ppdlx.errors import ConfigError, UnsupportedError
from ppdlx.models.cpu_bf16 import plan_cpu_bf16
from ppdlx.tasks import task_of_dataset

log = logging.getLogger("ppdlx.amp")


@dataclass
class AmpPlan:
    enabled: bool          # autocast actually runs
    dtype: str             # "float16" | "bfloat16" | "float32"
    level: str
    use_scaler: bool
    note: str = ""
    # CPU: Paddle's autocast is off (enabled False) and the oneDNN convolutions compute in bf16
    cpu_bf16_convs: bool = False


def bf16_autocast_works_on_cpu() -> bool:
    """Run one conv under bf16 autocast and look at the output dtype."""
    conv = paddle.nn.Conv2D(4, 4, 3)
    x = paddle.ones([1, 4, 8, 8])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with paddle.amp.auto_cast(True, dtype="bfloat16", level="O1"):
                y = conv(x)
        except Exception:  # noqa: BLE001 - any failure means "not usable"
            return False
    return y.dtype == paddle.bfloat16


def check_image_dtype(data_cfg, plan: AmpPlan, graph: str) -> None:
    """``data.dali.output_dtype: float16`` (the training batches of the classification DALI
    pipeline) feeds a float16 AMP forward; anywhere else the first convolution would meet float16
    images with float32 (or bf16) weights and fail deep inside Paddle, so it is one line here."""
    if data_cfg.backend != "dali" or data_cfg.dali.output_dtype != "float16":
        return
    if not task_of_dataset(data_cfg.dataset).dali_float16_images:
        raise ConfigError(f"data.dali.output_dtype=float16: the {data_cfg.dataset} DALI pipeline yields float32 "
                          f"images (its boxes are scaled in float32); set data.dali.output_dtype=float32")
    if not (plan.enabled and plan.dtype == "float16"):
        runs = (f"{plan.dtype} autocast" if plan.enabled else
                "float32 with bfloat16 convolutions" if plan.cpu_bf16_convs else "float32")
        raise ConfigError(f"data.dali.output_dtype=float16: this run's forward is {runs}, and float16 images would "
                          f"meet its weights in the first convolution; set amp.enabled=true amp.dtype=float16 "
                          f"(GPU) or data.dali.output_dtype=float32")
    if graph == "static":
        raise UnsupportedError("data.dali.output_dtype=float16 with train.graph=static: the static program's images "
                               "input is float32; set data.dali.output_dtype=float32 or train.graph=dynamic")


def plan_amp(amp_cfg, device: str, fast_cpu_kernels: bool = False, cpu_threads: int = 1) -> AmpPlan:
    if not amp_cfg.enabled:
        return AmpPlan(False, "float32", "O0", False)
    on_gpu = device.startswith("gpu")
    if amp_cfg.dtype == "float16" and not on_gpu:
        why = "this Paddle build has no CUDA" if not paddle.is_compiled_with_cuda() else "global.device is cpu"
        raise UnsupportedError(f"amp.dtype=float16 needs a GPU and {why}; "
                               f"use amp.dtype=bfloat16 or amp.enabled=false on CPU")
    if on_gpu:  # float16 with loss scaling, bfloat16 without
        check_gpu_amp(amp_cfg.dtype, *gpu_amp_facts(device))
        return AmpPlan(True, amp_cfg.dtype, amp_cfg.level, amp_cfg.dtype == "float16")
    if bf16_autocast_works_on_cpu():
        return AmpPlan(True, "bfloat16", amp_cfg.level, False)
    on, why = plan_cpu_bf16(amp_cfg.cpu_bf16, cpu_threads, fast_cpu_kernels)
    if on:
        return AmpPlan(False, "bfloat16", amp_cfg.level, False, cpu_bf16_convs=True, note=(
            f"amp: bfloat16 on CPU: convolutions train in bf16 through ppdlx's oneDNN op ({why}); in a ResNet the "
            f"activations between its layers are bf16 too; float32 master weights, loss and optimizer, no loss "
            f"scaling, evaluation in float32"))
    note = (f"amp: bfloat16 requested, but Paddle {paddle.__version__}'s CPU build has no bf16 training kernels "
            f"and ppdlx's bf16 convolutions are not used ({why}): training runs in float32; bf16 inference via "
            f"oneDNN is in deploy/")
    return AmpPlan(False, "float32", "O0", False, note)


# Below these NVIDIA compute capabilities (and for bf16 below CUDA 11) Paddle's auto_cast and decorate
# warn and leave the model float32 (``_is_gpu_float16_supported`` / ``_is_gpu_bfloat16_supported``).
GPU_AMP_MIN_CAPABILITY = {"float16": 7, "bfloat16": 8}


def gpu_amp_facts(device: str) -> tuple:
    """``(GPU name, (major, minor) compute capability, CUDA version)`` of ``device`` (``gpu:N``)."""
    index = int(device.split(":")[1]) if ":" in device else 0
    return (paddle.device.cuda.get_device_name(index), tuple(paddle.device.cuda.get_device_capability(index)),
            paddle.version.cuda())


def check_gpu_amp(dtype: str, gpu_name: str, capability: tuple, cuda_version: str) -> None:
    """Refuse what Paddle would quietly run in float32 while the run's plan said ``dtype``."""
    needed = GPU_AMP_MIN_CAPABILITY[dtype]
    cuda_major = int(cuda_version.split(".")[0]) if cuda_version and cuda_version[0].isdigit() else 0
    if capability[0] >= needed and (dtype == "float16" or cuda_major >= 11):
        return
    fix = "amp.dtype=float16" if dtype == "bfloat16" and capability[0] >= 7 else "amp.enabled=false"
    raise UnsupportedError(f"amp.dtype={dtype} needs an NVIDIA GPU of compute capability {needed}.0 or newer"
                           f"{' and CUDA 11 or newer' if dtype == 'bfloat16' else ''}, and Paddle trains in float32 "
                           f"on the others: {gpu_name} is {capability[0]}.{capability[1]} (CUDA {cuda_version}); "
                           f"use {fix}")


# Paddle's O1 lists (float16 and bfloat16 alike) name conv2d but not depthwise_conv2d (the op a conv with
# groups == channels traces, as EfficientNet's and GPUNet's do); an op off the list whose filter is float32
# runs in float32, so O1 left those networks' depthwise convolutions float32. Its GPU kernels take float16
# and bfloat16 (docs/gpu.md cites the registrations).
LOW_PRECISION_WHITE_LIST = {"depthwise_conv2d"}


def autocast(plan: AmpPlan):
    if not plan.enabled:
        return contextlib.nullcontext()
    return paddle.amp.auto_cast(True, custom_white_list=LOW_PRECISION_WHITE_LIST, dtype=plan.dtype,
                                level=plan.level)


def check_numpy_for_loss_scaler(numpy_version: str) -> None:
    """Paddle 3.3's loss scaler formats its shape-[1] scale with ``float()`` when it lowers it after an
    overflow (``GradScaler._update``), which NumPy 2.4 refuses for a 1-d array: an fp16 run would
    stop at its first overflow step."""
    major, minor = (int(part) for part in numpy_version.split(".")[:2])
    if (major, minor) >= (2, 4):
        raise UnsupportedError(f"amp: numpy {numpy_version} makes Paddle {paddle.__version__}'s loss scaler fail at "
                               f"the first overflow step (float() of its 1-element scale); pip install 'numpy<2.4'")


def build_scaler(plan: AmpPlan, amp_cfg):
    if not plan.use_scaler:
        return None
    check_numpy_for_loss_scaler(np.__version__)
    return paddle.amp.GradScaler(init_loss_scaling=amp_cfg.init_loss_scaling,
                                 incr_every_n_steps=amp_cfg.incr_every_n_steps,
                                 decr_every_n_nan_or_inf=amp_cfg.decr_every_n_nan_or_inf,
                                 use_dynamic_loss_scaling=amp_cfg.use_dynamic_loss_scaling)


# What a resume takes from a checkpoint's loss scaler: its progress. The ratios, intervals and the
# dynamic switch stay the config's, in both graph modes (the static program holds them as op
# attributes), so a resumed run follows a changed amp.* setting.
SCALER_PROGRESS = ("scale", "incr_count", "decr_count")


def resumed_scaler_state(config_state: dict, saved: dict) -> dict:
    """``GradScaler.load_state_dict``'s argument: ``config_state`` (the new scaler's ``state_dict()``)
    with the checkpoint's progress; Paddle's own load takes every setting from the checkpoint."""
    return {**config_state, **{key: saved[key] for key in SCALER_PROGRESS if key in saved}}


def clip_norms_in_float32() -> None:
    """O2 gradients are fp16, and Paddle's GPU squared_l2_norm returns its input's dtype, so the
    global-norm clip's sum of squares overflows to inf above a norm of 256 and the clip zeroes the
    whole update; Paddle's switch computes those norms in float32 (fp32 gradients unchanged). The
    dynamic clip reads it at each step, a static program while its update ops are appended."""
    paddle.nn.clip._clip_by_global_norm_using_mp_type(True)


# Paddle adds a coupled L2 weight decay to the gradient in the gradient's dtype, reading the float32
# master only when the two dtypes differ (Optimizer._create_regularization_of_grad): under O2 both are
# low precision, so 1e-5 * w rounds away against most gradients. Momentum and AdamW apply their decay
# inside their kernels, on the masters.
O2_DECAY_ON_MASTERS = ("momentum", "adamw")


def check_o2_weight_decay(plan: AmpPlan, optimizer_cfg) -> None:
    if plan.enabled and plan.level == "O2" and optimizer_cfg.weight_decay and \
            optimizer_cfg.name not in O2_DECAY_ON_MASTERS:
        raise UnsupportedError(f"amp.level=O2 with optimizer.name={optimizer_cfg.name} and optimizer.weight_decay="
                               f"{optimizer_cfg.weight_decay}: Paddle adds this optimizer's weight decay to the "
                               f"{plan.dtype} gradients in {plan.dtype}, where most of it rounds away; use "
                               f"amp.level=O1 (float32 weights) or optimizer.name "
                               f"{' or '.join(O2_DECAY_ON_MASTERS)}")


def decorate_o2(plan: AmpPlan, model, optimizer):
    """O2 keeps fp32 master weights in the optimizer (multi_precision) and casts the model's
    parameters in place (``paddle.amp.auto_cast.amp_initialize``; norms stay fp32). Everything that
    leaves the trainer -- checkpoints, EMA, evaluation -- goes through :func:`float32_state` /
    :func:`evaluated_in_float32`, so an O2 run saves, evaluates and exports float32 weights."""
    if plan.enabled and plan.level == "O2":
        clip_norms_in_float32()
        exact = {name: p.detach().clone() for name, p in model.named_parameters() if p.dtype == paddle.float32}
        model, optimizer = paddle.amp.decorate(models=model, optimizers=optimizer, level="O2",
                                               dtype=plan.dtype, master_weight=True)
        keep_exact_masters(model, optimizer, exact)
    return model, optimizer


def keep_exact_masters(model, optimizer, exact: dict) -> None:
    """Create the O2 masters of ``model``'s low-precision parameters from ``exact`` (structured name ->
    float32 value before the cast). Paddle creates each master at the first step as a cast of the
    rounded parameter, so a run started from float32 weights (``model.weights``: a fine-tune, an ASP
    prune) would lose their bits below float16's precision, which the static path keeps."""
    with paddle.no_grad():
        for name, p in model.named_parameters():
            if _is_low_precision(p) and name in exact:
                optimizer._create_master_weight(p)
                optimizer._master_weights[p.name].set_value(exact[name])


def _is_low_precision(tensor) -> bool:
    return tensor.dtype in (paddle.float16, paddle.bfloat16)


def float32_state(model, optimizer=None) -> dict:
    """``model.state_dict()`` in float32. Under O2 a parameter's exact value is the optimizer's fp32
    master weight (the fp16 parameter is its rounded copy), so that is taken where it exists."""
    masters = getattr(optimizer, "_master_weights", None) or {}
    state = {}
    for key, value in model.state_dict().items():
        if _is_low_precision(value):
            master = masters.get(value.name)
            value = master if master is not None else value.astype("float32")
        state[key] = value
    return state


@contextlib.contextmanager
def evaluated_in_float32(model, optimizer=None):
    """Within the block, an O2 model's fp16/bf16 parameters are float32 and hold the fp32 master
    weights: evaluation (and an EMA swap) then runs on exactly the weights a checkpoint saves and an
    export contains, and needs no autocast. Afterwards every parameter is back in its dtype with its
    bits unchanged. Outside O2 this does nothing."""
    low = {}
    for layer in model.sublayers(include_self=True):
        tensors = [t for t in list(layer._parameters.values()) + list(layer._buffers.values()) if t is not None]
        dtypes = {t.dtype for t in tensors if _is_low_precision(t)}
        if dtypes:
            low[layer] = dtypes.pop()
    if not low:
        yield model
        return
    state = float32_state(model, optimizer)
    saved = {key: value.clone() for key, value in model.state_dict().items() if _is_low_precision(value)}
    with paddle.no_grad():
        for layer in low:
            layer._to_impl(dtype="float32", include_sublayers=False, floating_only=True)
        set_state_cast(model, {key: state[key] for key in saved})
    try:
        yield model
    finally:
        with paddle.no_grad():
            for layer, dtype in low.items():
                # the in-place cast amp_initialize itself uses: the optimizer keeps its references
                layer._to_impl(dtype=dtype, include_sublayers=False, floating_only=True)
            set_state_cast(model, saved)
