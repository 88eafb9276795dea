"""Static-graph AMP state: O2 master weights, loss scaling and EMA through load, save and resume.

Paddle 3.3.1's CPU build has no float16 kernels and no bf16 conv/batch_norm/momentum kernels,
so these tests train a model whose Linear layers are applied with elementwise ops (multiply +
sum, which have CPU bf16 kernels) with SGD: Paddle's real PIR static AMP recipe (decorate O2 with
fp32 master weights, auto_cast, GradScaler.minimize) then builds and runs here.
"""
import contextlib

import numpy as np
import paddle
import pytest

from ppdlx import checkpoint as ckpt
from ppdlx.config import load_config
from ppdlx.engine.amp import AmpPlan
from ppdlx.engine.hooks import Checkpoint, LRScheduler
from ppdlx.engine.run import build_training, plan_training_amp, program_spec
from ppdlx.engine.static.ir_compat import static_graph
from ppdlx.engine.static.step import ProgramModel, build_static_step
from ppdlx.engine.trainer import Trainer
from ppdlx.errors import UnsupportedError
from ppdlx.models.from_config import build_model
from ppdlx.optim import build_lr_schedule
from ppdlx.registry import MODELS
from ppdlx.tasks import task_of

CROP = 8


class ElementwiseNet(paddle.nn.Layer):
    """Two Linear layers (prunable by ASP) computed as ``(x[..., None] * W).sum(1) + b``."""

    def __init__(self, num_classes, data_format="NCHW", hidden=8):
        super().__init__()
        self.hidden = paddle.nn.Linear(3 * CROP * CROP, hidden)
        self.fc = paddle.nn.Linear(hidden, num_classes)

    def forward(self, x):
        h = (x.flatten(1).unsqueeze(-1) * self.hidden.weight).sum(1) + self.hidden.bias
        h = paddle.nn.functional.relu(h)
        return (h.unsqueeze(-1) * self.fc.weight).sum(1) + self.fc.bias


@pytest.fixture(autouse=True, scope="module")
def elementwise_net_registered():
    # registered for this module only: the model tests enumerate every registered model
    with MODELS.registered("test_elementwise_net", ElementwiseNet):
        yield


def elementwise_cfg(out, *extra):
    return load_config(None, [
        f"global.output_dir={out}", "global.device=cpu", "global.log_interval=1", "global.cpu_fast_kernels=false",
        "model.name=test_elementwise_net", "model.num_classes=4", "data.backend=synthetic",
        "data.synthetic.num_images=16", "data.batch_size=4", f"data.transforms.crop_size={CROP}", "train.epochs=1",
        "lr.base_lr=0.1", "lr.scale_with_batch=false", "lr.warmup_epochs=0", "train.graph=static",
        # no weight decay: O2 refuses sgd's coupled decay (ppdlx.engine.amp.check_o2_weight_decay)
        "optimizer.name=sgd", "optimizer.weight_decay=0", "amp.enabled=true", "amp.dtype=bfloat16", "amp.level=O2",
        *extra])


def trainer_with_plan(cfg, plan):
    """What build_training builds for train.graph=static after planning, with a given AMP plan (no
    loaders): the static step, the LR hook and checkpoints."""
    lr_schedule = build_lr_schedule(cfg, cfg.data.batch_size, 4)
    step = build_static_step(program_spec(cfg, task_of(cfg), cfg.model.num_classes), lr_schedule, plan, 1, "cpu")
    return Trainer(step, [LRScheduler(lr_schedule), Checkpoint(cfg.global_.output_dir)], train_loader=None,
                   epochs=1)


def save(trainer):
    trainer.find_hook(Checkpoint).save(improved=False)


def masters_of(step):
    """Structured name -> fp32 master, found through the optimizer itself (Paddle's own map)."""
    masters = {p: v.name for p, v in step.pr.optimizer._master_weights.items()}
    return {n: step.get_var(masters[v]) for n, v in step.var_names.items() if v in masters}


def random_state(step, seed):
    rng = np.random.default_rng(seed)
    return {n: (0.1 * rng.standard_normal(v.shape)).astype(np.float32) for n, v in step.model_state().items()}


def params_of(path):
    return {k: np.asarray(v) for k, v in paddle.load(str(path)).items()}


def batch(seed=0):
    rng = np.random.default_rng(seed)
    return {"images": rng.standard_normal((4, 3, CROP, CROP)).astype(np.float32),
            "labels": rng.integers(0, 4, 4).astype(np.int64)}


