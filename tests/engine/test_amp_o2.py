"""AMP O2 (fp16 parameters, fp32 master weights) through evaluation, EMA, save, resume and loading into a
float32 model, on CPU.

On a GPU ``paddle.amp.decorate(level="O2")`` casts the parameters with
``paddle.amp.auto_cast.amp_initialize`` and the optimizer (multi_precision) creates fp32 master weights
at its first step with ``_create_master_weight``; on a CPU place decorate returns early, so the tests call
those two functions themselves: the model and optimizer are then in exactly the state a GPU O2 run has.
"""
import numpy as np
import paddle
import pytest
from paddle.amp.auto_cast import amp_initialize

from ppdlx import checkpoint as ckpt
from ppdlx.config import load_config
from ppdlx.engine.amp import keep_exact_masters
from ppdlx.engine.hooks import Checkpoint, Evaluation
from ppdlx.engine.run import build_training
from ppdlx.models.from_config import build_model

CONFIG = "configs/demo/rn50_demo.yaml"


def _cfg(tree, out, *extra):
    return load_config(CONFIG, [f"data.root={tree}", "model.name=resnet18_bottleneck_tiny", "model.num_classes=4",
                                "data.workers=0", "data.backend=paddle", "global.cpu_fast_kernels=false",
                                f"global.output_dir={out}", "ema.enabled=true", "ema.decay=0.5", *extra])


def _to_o2(trainer, exact: dict):
    """The GPU O2 state: fp16 parameters, fp32 masters holding the exact (pre-cast) values, as
    ``decorate_o2`` leaves it (``amp_initialize`` is the cast ``paddle.amp.decorate`` makes on a GPU)."""
    step = trainer.step
    amp_initialize(models=[step.raw_model], dtype="float16", excluded_layers=None)
    keep_exact_masters(step.raw_model, step.optimizer, {k: paddle.to_tensor(v) for k, v in exact.items()})


def test_o2_masters_start_from_the_float32_weights_not_their_fp16_rounding(tiny_tree, tmp_path):
    """Paddle creates a master at the first step as a cast of the fp16 parameter: a fine-tune from
    float32 weights lost their low bits (up to 2^-12 relative)."""
    with paddle.utils.unique_name.guard():
        trainer = build_training(_cfg(tiny_tree, tmp_path / "run"))
    exact = _perturbed_fp32(trainer)
    _to_o2(trainer, exact)
    step, checked, rounded = trainer.step, 0, 0
    for name, p in step.raw_model.named_parameters():
        if p.dtype == paddle.float16:
            master = step.optimizer._master_weights[p.name].numpy()
            assert master.dtype == np.float32 and np.array_equal(master, exact[name]), name
            rounded += not np.array_equal(p.astype("float32").numpy(), exact[name])
            checked += 1
    assert checked > 10 and rounded > 10


def _perturbed_fp32(trainer) -> dict:
    """Weights with bits below fp16's precision, so that 'saved the masters' and 'saved the rounded
    fp16 copy' differ."""
    rng = np.random.default_rng(0)
    state = {}
    for k, v in trainer.step.raw_model.state_dict().items():
        a = v.numpy()
        if k.endswith("weight") and a.ndim > 1:
            a = (a * (1 + 1e-3 * rng.standard_normal(a.shape))).astype(np.float32)
        state[k] = a
    trainer.step.raw_model.set_state_dict({k: paddle.to_tensor(a) for k, a in state.items()})
    return state


def evaluate(trainer) -> dict:
    return trainer.find_hook(Evaluation).evaluate()


@pytest.fixture
def o2_trainer(tiny_tree, tmp_path):
    with paddle.utils.unique_name.guard():  # parameter names as in a fresh process (optimizer state keys)
        trainer = build_training(_cfg(tiny_tree, tmp_path / "run"))
    trainer.tree = tiny_tree
    exact = _perturbed_fp32(trainer)
    trainer.step.ema.shadow = {k: paddle.to_tensor(a) for k, a in exact.items()}
    reference = evaluate(trainer)
    _to_o2(trainer, exact)
    return trainer, exact, reference


def test_o2_model_evaluates_its_float32_masters_and_stays_fp16(o2_trainer):
    trainer, exact, reference = o2_trainer
    params_before = {id(p) for p in trainer.step.optimizer._parameter_list}
    fp16_before = {k: v.numpy().copy() for k, v in trainer.step.raw_model.state_dict().items()
                   if v.dtype == paddle.float16}
    assert len(fp16_before) > 10
    # Before: fp32 images into fp16 convolutions -> "The type of data we are trying to retrieve (float32)
    # does not match"; the EMA swap -> "Variable dtype not match".
    metrics = evaluate(trainer)
    assert metrics["weights"] == "ema"
    assert metrics["images"] == reference["images"] == 16
    assert abs(metrics["top1"] - reference["top1"]) < 1e-9
    assert abs(metrics["loss"] - reference["loss"]) < 1e-6 * max(1.0, abs(reference["loss"]))
    trainer.step.ema = None
    assert abs(evaluate(trainer)["loss"] - reference["loss"]) < 1e-6 * max(1.0, abs(reference["loss"]))
    after = trainer.step.raw_model.state_dict()
    for k, v in fp16_before.items():
        assert after[k].dtype == paddle.float16 and np.array_equal(after[k].numpy(), v), k
    assert {id(p) for p in trainer.step.optimizer._parameter_list} == params_before


