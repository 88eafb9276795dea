import os

import numpy as np
import paddle
import pytest

from ppdlx import checkpoint as ckpt
from ppdlx.errors import ConfigError
from ppdlx.models import build_model


def test_weights_shape_mismatch_names_the_parameter(tmp_path):
    paddle.save(build_model("resnet18_bottleneck_tiny", num_classes=10).state_dict(), str(tmp_path / "w.pdparams"))
    model = build_model("resnet18_bottleneck_tiny", num_classes=4)
    with pytest.raises(ConfigError) as err:
        ckpt.load_weights(model, str(tmp_path / "w"))
    assert str(err.value) == (f"model.weights={tmp_path}/w: parameter 'fc.weight' has shape [512, 10] in the file "
                              f"but [512, 4] in the model (different model.name/num_classes?)")


def test_weights_load_exactly_and_missing_file_is_one_line(tmp_path):
    src = build_model("resnet18_bottleneck_tiny", num_classes=4)
    paddle.save(src.state_dict(), str(tmp_path / "w.pdparams"))
    dst = build_model("resnet18_bottleneck_tiny", num_classes=4)
    assert ckpt.load_weights(dst, str(tmp_path / "w.pdparams")) == []
    a, b = src.state_dict(), dst.state_dict()
    assert max(float(np.abs(a[k].numpy() - b[k].numpy()).max()) for k in a) == 0.0
    with pytest.raises(ConfigError, match=r"model.weights=.*nope: .*nope.pdparams not found"):
        ckpt.load_weights(dst, str(tmp_path / "nope"))


def test_save_is_atomic_and_leaves_no_temporary_files(tmp_path):
    prefix = str(tmp_path / "latest")
    ckpt.save_checkpoint(prefix, {"w": paddle.ones([2])}, {"m": paddle.zeros([2])}, {"epoch": 3, "rng": ckpt.capture_rng()})
    assert os.listdir(tmp_path) == ["latest"]  # one directory, no temporary leftovers
    assert sorted(os.listdir(tmp_path / "latest")) == ["manifest.json", "model.pdparams", "optimizer.pdopt",
                                                       "states.pdstates"]
    model, opt, states = ckpt.load_checkpoint(prefix)
    assert states["epoch"] == 3 and float(model["w"].sum()) == 2.0


def test_resume_prefix_resolution(tmp_path):
    assert ckpt.resolve_resume("auto", str(tmp_path)) is None
    ckpt.save_checkpoint(str(tmp_path / "latest"), {}, None, {"epoch": 1})
    assert ckpt.resolve_resume("auto", str(tmp_path)) == str(tmp_path / "latest")
    assert ckpt.resolve_resume(str(tmp_path / "latest.pdparams"), str(tmp_path)) == str(tmp_path / "latest")
    with pytest.raises(ConfigError, match="no complete checkpoint"):
        ckpt.resolve_resume(str(tmp_path / "epoch_9"), str(tmp_path))


def test_reset_head_drops_only_the_classifier_and_other_mismatches_stay_errors(tmp_path, ppdlx_caplog):
    ppdlx_caplog.set_level("INFO", logger="ppdlx")
    src = build_model("resnet18_bottleneck_tiny", num_classes=10)
    paddle.save(src.state_dict(), str(tmp_path / "w.pdparams"))
    model = build_model("resnet18_bottleneck_tiny", num_classes=4)
    fresh_fc = model.state_dict()["fc.weight"].numpy().copy()
    assert ckpt.load_weights(model, str(tmp_path / "w"), "auto") == ["fc.weight", "fc.bias"]
    assert np.array_equal(model.state_dict()["fc.weight"].numpy(), fresh_fc)
    assert np.array_equal(model.state_dict()["stem.conv.weight"].numpy(), src.state_dict()["stem.conv.weight"].numpy())
    assert ppdlx_caplog.messages[-1] == (f"model.weights={tmp_path}/w: classifier re-initialised (fc.weight [512, 10] "
                                         f"-> [512, 4], fc.bias [10] -> [4]; model.reset_head=auto)")
    # true: the head is re-initialised even when its shapes match
    same = build_model("resnet18_bottleneck_tiny", num_classes=10)
    assert ckpt.load_weights(same, str(tmp_path / "w"), True) == ["fc.weight", "fc.bias"]
    # a mismatch outside the classifier is an error whatever reset_head says
    state = src.state_dict()
    state["stem.conv.weight"] = paddle.zeros([8, 3, 3, 3])
    paddle.save(state, str(tmp_path / "bad.pdparams"))
    with pytest.raises(ConfigError, match=r"parameter 'stem.conv.weight' has shape \[8, 3, 3, 3\] in the file"):
        ckpt.load_weights(build_model("resnet18_bottleneck_tiny", num_classes=4), str(tmp_path / "bad"), "auto")