def test_o2_master_weights_take_loaded_and_resumed_values(tmp_path):
    """Paddle's GPU optimizer kernels step from the fp32 master and cast it into the parameter, so
    whatever is loaded must be in the masters; checked on the scope of a real O2 program."""
    cfg = elementwise_cfg(tmp_path, "amp.init_loss_scaling=1.0")
    plan = AmpPlan(True, "bfloat16", "O2", False)
    a = trainer_with_plan(cfg, plan)
    loaded = random_state(a.step, 0)
    a.step.set_model_state(loaded)
    masters = masters_of(a.step)
    assert sorted(masters) == sorted(loaded)  # every parameter is bf16 with a master
    for n, value in loaded.items():
        assert np.array_equal(masters[n], value), n  # full fp32 precision, not the initialiser
        param = a.step.get_var(a.step.var_names[n])
        assert not np.array_equal(param, value) and np.abs(param - value).max() <= 2 ** -8 * np.abs(value).max()
    save(a)
    pdparams = params_of(tmp_path / "latest" / "model.pdparams")
    pdopt = paddle.load(str(tmp_path / "latest" / "optimizer.pdopt"))
    for n, value in loaded.items():  # float32 masters in both files, as the dynamic trainer saves
        assert np.array_equal(pdparams[n], value), n
        assert np.array_equal(np.asarray(pdopt["master_weights"][a.step.dyn_names[n]]), value), n

    b = trainer_with_plan(cfg, plan)  # fresh programs: other initialiser values
    b.resume(str(tmp_path / "latest"))
    got = masters_of(b.step)
    for n in loaded:
        assert np.array_equal(got[n], loaded[n]), n
        assert np.array_equal(b.step.get_var(b.step.var_names[n]), a.step.get_var(a.step.var_names[n])), n
    c = trainer_with_plan(cfg, plan)
    c.step.set_optimizer_state(pdopt)  # .pdopt alone restores the masters
    assert all(np.array_equal(masters_of(c.step)[n], loaded[n]) for n in loaded)


def test_o2_on_this_cpu_falls_back_to_float32_in_one_line(tmp_path):
    """The only bf16 optimizer kernel on CPU, sgd, ignores the masters (paddle/phi/kernels/cpu/
    sgd_kernel.cc): O2 would save and evaluate masters that never move. The planner's probe sees it."""
    plan = plan_training_amp(elementwise_cfg(tmp_path), "cpu")
    assert (plan.enabled, plan.dtype) == (False, "float32")
    assert plan.note.endswith("(the sgd step left the fp32 master weights unchanged: its CPU kernel ignores "
                              "multi_precision): training runs in float32"), plan.note
    assert plan_training_amp(elementwise_cfg(tmp_path, "amp.level=O1"), "cpu").enabled  # no masters in O1


def test_o2_with_ema_and_model_weights_through_the_trainer(tmp_path):
    """The whole trainer with an O2 plan (forced: this CPU refuses O2, see above): model.weights
    reach the masters, the in-program EMA averages the masters after every update, evaluation
    runs in float32 on the masters or the EMA, as the dynamic trainer does."""
    probe = elementwise_cfg(tmp_path / "probe")
    model = build_model(probe)
    rng = np.random.default_rng(1)
    weights = {n: (0.1 * rng.standard_normal(v.shape)).astype(np.float32) for n, v in model.state_dict().items()}
    paddle.save({n: paddle.to_tensor(v) for n, v in weights.items()}, str(tmp_path / "init.pdparams"))
    cfg = elementwise_cfg(tmp_path / "run", "ema.enabled=true", "ema.decay=0.5",
                          f"model.weights={tmp_path / 'init'}")
    seen = []

    class Recorder:
        name = "recorder"

        def after_step(self):
            if self.trainer.result.applied:
                seen.append(self.trainer.step.model_state())

    plan = AmpPlan(True, "bfloat16", "O2", False)
    trainer = build_training(cfg, hooks=[Recorder()], amp=plan)
    step = trainer.step
    assert all(np.array_equal(step.get_var(step.master_names[v]), weights[n]) for n, v in step.var_names.items())
    for s in step.pr.ema_shadow.values():  # start the EMA away from the weights: every update shows
        step.set_var(s, np.zeros_like(step.get_var(s)))
    trainer.fit()
    assert len(seen) == 4
    shadow = {n: np.zeros_like(w) for n, w in weights.items()}
    for state in seen:
        shadow = {n: shadow[n] * np.float32(0.5) + state[n] * np.float32(0.5) for n in shadow}
    ema = ckpt.load_states(str(tmp_path / "run" / "latest.pdstates"))["ema"]
    assert ema["updates"] == 4
    assert max(float(np.abs(ema["shadow"][n] - shadow[n]).max()) for n in shadow) < 1e-7
    assert max(float(np.abs(shadow[n]).max()) for n in shadow) > 0.05
    # evaluation: float32 on the masters (and on the EMA when swapped in), as a dynamic fp32 model
    images = paddle.to_tensor(batch(3)["images"])
    model.eval()
    for state, swap in ((step.model_state(), contextlib.nullcontext), (shadow, step.ema_swapped_in)):
        model.set_state_dict({n: paddle.to_tensor(v) for n, v in state.items()})
        with paddle.no_grad():
            ref = model(images).numpy()
        with swap():
            got = ProgramModel(step)(images).numpy()
        assert np.abs(got - ref).max() < 1e-5
    assert trainer.last_metrics["weights"] == "ema"
    # accumulation is still refused in one line under static AMP
    with pytest.raises(UnsupportedError) as err:
        build_training(elementwise_cfg(tmp_path / "acc", "train.accumulate=2"), amp=plan)
    assert str(err.value).startswith("train.graph=static with amp.enabled and train.accumulate=2:")


