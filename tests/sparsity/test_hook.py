"""ASPHook through the real Trainer: masks survive optimizer steps with EMA, gradient
accumulation and (CPU) bf16 AMP, a kill/resume keeps identical masks, O2 master
weights are masked, and static-graph style mask application by name."""
import numpy as np
import paddle
import pytest

from ppdlx.config import load_config
from ppdlx.engine.hooks import Checkpoint
from ppdlx.engine.run import build_training
from ppdlx.errors import ConfigError
from ppdlx.sparsity import ASPHook, apply_masks, masks_by_param_name, nm_violations


def tiny_cfg(out, *extra):
    return load_config(None, [
        f"global.output_dir={out}", "global.device=cpu", "global.log_interval=1", "model.name=resnet18_bottleneck_tiny",
        "model.num_classes=10", "data.backend=synthetic", "data.synthetic.num_images=32", "data.batch_size=8",
        "data.transforms.crop_size=32", "train.epochs=2", "lr.base_lr=0.5", "lr.warmup_epochs=0", *extra])


def kind_of(w):
    return "conv2d" if w.ndim == 4 else "linear"


class StepChecker:
    """Runs after ASPHook and before ema.update on every applied optimizer step."""
    name = "step_checker"

    def __init__(self, asp):
        self.asp, self.steps = asp, 0

    def after_step(self):
        trainer = self.trainer
        if not trainer.result.applied:
            return
        state = trainer.step.raw_model.state_dict()
        for k, mask in self.asp.masks.items():
            w = state[k].numpy()
            assert not w[~mask].any(), f"step {trainer.global_step}: {k} has weights outside its mask"
            assert nm_violations(w, kind_of(w))[0] == 0
            if trainer.step.ema is not None:  # the shadow as left by the previous ema.update
                assert not trainer.step.ema.shadow[k].numpy()[~mask].any(), f"EMA of {k} left the mask"
        self.steps += 1