def test_o2_checkpoint_is_float32_masters_and_loads_anywhere(o2_trainer, tmp_path):
    trainer, exact, reference = o2_trainer
    trainer.epoch = 1
    trainer.find_hook(Checkpoint).save(improved=True)
    saved = paddle.load(str(tmp_path / "run" / "best" / "model.pdparams"))
    for k, a in exact.items():
        # Before: the fp16 parameters were saved, so model.weights / eval / export refused them.
        assert saved[k].dtype == paddle.float32 and np.array_equal(saved[k].numpy(), a), k
    # weights-only into a float32 model (model.weights, eval, export)
    fresh = build_model(_cfg("unused", tmp_path / "x"))
    ckpt.load_weights(fresh, str(tmp_path / "run" / "best"))
    assert all(np.array_equal(v.numpy(), exact[k]) for k, v in fresh.state_dict().items())
    # resume into another O2 run: fp16 parameters from the float32 file, masters from the optimizer state
    with paddle.utils.unique_name.guard():  # a resume is a new process: the same parameter names
        other = build_training(_cfg(trainer.tree, tmp_path / "run2"))
    _to_o2(other, {k: np.zeros_like(a) for k, a in exact.items()})
    other.resume(str(tmp_path / "run" / "latest"))
    state = other.step.raw_model.state_dict()
    masters = other.step.optimizer._master_weights
    for k, p in trainer.step.raw_model.state_dict().items():
        if p.dtype == paddle.float16:
            assert state[k].dtype == paddle.float16
            assert np.array_equal(state[k].numpy(), exact[k].astype(np.float16)), k
            assert np.array_equal(masters[state[k].name].numpy(), exact[k]), k


def test_resume_across_the_o2_line_is_refused_in_one_line(o2_trainer, tmp_path):
    """Before: an O2 checkpoint resumed into an O1/fp32 run (or the other way) loaded, then stopped the first
    step with Paddle's "Optimizer set error" assertion: O2 keeps its optimizer state under the masters' names."""
    from ppdlx.errors import UnsupportedError
    trainer, exact, _ = o2_trainer
    trainer.epoch = 1
    trainer.find_hook(Checkpoint).save(improved=True)
    with paddle.utils.unique_name.guard():
        plain = build_training(_cfg(trainer.tree, tmp_path / "plain"))
    with pytest.raises(UnsupportedError) as err:
        plain.resume(str(tmp_path / "run" / "latest"))
    assert str(err.value).startswith("train.resume: the checkpoint was trained with amp.level=O2")
    plain.epoch = 1
    plain.find_hook(Checkpoint).save(improved=True)
    with paddle.utils.unique_name.guard():
        o2 = build_training(_cfg(trainer.tree, tmp_path / "o2"))
    _to_o2(o2, exact)
    with pytest.raises(UnsupportedError) as err:
        o2.resume(str(tmp_path / "plain" / "latest"))
    assert str(err.value).startswith("train.resume: this run is amp.level=O2 and the checkpoint's optimizer state "
                                     "has no fp32 master weights")


def test_ema_averages_the_masters_not_the_rounded_parameters(o2_trainer):
    trainer, exact, _ = o2_trainer
    ema = trainer.step.ema
    zero = {k: paddle.zeros_like(v) for k, v in ema.shadow.items()}
    ema.shadow, ema.decay, ema.dynamic_decay = zero, 0.0, False
    ema.update(trainer.step.raw_model, trainer.step.optimizer)
    for k, a in exact.items():
        assert ema.shadow[k].dtype == paddle.float32
        assert np.array_equal(ema.shadow[k].numpy(), a), k


def test_o2_with_an_optimizer_that_decays_the_low_precision_gradient_is_refused(tiny_tree, tmp_path):
    """Paddle adds rmsprop_tf's and sgd's coupled L2 decay to the fp16 gradient in fp16 (the master only
    when the dtypes differ): for gradients near 1e-3, 1e-5 * w rounded away for 43 % of the weights, so
    GPUNet's and EfficientNet-Lite0's recipes at amp.level=O2 trained without much of their decay.
    Momentum and AdamW decay inside their kernels, on the masters."""
    from ppdlx.engine.amp import AmpPlan, check_o2_weight_decay
    from ppdlx.errors import UnsupportedError
    o2 = AmpPlan(True, "float16", "O2", True)
    with pytest.raises(UnsupportedError) as err:
        build_training(_cfg(tiny_tree, tmp_path / "run", "optimizer.name=rmsprop_tf", "optimizer.weight_decay=1e-5"),
                       amp=o2)
    assert str(err.value) == (
        "amp.level=O2 with optimizer.name=rmsprop_tf and optimizer.weight_decay=1e-05: Paddle adds this optimizer's "
        "weight decay to the float16 gradients in float16, where most of it rounds away; use amp.level=O1 (float32 "
        "weights) or optimizer.name momentum or adamw")
    decay = lambda name, wd=1e-5: _cfg(tiny_tree, tmp_path, f"optimizer.name={name}", f"optimizer.weight_decay={wd}")
    with pytest.raises(UnsupportedError):
        check_o2_weight_decay(o2, decay("sgd").optimizer)
    for allowed in (decay("momentum"), decay("adamw"), decay("rmsprop_tf", 0.0)):
        check_o2_weight_decay(o2, allowed.optimizer)
    check_o2_weight_decay(AmpPlan(True, "float16", "O1", True), decay("rmsprop_tf").optimizer)