def test_loss_scale_is_applied_and_round_trips(tmp_path):
    """Fixed loss scaling (the float16 path with amp.use_dynamic_loss_scaling=false; bf16 O1 stands
    in for fp16, which has no CPU kernels): the update equals the unscaled one, and the scale is
    saved in GradScaler.state_dict()'s layout and restored on resume."""
    cfg = elementwise_cfg(tmp_path, "amp.level=O1", "amp.init_loss_scaling=128", "amp.use_dynamic_loss_scaling=false")
    scaled = trainer_with_plan(cfg, AmpPlan(True, "bfloat16", "O1", True))
    plain = trainer_with_plan(cfg, AmpPlan(True, "bfloat16", "O1", False))
    weights = random_state(scaled.step, 2)
    for t in (scaled.step, plain.step):
        t.set_model_state(weights)
        t.run_program(t.pr.main, batch(), t.pr.fetch)
    after, ref = scaled.step.model_state(), plain.step.model_state()
    assert max(float(np.abs(after[n] - weights[n]).max()) for n in weights) > 1e-3
    assert max(float(np.abs(after[n] - ref[n]).max()) for n in ref) < 1e-7
    scale_var = scaled.step.pr.loss_scaling.scale
    assert scaled.step.get_var(scale_var).tolist() == [128.0]
    scaled.step.set_var(scale_var, np.asarray([512.0], np.float32))  # as a GPU run's scaling may have moved it
    save(scaled)
    state = ckpt.load_states(str(tmp_path / "latest.pdstates"))["scaler"]
    assert sorted(state) == sorted(["scale", "incr_ratio", "decr_ratio", "incr_every_n_steps",
                                    "decr_every_n_nan_or_inf", "incr_count", "decr_count",
                                    "use_dynamic_loss_scaling"])  # paddle.amp.GradScaler.state_dict()
    assert state["scale"].tolist() == [512.0] and state["use_dynamic_loss_scaling"] is False
    resumed = trainer_with_plan(cfg, AmpPlan(True, "bfloat16", "O1", True))
    resumed.resume(str(tmp_path / "latest"))
    assert resumed.step.get_var(resumed.step.pr.loss_scaling.scale).tolist() == [512.0]
    assert plain.step.state.scaler_state() is None  # no scaler (bf16), as the dynamic trainer: nothing to save