def test_resume_auto_in_a_fresh_directory_starts_from_model_weights(tmp_path, tiny_tree):
    """train.resume=auto finds no checkpoint in a new output_dir: the run must start from model.weights, not from
    random weights (before: the weights were skipped whenever train.resume was set)."""
    from ppdlx.config import load_config
    from ppdlx.engine.run import build_training
    config = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                          "configs", "demo", "rn50_demo.yaml")
    overrides = [f"data.root={tiny_tree}", "model.name=resnet18_bottleneck_tiny", "model.num_classes=4",
                 "data.backend=paddle", "data.workers=0", "amp.enabled=false", "global.cpu_fast_kernels=false"]
    paddle.seed(123)
    source = build_model("resnet18_bottleneck_tiny", num_classes=4)
    ckpt.save_checkpoint(str(tmp_path / "w"), source.state_dict(), None, {"epoch": 0})
    trainer = build_training(load_config(config, overrides + [f"global.output_dir={tmp_path / 'run'}",
                                                              "train.resume=auto", f"model.weights={tmp_path}/w"]))
    loaded = trainer.step.raw_model.state_dict()
    for name, value in source.state_dict().items():
        np.testing.assert_array_equal(loaded[name].numpy(), value.numpy(), err_msg=name)


def test_resume_at_another_global_batch_continues_the_lr_schedule_where_the_epoch_ends(tmp_path, tiny_tree,
                                                                                      ppdlx_caplog):
    """Before: the applied step count (which places the learning-rate schedule) was carried over as is, so a run
    resumed with twice the global batch (half the steps per epoch: e.g. twice the ranks) sat past the schedule's
    end, at the peak learning rate of a restarted cosine."""
    from ppdlx.config import load_config
    from ppdlx.engine.hooks import LRScheduler
    from ppdlx.engine.run import build_training
    from ppdlx.optim.schedules import build_lr_schedule
    config = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                          "configs", "demo", "rn50_demo.yaml")
    overrides = [f"data.root={tiny_tree}", "model.name=resnet18_bottleneck_tiny", "model.num_classes=4",
                 "data.backend=paddle", "data.workers=0", "amp.enabled=false", "global.cpu_fast_kernels=false",
                 f"global.output_dir={tmp_path / 'run'}", "lr.warmup_epochs=1"]
    with paddle.utils.unique_name.guard():  # a resume is a new process: the same parameter names
        first = build_training(load_config(config, overrides + ["data.batch_size=8", "train.epochs=2"]))
        first.fit()
    assert first.global_step == 16  # 64 images / 8
    resumed_cfg = load_config(config, overrides + ["data.batch_size=16", "train.epochs=3", "train.resume=auto"])
    with paddle.utils.unique_name.guard():
        resumed = build_training(resumed_cfg)
    schedule = resumed.find_hook(LRScheduler).lr_schedule
    expected = build_lr_schedule(resumed_cfg, 16, 4)
    for _ in range(8):
        expected.step()
    assert resumed.epoch == 2 and resumed.global_step == 8  # the end of epoch 2 at 4 steps per epoch
    assert schedule.last_epoch == 8 and abs(schedule() - expected()) < 1e-9
    assert "was trained at 8 optimizer steps per epoch and this run makes 4" in ppdlx_caplog.text
    resumed.fit()
    assert resumed.global_step == 12 and abs(schedule() - resumed_cfg.lr.min_lr) < 1e-6  # the cosine's end
