"""ModelEMA.swapped_into keeps BN statistics re-estimated for the EMA weights (detection's precise
BN) and restores the raw model exactly; ``model.weights`` of a checkpoint loads the copy its metrics
were measured on; an EMA turned on at a resume starts from the resumed weights."""
import os

import numpy as np
import paddle
import pytest

from ppdlx.engine.ema import ModelEMA


def test_statistics_recomputed_while_swapped_in_stay_with_the_ema_weights():
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Conv2D(3, 4, 3), paddle.nn.BatchNorm2D(4))
    ema = ModelEMA(model, 0.9)
    with paddle.no_grad():
        model[0].weight.set_value(model[0].weight * 2)  # raw weights now differ from the EMA copy
    raw = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    with ema.swapped_into(model):
        model.train()
        model(paddle.randn([2, 3, 8, 8]) * 5 + 3)  # a train-mode forward moves the BN statistics
        recomputed = model[1]._mean.numpy().copy()
    assert np.abs(recomputed).max() > 0.1
    assert np.allclose(ema.shadow["1._mean"].numpy(), recomputed)
    assert np.allclose(ema.shadow["0.weight"].numpy() * 2, raw["0.weight"])  # EMA weights unchanged
    for k, v in model.state_dict().items():
        assert np.array_equal(v.numpy(), raw[k]), k  # raw model restored, statistics included


CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      "configs", "demo", "rn50_demo.yaml")


def _cfg(tree, out, *extra):
    from ppdlx.config import load_config
    return load_config(CONFIG, [f"data.root={tree}", "model.name=resnet18_bottleneck_tiny", "model.num_classes=4",
                                "data.workers=0", "data.backend=paddle", "global.cpu_fast_kernels=false",
                                f"global.output_dir={out}", *extra])


def _scaled_weights(state: dict, seed: int) -> dict:
    """``state`` with every filter and matrix scaled at random: weights unlike the initial ones."""
    rng = np.random.default_rng(seed)
    return {k: (v * (1 + 0.5 * rng.standard_normal(v.shape))).astype(np.float32)
            if k.endswith("weight") and v.ndim > 1 else v for k, v in state.items()}


def _numpy(state: dict) -> dict:
    return {k: np.asarray(v.numpy() if hasattr(v, "numpy") else v) for k, v in state.items()}


def test_model_weights_of_best_load_the_ema_copy_that_was_evaluated(tiny_tree, tmp_path):
    """With ema.eval_with_ema the run picks ``best`` on the EMA's metrics; ``model.weights`` (eval,
    export, prune, distillation) must load that copy, not the raw weights beside it."""
    from ppdlx import checkpoint as ckpt
    from ppdlx.models.from_config import build_model
    from ppdlx.engine.hooks import Checkpoint, Evaluation
    from ppdlx.engine.run import build_training
    with paddle.utils.unique_name.guard():
        trainer = build_training(_cfg(tiny_tree, tmp_path / "run", "ema.enabled=true"))
    step = trainer.step
    step.load_state(_scaled_weights(_numpy(step.model_state()), 0), None, {})  # raw weights leave the EMA
    measured = trainer.find_hook(Evaluation).evaluate()
    assert measured["weights"] == "ema"
    trainer.last_metrics = measured
    trainer.epoch = 1
    trainer.find_hook(Checkpoint).save(improved=True)
    shadow, raw = _numpy(step.ema.shadow), _numpy(step.model_state())
    best = str(tmp_path / "run" / "best")
    loaded = {}
    for copy in ("auto", "ema", "raw"):
        model = build_model(_cfg(tiny_tree, tmp_path / "x"))
        ckpt.load_weights(model, best, copy=copy)
        loaded[copy] = _numpy(model.state_dict())
    assert all(np.array_equal(loaded["auto"][k], shadow[k]) for k in shadow)
    assert all(np.array_equal(loaded["ema"][k], shadow[k]) for k in shadow)
    assert all(np.array_equal(loaded["raw"][k], raw[k]) for k in shadow)
    changed = [k for k in shadow if not np.array_equal(shadow[k], raw[k])]
    assert len(changed) > 10
    model = build_model(_cfg(tiny_tree, tmp_path / "x"))
    ckpt.load_weights(model, best)
    reloaded = trainer.find_hook(Evaluation).evaluator(model)
    assert abs(reloaded["loss"] - measured["loss"]) <= 1e-5 * max(1.0, abs(measured["loss"]))


def test_model_weights_copy_ema_of_a_checkpoint_without_one_is_one_line(tiny_tree, tmp_path):
    from ppdlx import checkpoint as ckpt
    from ppdlx.models.from_config import build_model
    from ppdlx.checkpoint.unit import CheckpointError
    from ppdlx.engine.hooks import Checkpoint
    from ppdlx.engine.run import build_training
    with paddle.utils.unique_name.guard():
        trainer = build_training(_cfg(tiny_tree, tmp_path / "run"))
    trainer.epoch = 1
    trainer.find_hook(Checkpoint).save(improved=True)
    model = build_model(_cfg(tiny_tree, tmp_path / "x"))
    with pytest.raises(CheckpointError, match=r"model.weights_copy=ema, but the checkpoint holds no EMA"):
        ckpt.load_weights(model, str(tmp_path / "run" / "best"), copy="ema")


@pytest.mark.parametrize("graph", ["dynamic", "static"])
def test_an_ema_turned_on_at_a_resume_starts_from_the_resumed_weights(tiny_tree, tmp_path, graph):
    """A checkpoint trained without the EMA holds none: the shadow must not keep the random weights
    the resumed run was built with (with decay 0.9999 they would still be 37 % of it after 10k steps)."""
    from ppdlx.engine.hooks import Checkpoint
    from ppdlx.engine.run import build_training
    with paddle.utils.unique_name.guard():
        plain = build_training(_cfg(tiny_tree, tmp_path / "run", f"train.graph={graph}"))
    trained = _scaled_weights(_numpy(plain.step.model_state()), 1)
    plain.step.load_state(trained, None, {})
    plain.epoch = 1
    plain.find_hook(Checkpoint).save(improved=True)
    with paddle.utils.unique_name.guard():
        resumed = build_training(_cfg(tiny_tree, tmp_path / "run", "ema.enabled=true", "train.resume=auto",
                                      f"train.graph={graph}"))
    assert resumed.epoch == 1
    ema = resumed.step.ema
    shadow = _numpy(ema.shadow) if hasattr(ema, "shadow") else \
        {k: resumed.step.get_var(v) for k, v in resumed.step.pr.ema_shadow.items()}
    assert len(shadow) > 10 and ema.updates == 0
    differ = [k for k in shadow if not np.allclose(shadow[k], trained[k])]
    assert not differ, f"{len(differ)} EMA shadows are not the resumed weights, e.g. {differ[:2]}"