def test_dynamic_loss_scaling_counters_round_trip():
    """num_good_steps / num_bad_steps (float16 dynamic loss scaling, GPU-only to build) map to
    GradScaler's incr_count / decr_count; checked on real persistable scope variables."""
    from ppdlx.engine.static.state import LossScaling, ScopeState
    main, startup, scope = paddle.static.Program(), paddle.static.Program(), paddle.static.Scope()
    with static_graph(), paddle.static.program_guard(main, startup):
        made = [paddle.pir.core.create_persistable_value(dtype, [1], name=name,
                                                         initializer=paddle.nn.initializer.Constant(value))
                for name, dtype, value in (("loss_scaling_0", "float32", 128.0), ("num_good_steps_0", "int32", 0),
                                           ("num_bad_steps_0", "int32", 0))]
        paddle.static.Executor(paddle.CPUPlace()).run(startup, scope=scope)
    ls = LossScaling(*[v.name for v in made], settings={"incr_ratio": 2.0, "use_dynamic_loss_scaling": True})
    state = ScopeState(scope, paddle.CPUPlace(), {}, {}, loss_scaling=ls)
    assert state.scaler_state()["scale"].tolist() == [128.0]
    state.set_scaler_state({"scale": np.asarray([256.0], np.float32), "incr_count": 7, "decr_count": 1})
    got = state.scaler_state()
    assert (got["scale"].tolist(), got["incr_count"], got["decr_count"], got["incr_ratio"]) == ([256.0], 7, 1, 2.0)
    assert np.array(scope.find_var("num_good_steps_0").get_tensor()).dtype == np.int32


def test_o2_clip_sums_the_squares_of_its_gradients_in_float32(tmp_path):
    """O2 gradients are low precision, and Paddle's GPU squared_l2_norm returns its input's dtype: the
    static program's global-norm clip overflowed above a norm of 256 in fp16 and zeroed every update
    (the dynamic path had the fix). Paddle reads its float32 switch while the update ops are appended;
    on this CPU a bf16 O2 program with a clip did not even build without it (no bf16 squared_l2_norm)."""
    before = paddle.nn.clip._clip_by_global_norm_using_mp_type(False)  # a fresh process's state
    try:
        cfg = elementwise_cfg(tmp_path, "optimizer.grad_clip_norm=1.0", "amp.init_loss_scaling=1.0")
        step = trainer_with_plan(cfg, AmpPlan(True, "bfloat16", "O2", False)).step
        norms = [op for op in step.pr.main.global_block().ops if op.name() == "pd_op.squared_l2_norm"]
        assert len(norms) == 4 and all(op.operand_source(0).dtype == paddle.float32 for op in norms)
    finally:
        paddle.nn.clip._clip_by_global_norm_using_mp_type(before)


def test_a_fixed_fp16_loss_scale_applies_overflowed_gradients_so_the_static_plan_refuses_it(tmp_path):
    """A real float16 static AMP program (O1: this model has no op fp16 autocast converts, so every
    kernel stays float32 and it runs on CPU, with Paddle's unscale op). With a fixed scale Paddle's
    recipe only divides the gradients by it: a step whose gradients overflow while the loss is finite
    writes inf/NaN into the weights, where the dynamic trainer's GradScaler skips the step. If this
    program ever keeps its weights finite, Paddle has changed and the refusal below can go."""
    cfg = elementwise_cfg(tmp_path, "amp.dtype=float16", "amp.level=O1", "amp.init_loss_scaling=3e38",
                          "amp.use_dynamic_loss_scaling=false")
    step = trainer_with_plan(cfg, AmpPlan(True, "float16", "O1", True)).step
    step.set_model_state(random_state(step, 2))
    overflowing = batch()
    overflowing["images"] = overflowing["images"] * 1000.0
    loss, finite = step.run_program(step.pr.main, overflowing, step.pr.fetch)
    assert np.isfinite(loss).all() and bool(np.asarray(finite).all())
    assert not all(np.isfinite(v).all() for v in step.model_state().values())
    from ppdlx.engine.static import amp as static_amp
    with pytest.raises(UnsupportedError) as err:
        static_amp.plan(cfg.amp, "gpu:0", use_pir=True, probe=None)
    assert str(err.value) == (
        "train.graph=static with amp.dtype=float16 and amp.use_dynamic_loss_scaling=false: Paddle's static program "
        "applies overflowed gradients to the weights with a fixed loss scale; use amp.use_dynamic_loss_scaling=true "
        "or train.graph=dynamic")


def test_static_amp_under_legacy_ir_on_a_gpu_is_refused(tmp_path):
    """The float32 fallback's reason ('legacy static AMP inserts no casts') holds for the CPU build only;
    on a GPU the run would train in float32 while AMP was asked for."""
    from ppdlx.engine.static import amp as static_amp
    cfg = elementwise_cfg(tmp_path, "amp.dtype=float16")
    with pytest.raises(UnsupportedError) as err:
        static_amp.plan(cfg.amp, "gpu:0", use_pir=False, probe=None)
    assert str(err.value).startswith("train.graph=static with amp.enabled under legacy IR (FLAGS_enable_pir_api=0): ")
