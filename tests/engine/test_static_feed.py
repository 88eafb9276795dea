"""The static trainer keeps batches where the loader put them: paddle Tensors are fed to the
executor as their DenseTensor, never through numpy (a device -> host -> device copy per batch
on GPU). Observed by wrapping Paddle's own host-copy entry points with a recorder."""
import contextlib

import numpy as np
import paddle
import pytest
from paddle.base import core

from ppdlx.config import load_config
from ppdlx.engine.run import build_training


@contextlib.contextmanager
def host_copies():
    """Records ``(method, elements)`` for every copy between a tensor and host numpy memory made
    through Paddle's Python API while active: ``paddle.Tensor.numpy`` and
    ``DenseTensor.__array__`` (tensor -> numpy), ``DenseTensor.set`` (numpy -> tensor). The real
    methods still run."""
    copies = []

    def wrap(mp, cls, name, elements):
        real = getattr(cls, name)

        def recorded(self, *args, **kwargs):
            out = real(self, *args, **kwargs)
            copies.append((f"{cls.__name__}.{name}", elements(args, out)))
            return out
        mp.setattr(cls, name, recorded)

    with pytest.MonkeyPatch.context() as mp:
        wrap(mp, paddle.Tensor, "numpy", lambda args, out: int(np.size(out)))
        wrap(mp, core.DenseTensor, "__array__", lambda args, out: int(np.size(out)))
        wrap(mp, core.DenseTensor, "set", lambda args, out: int(np.size(args[0])))
        yield copies


def synthetic_cfg(out, *extra):
    return load_config(None, [
        f"global.output_dir={out}", "global.device=cpu", "global.log_interval=1", "global.cpu_fast_kernels=false",
        "model.name=resnet18_bottleneck_tiny", "model.num_classes=4", "data.backend=synthetic",
        "data.synthetic.num_images=24", "data.batch_size=8", "data.transforms.crop_size=32", "train.epochs=1",
        "lr.base_lr=0.1", "lr.warmup_epochs=0", "train.graph=static", "train.mixup_alpha=0", *extra])


def test_observer_sees_host_copies():
    ones = paddle.ones([4])  # get_tensor() borrows from it: keep it alive
    dense = core.DenseTensor()
    with host_copies() as copies:
        paddle.ones([2, 3]).numpy()
        np.array(ones.get_tensor())
        dense.set(np.ones(5, np.float32), paddle.CPUPlace())
    assert [n for _, n in copies] == [6, 4, 5]


def test_training_steps_move_only_scalars_between_host_and_device(tmp_path):
    trainer = build_training(synthetic_cfg(tmp_path, "ema.enabled=true"))
    before = trainer.step.model_state()
    with host_copies() as copies:
        trainer.train_one_epoch()
    assert trainer.global_step == 3
    big = [c for c in copies if c[1] > 1]
    assert big == [], big
    # per step: the LR, EMA decay and 1 - decay in (host -> device); loss and finite flag out; and at each log
    # line (log_interval=1 here) the weights' all-finite flag
    assert len(copies) == (5 + 1) * trainer.global_step
    after = trainer.step.model_state()
    assert max(float(np.abs(after[k] - before[k]).max()) for k in before) > 0  # it trained


def test_feed_shares_the_loader_tensor_memory():
    from ppdlx.engine.static.feed import as_feed
    images = paddle.arange(24, dtype="float32").reshape([2, 3, 2, 2])
    fed = as_feed(images, "float32")
    assert isinstance(fed, core.DenseTensor) and fed._ptr() == images.get_tensor()._ptr()  # no copy
    labels = as_feed(paddle.to_tensor([[1], [2]], dtype="int32"), "int64", flat=True)  # cast where it lives
    assert labels.shape() == [2] and str(labels._dtype()) == "paddle.int64"
    assert np.array(labels).tolist() == [1, 2]
