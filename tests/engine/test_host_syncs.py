"""The dynamic trainer reads nothing back from the device per micro-batch, and per optimizer step only
the skip decision (one scalar) when there is no loss scaler; with a scaler, none. On a GPU every such
read waits for the device to drain. Observed by counting the paddle.Tensor methods that copy to the
host while real training steps run."""
import paddle
import pytest

from ppdlx.config import load_config
from ppdlx.engine.run import build_training

HOST_READS = ("__bool__", "__float__", "__int__", "__index__", "numpy", "item", "tolist")


@pytest.fixture
def count_host_reads(monkeypatch):
    counts = {"n": 0, "depth": 0}
    for name in HOST_READS:
        original = getattr(paddle.Tensor, name, None)
        if original is None:
            continue

        def counted(self, *a, _original=original, **k):
            counts["n"] += counts["depth"] == 0  # bool() calls numpy() inside: one read
            counts["depth"] += 1
            try:
                return _original(self, *a, **k)
            finally:
                counts["depth"] -= 1

        monkeypatch.setattr(paddle.Tensor, name, counted)
    return counts


def _reads_for(tree, tmp_path, steps, count_host_reads, with_scaler):
    cfg = load_config("configs/demo/rn50_demo.yaml", [
        f"data.root={tree}", "model.name=resnet18_bottleneck_tiny", "model.num_classes=4", "data.workers=0",
        "data.backend=dali", "global.cpu_fast_kernels=false", f"global.output_dir={tmp_path / str(steps)}",
        "data.batch_size=4", "train.accumulate=2", f"train.steps_per_epoch={steps}", "global.log_interval=1000"])
    trainer = build_training(cfg)
    if with_scaler:
        # The real GradScaler object; on a CPU place Paddle disables it (scale/step/update pass through),
        # so the scaler branch of the trainer runs as it would on a GPU.
        trainer.step.scaler = paddle.amp.GradScaler(enable=True, init_loss_scaling=1.0)
    trainer.train_one_epoch()  # warm-up: first-batch set-up reads are not per step
    start = count_host_reads["n"]
    trainer.train_one_epoch()
    assert trainer.global_step == 2 * steps
    return count_host_reads["n"] - start


@pytest.mark.parametrize("with_scaler, per_step", [(False, 1), (True, 0)])
def test_host_reads_per_optimizer_step(tiny_tree, tmp_path, count_host_reads, with_scaler, per_step):
    few = _reads_for(tiny_tree, tmp_path, 2, count_host_reads, with_scaler)
    many = _reads_for(tiny_tree, tmp_path, 6, count_host_reads, with_scaler)
    # 4 more optimizer steps = 8 more micro-batches (accumulate=2). Before: one bool() per micro-batch.
    assert many - few == 4 * per_step, (few, many)
