"""Distillation: frozen teacher at its own resolution, bicubic-resized student input, CE + soft-target loss."""
import numpy as np
import paddle
import paddle.nn.functional as F
import pytest
import yaml

from ppdlx.config import load_config
from ppdlx.engine.run import build_training
from ppdlx.errors import ConfigError
from ppdlx.losses import LabelSmoothingCrossEntropy
from ppdlx.tasks.distill import DistillationObjective, build_distillation_objective, teacher_data_config


@pytest.fixture(scope="module")
def teacher(tiny_tree, tmp_path_factory):
    """A tiny ResNet teacher trained at 48 px with its own mean/std: (config path, checkpoint prefix)."""
    tmp = tmp_path_factory.mktemp("teacher")
    cfg = {"model": {"name": "resnet18_bottleneck_tiny", "num_classes": 4, "args": {"zero_init_last_bn": True}},
           "data": {"transforms": {"crop_size": 48, "resize_short": 48, "mean": [10.0, 20.0, 30.0],
                                   "std": [50.0, 60.0, 70.0], "random": False}}}
    path = tmp / "teacher.yaml"
    path.write_text(yaml.safe_dump(cfg))
    trainer = build_training(load_config(str(path), [
        f"data.root={tiny_tree}", f"global.output_dir={tmp / 'run'}", "global.device=cpu", "data.batch_size=8",
        "data.workers=0", "train.epochs=4", "lr.base_lr=0.05", "lr.scale_with_batch=false", "lr.warmup_epochs=0"]))
    trainer.fit()
    assert trainer.last_metrics["top1"] >= 0.6  # a teacher worth distilling from (0.875 when written)
    return str(path), str(tmp / "run" / "latest")


def _overrides(root, out, teacher_cfg, teacher_prefix, *extra):
    return [f"data.root={root}", f"global.output_dir={out}", "global.device=cpu", "global.log_interval=1",
            "model.name=resnet18_bottleneck_tiny", "model.num_classes=4", "data.batch_size=8", "data.workers=0",
            "data.transforms.crop_size=32", "data.transforms.resize_short=32", "data.transforms.random=false",
            "data.transforms.mean=[0,0,0]", "data.transforms.std=[255,255,255]",
            "train.epochs=3", "lr.base_lr=0.01", "lr.scale_with_batch=false", "lr.warmup_epochs=0",
            "model.args.zero_init_last_bn=true", "distill.enabled=true", f"distill.teacher_config={teacher_cfg}",
            f"distill.teacher_weights={teacher_prefix}", *extra]


def test_soft_target_term_matches_numpy_at_temperature_2():
    rng = np.random.default_rng(0)
    s, t = rng.standard_normal((5, 4)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)
    obj = DistillationObjective(LabelSmoothingCrossEntropy(4, 0.1), teacher=None, student_resolution=32,
                                temperature=2.0, weight=0.5)
    got = float(obj.soft_target_loss(paddle.to_tensor(s), paddle.to_tensor(t)))
    p_t = np.exp(t / 2) / np.exp(t / 2).sum(1, keepdims=True)
    log_p_s = s / 2 - np.log(np.exp(s / 2).sum(1, keepdims=True))
    assert got == pytest.approx(float((-(p_t * log_p_s).sum(1)).mean() * 4.0), rel=1e-5)


