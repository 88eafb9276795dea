"""No training step reads anything back from the device per micro-batch: per optimizer step only the skip
decision (one scalar) when there is no loss scaler, none with one (docs/gpu.md). On a GPU every such read
waits for the device to drain. Observed by counting the paddle.Tensor methods that copy to the host while
real training steps run -- every shipped training config, on both data backends, with its recipe's model,
optimizer, EMA and (classification) Mixup and CutMix, at tiny sizes."""
import paddle
import pytest

from ppdlx.config import load_config
from ppdlx.data.synthetic_coco import make_synthetic_coco
from ppdlx.engine.hooks import Hook
from ppdlx.engine.run import build_training
from ppdlx.tasks.detection import DetectionObjective

HOST_READS = ("__bool__", "__float__", "__int__", "__index__", "numpy", "item", "tolist", "__array__")
CLASSIFICATION = ["rn50_amp", "rn50_tf32", "efficientnet_lite0"] + [
    f"gpunet/gpunet_{name}" for name in ("0", "1", "2", "d1", "d2", "p0", "p1")]
DETECTION = ["efficientdet_d0"]


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


class ReadsPerStep(Hook):
    """The host-read count at each optimizer step's end: the difference of two is one whole step."""

    def __init__(self, counts):
        self.counts, self.marks = counts, []

    def after_step(self):
        self.marks.append(self.counts["n"])


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("host_sync_coco"))
    make_synthetic_coco(root, num_train=16, num_val=4, seed=5, size_range=(48, 80))
    return root


def _overrides(name, root, out, backend):
    tiny = [f"global.output_dir={out}", "global.device=cpu", "global.log_interval=1000",
            "global.cpu_fast_kernels=false", "amp.enabled=false", f"data.backend={backend}", "data.workers=0",
            "data.dali.device=cpu", "data.dali.num_threads=1", "train.accumulate=2",
            "train.steps_per_epoch=3", "train.epochs=1", "lr.warmup_epochs=0", "lr.base_lr=0.001",
            "lr.scale_with_batch=false", f"data.root={root}"]  # a tiny batch: a small lr keeps every weight finite
    if name in DETECTION:
        return tiny + ["data.batch_size=2", "data.coco.train_json=annotations/instances_train.json",
                       "data.coco.val_json=annotations/instances_val.json", "data.coco.train_images=train",
                       "data.coco.val_images=val", "data.coco.image_size=64", "model.num_classes=3"]
    # batch 4: at 2, GPUNet-2's 1x1 maps at 32 px make degenerate BatchNorm statistics and NaN weights
    return tiny + ["data.batch_size=4", "model.num_classes=4", "data.transforms.crop_size=32",
                   "data.transforms.resize_short=32", "train.mixup_alpha=0.2", "train.cutmix_alpha=1.0"]


@pytest.mark.parametrize("backend", ["paddle", "dali"])
@pytest.mark.parametrize("name", CLASSIFICATION + DETECTION)
def test_a_recipe_reads_at_most_the_skip_decision_per_step(name, backend, tiny_tree, shapes, tmp_path,
                                                          count_host_reads):
    path = f"configs/{name}.yaml"
    recipe = load_config(path)
    cfg = load_config(path, _overrides(name, shapes if name in DETECTION else tiny_tree, tmp_path, backend))
    probe = ReadsPerStep(count_host_reads)
    trainer = build_training(cfg, [probe])
    scaled = recipe.amp.enabled and recipe.amp.dtype == "float16"
    if scaled:
        # The recipe's GPU run has a loss scaler: the real GradScaler object, which Paddle disables on a CPU
        # place (scale/step/update pass through), so the trainer's scaler branch runs as on a GPU.
        trainer.step.scaler = paddle.amp.GradScaler(enable=True, init_loss_scaling=recipe.amp.init_loss_scaling)
    if name in DETECTION:
        assert isinstance(trainer.step.objective, DetectionObjective)
    trainer.train_one_epoch()
    assert trainer.global_step == 3 and len(probe.marks) == 3
    # between the first step (set-up) and the last (the epoch's progress line reads the loss and the counts)
    per_step = [b - a for a, b in zip(probe.marks, probe.marks[1:])][:-1]
    assert max(per_step) <= (0 if scaled else 1), (name, backend, per_step)
    if not scaled:  # the skip decision is read: the count sees reads at all
        assert min(per_step) == 1, per_step


@pytest.mark.parametrize("with_scaler, per_step", [(False, 1), (True, 0)])
def test_host_reads_per_optimizer_step(tiny_tree, tmp_path, count_host_reads, with_scaler, per_step):
    cfg = load_config("configs/demo/rn50_demo.yaml", [
        f"data.root={tiny_tree}", "model.name=resnet18_bottleneck_tiny", "model.num_classes=4", "data.workers=0",
        "data.backend=dali", "global.cpu_fast_kernels=false", f"global.output_dir={tmp_path}",
        "data.batch_size=4", "train.accumulate=2", "train.steps_per_epoch=6", "global.log_interval=1000"])
    probe = ReadsPerStep(count_host_reads)
    trainer = build_training(cfg, [probe])
    if with_scaler:
        trainer.step.scaler = paddle.amp.GradScaler(enable=True, init_loss_scaling=1.0)
    trainer.train_one_epoch()
    # accumulate=2: two micro-batches per step. Before: one bool() per micro-batch.
    assert [b - a for a, b in zip(probe.marks, probe.marks[1:])][:-1] == [per_step] * 4
