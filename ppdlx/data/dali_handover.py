"""Where DALI runs and how its outputs become paddle tensors, shared by the DALI loaders.

Both devices use the same code: the loader calls ``pipeline.run()`` and passes every output
through ``to_paddle``; only the DALI operator devices and ``device_id`` differ.
``nvidia.dali.plugin.paddle.DALIGenericIterator`` is not used: with the dynamic executor it
only wraps ``__dlpack__(stream=current stream)`` in ``core.from_dlpack`` (DALI 2.4
``plugin/paddle.py:348-353``) and so yields bare ``DenseTensor`` objects, which have no tensor
methods and which layers refuse. ``paddle.utils.dlpack.from_dlpack`` makes the same call with
paddle's current stream and wraps the result as a ``paddle.Tensor`` (Paddle 3.3
``utils/dlpack.py:227-260``).
"""
from __future__ import annotations

import collections

import numpy as np
import paddle
from nvidia.dali.backend import TensorListCPU, TensorListGPU

from ppdlx.errors import UnsupportedError


def resolve_dali_device(setting: str) -> str:
    """``data.dali.device``: ``auto`` is ``gpu`` where paddle runs on a CUDA device, else ``cpu``."""
    if setting != "auto":
        return setting
    return "gpu" if paddle.is_compiled_with_cuda() and paddle.get_device().startswith("gpu") else "cpu"


def check_device(setting: str) -> str:
    """The DALI device ``data.dali.device`` gives here; ``gpu`` is refused unless paddle runs on a CUDA device."""
    dali_device = resolve_dali_device(setting)
    if dali_device != "gpu":
        return dali_device
    if not (paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0):
        raise UnsupportedError(
            f"data.dali.device=gpu: this Paddle build has no CUDA device (paddle.is_compiled_with_cuda() is "
            f"{paddle.is_compiled_with_cuda()}), so DALI's GPU outputs cannot reach paddle; set data.dali.device=cpu")
    if not paddle.get_device().startswith("gpu"):
        raise UnsupportedError(
            f"data.dali.device=gpu: paddle runs on {paddle.get_device()}, so every GPU batch would be copied "
            f"back; set global.device=gpu or data.dali.device=cpu")
    return dali_device


def dali_device_id(dali_device: str) -> int | None:
    """``device_id`` for the pipeline: the GPU paddle runs on, or None for a CPU-only pipeline."""
    if dali_device != "gpu":
        return None
    return int(paddle.get_device().split(":")[1])


def to_paddle(output, device: str | None = None) -> paddle.Tensor:
    """A DALI output (or what DALI's paddle plugin makes of one) as a ``paddle.Tensor`` on ``device``.

    Accepts a dense ``TensorListCPU``/``TensorListGPU`` (one tensor for the whole batch), a
    ``TensorCPU``/``TensorGPU`` (``as_tensor()``, ``tl[i]``), a numpy array (``TensorListCPU.at(i)``),
    a ``DenseTensor`` (``core.from_dlpack``, as DALI's iterator yields) or a ``paddle.Tensor``.
    DALI buffers are shared, not copied; with the dynamic executor DALI never reuses an output
    while the tensor holds it. For a GPU buffer, ``from_dlpack`` passes paddle's current stream to
    ``__dlpack__`` and DALI makes that stream wait until the data is ready; when the tensor may be
    dropped is :class:`HeldBatches`'s business. ``device`` (``"cpu"``, ``"gpu:0"``; None keeps DALI's
    place) copies only when the data is elsewhere.
    """
    if isinstance(output, (TensorListCPU, TensorListGPU)):
        output = output.as_tensor()
    if isinstance(output, paddle.framework.core.DenseTensor):
        output = paddle.Tensor(output, place=output._place())
    elif not isinstance(output, paddle.Tensor):
        output = paddle.utils.dlpack.from_dlpack(output)
    return output if device is None else output.to(device=device)


FLOAT32_EXACT = 1 << 24  # integers up to this magnitude travel exactly in float32


def upload_together(arrays, device: str):
    """Host arrays (same leading dimension) as paddle tensors on ``device``, in one host-to-device copy: packed
    side by side in one float32 array (each integer array checked to travel exactly), copied, and sliced and
    cast back on the device. ``(tensors, staging)``: on a GPU the copy is asynchronous from pinned memory on
    paddle's stream, and ``staging`` (that pinned buffer) must stay referenced until paddle's stream has passed
    the copy (``HeldBatches``); None on CPU."""
    rows = len(arrays[0])
    flat = [np.asarray(a).reshape(rows, -1) for a in arrays]
    for a, f in zip(arrays, flat):
        if np.issubdtype(f.dtype, np.integer) and f.size and np.abs(f).max() >= FLOAT32_EXACT:
            raise ValueError(f"an integer array of shape {np.shape(a)} holds values beyond float32's exact range")
    packed = np.concatenate([f.astype(np.float32, copy=False) for f in flat], axis=1)
    staging = None
    if device.startswith("gpu"):
        staging = paddle.to_tensor(packed, place=paddle.CPUPlace()).pin_memory()
        tensor = staging._copy_to(paddle.CUDAPlace(int(device.split(":")[1])), False)
    else:
        tensor = paddle.to_tensor(packed, place=paddle.CPUPlace())
    out, start = [], 0
    for a, f in zip(arrays, flat):
        part = tensor[:, start:start + f.shape[1]].reshape(list(np.shape(a)))
        out.append(part if f.dtype == np.float32 else part.astype(str(f.dtype)))
        start += f.shape[1]
    return out, staging


def _on_gpu(batch) -> bool:
    if isinstance(batch, (tuple, list)):
        return any(_on_gpu(item) for item in batch)
    return isinstance(batch, paddle.Tensor) and batch.place.is_gpu_place()


class HeldBatches:
    """The last ``window`` batches a DALI loader handed out, each let go once paddle's stream has passed it.

    A GPU output shared through DLPack returns to DALI's memory pool when paddle drops it on the host,
    and DALI writes later batches into that memory on its own stream: nothing orders this after the
    paddle kernels that read the batch, which the host may only have queued (an accumulation window's
    micro-batches and precise BN read nothing back). So a batch stays referenced until an event,
    recorded on paddle's stream when the consumer asked for the next batch, has completed: ``window``
    batches later it has, unless the GPU is that far behind, and then the host waits for it.
    """

    def __init__(self, window: int):
        self.window = window
        self._held = collections.deque()

    def consumed(self, batch, *staging) -> None:
        """``batch``'s consumer asked for the next one: all its work on ``batch`` (and on the pinned ``staging``
        buffers copied into it) is queued."""
        event = None
        if _on_gpu(batch):
            event = paddle.device.Event()
            event.record()
        self._held.append(((batch, staging), event))
        while len(self._held) > self.window:
            _, event = self._held.popleft()
            if event is not None:
                event.synchronize()

    def release_all(self) -> None:
        """At the end of a pass (or when the consumer left it): wait for paddle's stream once, let all go."""
        if any(_on_gpu(batch) for batch, _ in self._held):
            event = paddle.device.Event()
            event.record()
            event.synchronize()
        self._held.clear()

    def __len__(self) -> int:
        return len(self._held)