def test_distillation_trains_with_a_frozen_teacher_outside_the_checkpoint(tiny_tree, tmp_path, teacher):
    teacher_cfg, prefix = teacher
    cfg = load_config(None, _overrides(tiny_tree, tmp_path / "run", teacher_cfg, prefix))
    trainer = build_training(cfg)
    obj = trainer.step.objective
    assert isinstance(obj, DistillationObjective)
    net = obj.teacher
    teacher_before = {k: v.numpy().copy() for k, v in net.state_dict().items()}
    assert all(p.stop_gradient for p in net.parameters()) and not net.training
    # the loader makes teacher-resolution (48 px) batches; the student sees 32 px (bicubic)
    images, _ = next(iter(trainer.train_loader))
    assert list(images.shape[1:]) == [3, 48, 48]
    seen = []
    trainer.step.raw_model.register_forward_pre_hook(lambda layer, inputs: seen.append(list(inputs[0].shape[1:])))
    x = paddle.to_tensor(np.random.default_rng(0).standard_normal((2, 3, 48, 48)).astype(np.float32))
    np.testing.assert_allclose(obj.student_input(x).numpy(),
                               F.interpolate(x, size=[32, 32], mode="bicubic").numpy(), rtol=0, atol=0)
    # the batch is re-normalised for the teacher's mean/std: pixel = x * 255; teacher x' = (pixel - m) / s
    np.testing.assert_allclose((x * obj.renormalize[0] + obj.renormalize[1]).numpy()[:, 1],
                               ((x.numpy() * 255.0 - 20.0) / 60.0)[:, 1], rtol=1e-5, atol=1e-5)

    totals, kds = [], []
    inner = trainer.step.objective

    def recording(model, batch, epoch, step):
        loss, n = inner(model, batch, epoch, step)
        totals.append(float(loss))
        kds.append(float(inner.last["kd"]))
        return loss, n

    trainer.step.objective = recording
    trainer.fit()
    assert seen and all(s == [3, 32, 32] for s in seen[: len(totals)])
    first, last = np.mean(totals[:8]), np.mean(totals[-8:])  # first vs last epoch (8 steps each)
    assert last < first - 0.4, (first, last)  # 3.0 -> 2.1 when written
    assert np.mean(kds[-8:]) < np.mean(kds[:8]) and min(kds) > 0
    assert not net.training
    after = net.state_dict()
    assert max(float(np.abs(after[k].numpy() - v).max()) for k, v in teacher_before.items()) == 0.0
    # checkpoint = the student only: same keys and values as the student; no teacher sub-tree
    saved = paddle.load(str(tmp_path / "run" / "latest" / "model.pdparams"))
    student = trainer.step.raw_model.state_dict()
    assert sorted(saved) == sorted(student) and not any("teacher" in k for k in saved)
    assert max(float(np.abs(np.asarray(saved[k]) - student[k].numpy()).max()) for k in saved) == 0.0
    assert any(float(np.abs(np.asarray(saved[k]) - teacher_before[k]).max()) > 0 for k in saved)
    assert trainer.last_metrics["images"] == 16  # eval at the student's own 32 px transforms


def test_teacher_config_errors_are_one_line(tiny_tree, tmp_path, teacher):
    teacher_cfg, prefix = teacher
    cfg = load_config(None, _overrides(tiny_tree, tmp_path / "a", teacher_cfg, str(tmp_path / "nope")))
    with pytest.raises(ConfigError, match=r"^distill.teacher_weights: model.weights=.*nope.pdparams not found"):
        build_distillation_objective(cfg, LabelSmoothingCrossEntropy(4, 0.1))
    cfg = load_config(None, _overrides(tiny_tree, tmp_path / "b", teacher_cfg, prefix, "model.num_classes=5"))
    with pytest.raises(ConfigError, match="teacher has model.num_classes=4 but the student has 5"):
        build_distillation_objective(cfg, LabelSmoothingCrossEntropy(5, 0.1))
    # same resolution: the training loader keeps the student's config
    cfg = load_config(None, _overrides(tiny_tree, tmp_path / "c", teacher_cfg, prefix, "distill.teacher_resolution=32"))
    assert teacher_data_config(cfg) is cfg
    cfg = load_config(None, _overrides(tiny_tree, tmp_path / "c", teacher_cfg, prefix))
    assert teacher_data_config(cfg).data.transforms.crop_size == 48 and cfg.data.transforms.crop_size == 32


def test_the_teacher_runs_in_float32_outside_the_students_autocast():
    """NVIDIA's GPUNet train_one_epoch calls its teacher after its autocast block, in float32; the
    teacher ran inside the student's float16 autocast. Read through the AMP state the forward sees
    (auto_cast sets it on a CPU place too)."""
    import importlib

    from ppdlx.engine.amp import AmpPlan, autocast
    auto_cast_module = importlib.import_module("paddle.amp.auto_cast")  # the module, not the function
    seen = []

    class Recording(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.fc = paddle.nn.Linear(3, 4)

        def forward(self, x):
            state = auto_cast_module.amp_state()
            seen.append((bool(state and state["enable"]), str(x.dtype)))
            return self.fc(paddle.flatten(x.mean(axis=[2, 3]), 1))

    objective = DistillationObjective(LabelSmoothingCrossEntropy(4, 0.1), Recording(), 8)
    with autocast(AmpPlan(True, "float16", "O1", True)):
        objective(Recording(), (paddle.randn([2, 3, 8, 8]), paddle.to_tensor([0, 1])), 0, 0)
    student, teacher = seen  # the objective runs the student first
    assert student[0] is True and teacher == (False, "paddle.float32")