def test_masks_survive_steps_with_ema_accumulation_and_bf16_amp(tmp_path):
    cfg = tiny_cfg(tmp_path, "ema.enabled=true", "ema.decay=0.5", "train.accumulate=2",
                   "amp.enabled=true", "amp.dtype=bfloat16")
    asp = ASPHook.from_config(cfg.asp)
    checker = StepChecker(asp)
    trainer = build_training(cfg, hooks=[asp, checker])
    dense = {k: v.numpy().copy() for k, v in trainer.step.raw_model.state_dict().items()}
    trainer.fit()
    assert checker.steps == trainer.global_step == 2 * 2  # 32 images / (8 x 2 accumulate) x 2 epochs
    assert set(asp.masks) == {e.param for e in asp.entries if e.prune} and len(asp.masks) == 16
    state = trainer.step.raw_model.state_dict()
    for k, mask in asp.masks.items():
        w, s = state[k].numpy(), trainer.step.ema.shadow[k].numpy()
        assert (mask.reshape(-1).size // 2) == mask.sum()  # 2:4 keeps half
        assert not w[~mask].any() and not s[~mask].any()
        assert np.abs(w[mask] - dense[k][mask]).max() > 0  # kept weights trained
    # dense gradients: the momentum buffer of a pruned weight is non-zero where the mask is 0
    velocity = trainer.step.optimizer._accumulators["velocity"]
    p = state["stages.1.0.conv2.conv.weight"]
    assert np.abs(velocity[p.name].numpy()[~asp.masks["stages.1.0.conv2.conv.weight"]]).max() > 0
    # the unpruned layers stayed dense
    assert np.count_nonzero(state["stem.conv.weight"].numpy()) == state["stem.conv.weight"].size
    assert np.count_nonzero(state["fc.weight"].numpy()) == state["fc.weight"].size


class Killed(Exception):
    pass


def test_kill_and_resume_keeps_identical_masks_and_weights(tmp_path):
    """In-process kill after the epoch-1 checkpoint. Each run gets fresh parameter names
    (unique_name.guard), as a new process would: optimizer state is keyed by them."""
    guard = paddle.utils.unique_name.guard
    extra = ("ema.enabled=true", "ema.decay=0.5", "train.mixup_alpha=0.2")
    straight_hook = ASPHook()
    with guard():
        straight = build_training(tiny_cfg(tmp_path / "straight", *extra), hooks=[straight_hook])
        straight.fit()

    first = ASPHook()
    with guard():
        trainer = build_training(tiny_cfg(tmp_path / "killed", *extra), hooks=[first])
        checkpoint = trainer.find_hook(Checkpoint)
        save = checkpoint.save

        def save_then_die(improved):
            save(improved)
            raise Killed()

        checkpoint.save = save_then_die
        with pytest.raises(Killed):
            trainer.fit()
    assert trainer.epoch == 1

    resumed_hook = ASPHook()
    with guard():
        resumed = build_training(tiny_cfg(tmp_path / "killed", *extra, "train.resume=auto"), hooks=[resumed_hook])
        assert resumed_hook.restored and resumed.epoch == 1
        assert resumed_hook.masks.keys() == first.masks.keys()
        assert all(np.array_equal(resumed_hook.masks[k], first.masks[k]) for k in first.masks)
        resumed.fit()
    assert all(np.array_equal(resumed_hook.masks[k], straight_hook.masks[k]) for k in first.masks)
    a, b = straight.step.raw_model.state_dict(), resumed.step.raw_model.state_dict()
    assert max(float(np.abs(a[k].numpy() - b[k].numpy()).max()) for k in a) == 0.0
    for k, mask in resumed_hook.masks.items():
        assert not b[k].numpy()[~mask].any() and not resumed.step.ema.shadow[k].numpy()[~mask].any()

    # resuming with different ASP settings is refused instead of silently re-pruning
    with guard(), pytest.raises(ConfigError, match="asp.mask_algo='mask_2d_greedy'"):
        build_training(tiny_cfg(tmp_path / "killed", *extra, "train.resume=auto"),
                       hooks=[ASPHook(mask_algo="mask_2d_greedy")])


def test_restored_masks_are_used_not_recomputed():
    paddle.seed(0)
    net = paddle.nn.Sequential(paddle.nn.Linear(8, 8), paddle.nn.Linear(8, 4))
    hook = ASPHook(prune_classifier=True)
    state = ASPHook(prune_classifier=True)
    state.masks = {"0.weight": np.tile(np.array([[1], [1], [0], [0]], bool), (2, 8)),
                   "1.weight": np.tile(np.array([[0], [1], [0], [1]], bool), (2, 4))}
    hook.set_state_dict(state.state_dict())
    hook.attach(net)
    assert np.array_equal(net[0].weight.numpy() != 0, state.masks["0.weight"])
    assert np.array_equal(net[1].weight.numpy() != 0, state.masks["1.weight"])


def test_amp_o2_master_weights_are_masked():
    """bf16 parameters with fp32 master weights (what paddle.amp.decorate O2 sets up); SGD has
    CPU bf16 kernels, so the masters are created and masked for real here (the CPU kernel steps
    the bf16 parameter and leaves the master as it is: paddle/phi/kernels/cpu/sgd_kernel.cc)."""
    paddle.seed(0)

    class Layer(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.lin = paddle.nn.Linear(16, 8)

        def forward(self, x):  # elementwise ops: CPU has no bf16 matmul
            return (x.unsqueeze(-1) * self.lin.weight).sum(1)

    net = Layer()
    net.to(dtype="bfloat16")
    opt = paddle.optimizer.SGD(0.1, parameters=net.parameters(), multi_precision=True)
    hook = ASPHook(prune_classifier=True)
    hook.attach(net, opt)
    assert hook._pending_masters and not hook._master_targets  # masters appear at the first step
    mask = hook.masks["lin.weight"]
    x = paddle.randn([4, 16]).astype("bfloat16")
    for _ in range(3):
        net(x).astype("float32").square().mean().backward()
        opt.step()
        opt.clear_grad()
        hook.apply()
        master = opt._master_weights[net.lin.weight.name]
        assert master.dtype == paddle.float32 and len(hook._master_targets) == 1
        assert not master.numpy()[~mask].any()
        assert not net.lin.weight.astype("float32").numpy()[~mask].any()
        assert master.numpy()[mask].all()


def test_apply_masks_by_name_for_static_trainers():
    paddle.seed(0)
    net = paddle.nn.Sequential(paddle.nn.Linear(8, 8))
    hook = ASPHook(prune_classifier=True)
    masks = hook.compute_masks(net)
    by_name = masks_by_param_name(net, masks)
    assert list(by_name) == [net[0].weight.name]
    # numpy arrays (in place), paddle tensors, scope tensors
    arr = np.ones((8, 8), np.float32)
    t = paddle.ones([8, 8])
    dense = paddle.base.core.DenseTensor()
    dense.set(np.ones((8, 8), np.float32), paddle.CPUPlace())
    for target in (arr, t, dense):
        assert apply_masks({"w": target}, {"w": masks["0.weight"]}) == 1
        assert np.array_equal(np.array(target) != 0, masks["0.weight"])
    with pytest.raises(KeyError):
        apply_masks({}, {"w": masks["0.weight"]})


def test_masks_survive_to_static_training(tmp_path):
    cfg = tiny_cfg(tmp_path, "train.graph=to_static", "train.epochs=1", "data.synthetic.num_images=16")
    asp = ASPHook()
    checker = StepChecker(asp)
    trainer = build_training(cfg, hooks=[asp, checker])
    before = {k: v.numpy().copy() for k, v in trainer.step.raw_model.state_dict().items()}
    trainer.fit()
    assert checker.steps == 2
    state = trainer.step.raw_model.state_dict()
    for k, mask in asp.masks.items():
        assert not state[k].numpy()[~mask].any()
        assert np.abs(state[k].numpy() - before[k]).max() > 0


def test_masks_survive_static_graph_training_with_ema(tmp_path):
    cfg = tiny_cfg(tmp_path, "train.graph=static", "train.epochs=1", "data.synthetic.num_images=16",
                   "ema.enabled=true", "ema.decay=0.5")
    asp = ASPHook()
    seen = []

    class ScopeChecker:
        name = "scope_checker"

        def after_step(self):  # after the ASP hook: weights and EMA masked in the scope
            step = self.trainer.step
            for k, mask in asp.masks.items():
                assert not step.get_var(step.var_names[k])[~mask].any(), k
                assert not step.get_var(step.pr.ema_shadow[k])[~mask].any(), k
            seen.append(self.trainer.global_step)

    trainer = build_training(cfg, hooks=[asp, ScopeChecker()])
    trainer.fit()
    assert seen == [1, 2] and len(asp.masks) == 16
    rows = {r["layer"]: r for r in asp.layer_report()}
    assert rows["stages.3.0.conv2.conv"]["status"] == "2:4" and rows["fc"]["status"] == "dense"
    state = paddle.load(str(tmp_path / "latest" / "model.pdparams"))
    for k, mask in asp.masks.items():
        assert not np.asarray(state[k])[~mask].any()


def test_static_masking_stays_on_the_device(tmp_path):
    """The static hook multiplies the scope tensors in place with masks built once on their device:
    after the masks are made, training steps copy no weight through host memory."""
    from tests.engine.test_static_feed import host_copies
    cfg = tiny_cfg(tmp_path, "train.graph=static", "train.epochs=1", "data.synthetic.num_images=16",
                   "ema.enabled=true", "ema.decay=0.5")
    asp = ASPHook()
    trainer = build_training(cfg, hooks=[asp])
    trainer.call_hooks("before_train")  # computes the masks from the weights (read once)
    with host_copies() as copies:
        trainer.train_one_epoch()
    assert trainer.global_step == 2
    assert [c for c in copies if c[1] > 1] == []  # only the per-step scalars
    step = trainer.step
    for k, mask in asp.masks.items():
        assert not step.get_var(step.var_names[k])[~mask].any(), k
        assert not step.get_var(step.pr.ema_shadow[k])[~mask].any(), k
        assert step.get_var(step.var_names[k])[mask].all(), k


def test_static_amp_o2_masters_and_ema_are_masked(tmp_path):
    """bf16 O2 static program (elementwise Linear model: the bf16 ops this CPU runs): the hook
    masks the parameters, the fp32 masters the trainer lists and the EMA shadows."""
    from ppdlx.registry import MODELS
    from tests.engine.test_static_amp import ElementwiseNet
    with MODELS.registered("test_elementwise_net", ElementwiseNet):  # the test model, for this test only
        _static_amp_o2_masking(tmp_path)


def _static_amp_o2_masking(tmp_path):
    from ppdlx.engine.amp import AmpPlan
    from tests.engine.test_static_amp import elementwise_cfg
    cfg = elementwise_cfg(tmp_path, "ema.enabled=true", "ema.decay=0.5")
    asp = ASPHook()
    seen = []

    class ScopeChecker:
        name = "scope_checker"

        def after_step(self):
            step = self.trainer.step
            for k, mask in asp.masks.items():
                var = step.var_names[k]
                for name in (var, step.master_names[var], step.pr.ema_shadow[k]):
                    assert not step.get_var(name)[~mask].any(), (k, name)
            seen.append(self.trainer.global_step)

    # O2 forced: this CPU's planner refuses it (its sgd kernel ignores the masters)
    trainer = build_training(cfg, hooks=[asp, ScopeChecker()], amp=AmpPlan(True, "bfloat16", "O2", False))
    trainer.fit()
    assert seen == [1, 2, 3, 4] and list(asp.masks) == ["hidden.weight"]
    assert "_fp32_master" in trainer.step.master_names[trainer.step.var_names["hidden.weight"]]
