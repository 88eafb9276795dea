"""End-to-end training behaviour on a tiny ResNet and real (digits) JPEGs."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import paddle
import pytest
import yaml

from ppdlx.checkpoint import load_states, read_pdparams
from ppdlx.config import load_config
from ppdlx.engine.run import build_training
from ppdlx.errors import UnsupportedError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "tools", "train.py")


def tiny_overrides(root, out, *extra):
    return [f"data.root={root}", f"global.output_dir={out}", "global.device=cpu", "global.log_interval=1",
            "model.name=resnet18_bottleneck_tiny", "model.num_classes=4", "data.batch_size=8", "data.workers=0",
            "data.backend=paddle",
            "data.transforms.crop_size=32", "data.transforms.resize_short=32", "data.transforms.hflip=0.5",
            "data.transforms.scale=[0.5, 1.0]", "train.epochs=3", "lr.base_lr=0.1", "lr.scale_with_batch=false", "lr.warmup_epochs=1",
            *extra]


def run_cli(args, **kw):
    return subprocess.run([sys.executable, TRAIN, "-c", os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml"),
                           "-o", *args], capture_output=True, text=True, timeout=600, **kw)


def load_params(prefix):
    return {k: np.asarray(v) for k, v in read_pdparams(prefix).items()}


def test_kill_and_resume_gives_bit_identical_weights(tiny_tree, tmp_path):
    extra = ["ema.enabled=true", "ema.decay=0.9", "train.mixup_alpha=0.2"]
    straight = run_cli(tiny_overrides(tiny_tree, tmp_path / "straight", *extra))
    assert straight.returncode == 0, straight.stderr[-2000:]

    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, TRAIN, "-c", os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml"),
                             "-o", *tiny_overrides(tiny_tree, out, *extra)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not (out / "epoch_1" / "manifest.json").exists():
        assert proc.poll() is None and time.time() < deadline, "run ended before epoch 1 was saved"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "epoch_3").exists(), "killed too late to test resume"
    resumed = run_cli(tiny_overrides(tiny_tree, out, *extra, "train.resume=auto"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from" in resumed.stdout

    a, b = load_params(str(tmp_path / "straight" / "latest")), load_params(str(out / "latest"))
    assert a.keys() == b.keys()
    assert max(float(np.abs(a[k] - b[k]).max()) for k in a) == 0.0
    sa = load_states(str(tmp_path / "straight" / "latest.pdstates"))
    sb = load_states(str(out / "latest.pdstates"))
    assert sa["global_step"] == sb["global_step"] == 3 * 8
    for k in sa["ema"]["shadow"]:
        assert np.array_equal(sa["ema"]["shadow"][k], sb["ema"]["shadow"][k])
    # metrics.jsonl holds one JSON record per progress line
    records = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert {"train", "eval"} <= {r["kind"] for r in records}
    assert all("ips_global" in r and "ips_per_device" in r for r in records if r["kind"] == "train")


def test_resume_with_dali_trains_on_the_crops_of_the_run_it_resumes(tiny_tree, tmp_path):
    """The DALI loader keeps one pipeline per run, so epoch 2's crops and flips follow from epoch 1's: the
    checkpoint carries that random state, and a run resumed from epoch 1 ends on the same weights."""
    extra = ["data.backend=dali", "data.dali.device=cpu", "data.dali.num_threads=2", "train.epochs=2"]
    straight = run_cli(tiny_overrides(tiny_tree, tmp_path / "straight", *extra))
    assert straight.returncode == 0, straight.stderr[-2000:]
    states = load_states(str(tmp_path / "straight" / "epoch_1.pdstates"))
    assert len(states["train_loader"]) == 1 and states["train_loader"][0]["dali_checkpoint"]
    resumed = run_cli(tiny_overrides(tiny_tree, tmp_path / "resumed", *extra,
                                     f"train.resume={tmp_path / 'straight' / 'epoch_1'}"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from" in resumed.stdout and "drawn afresh" not in resumed.stdout + resumed.stderr
    a, b = load_params(str(tmp_path / "straight" / "latest")), load_params(str(tmp_path / "resumed" / "latest"))
    assert max(float(np.abs(a[k] - b[k]).max()) for k in a) == 0.0


def test_bf16_amp_on_cpu_trains_and_says_it_is_float32(tiny_tree, tmp_path, ppdlx_caplog):
    caplog = ppdlx_caplog  # amp.cpu_bf16=false: where bf16 is not used (tests/models/test_cpu_bf16.py when it is)
    cfg = load_config(None, tiny_overrides(tiny_tree, tmp_path, "amp.enabled=true", "amp.dtype=bfloat16",
                                           "amp.cpu_bf16=false",
                                           "train.epochs=4", "data.transforms.random=false",
                                           # 0.05 sat at the edge of stability: whether 4 epochs gained
                                           # 0.3 depended on 1e-4 rounding differences between kernels
                                           "lr.base_lr=0.02", "model.args.zero_init_last_bn=true"))
    with caplog.at_level("INFO", logger="ppdlx"):
        trainer = build_training(cfg)
    notes = [r.getMessage() for r in caplog.records if r.getMessage().startswith("amp:")]
    assert len(notes) == 1 and "training runs in float32" in notes[0] and "(amp.cpu_bf16=false)" in notes[0]
    losses = []
    trainer.step.objective = _recording(trainer.step.objective, losses)
    trainer.fit()
    first, last = np.mean(losses[:8]), np.mean(losses[-8:])  # first vs last epoch
    assert last < first - 0.3, (first, last)


def _recording(objective, sink):
    def wrapped(model, batch, epoch, step):
        loss, n = objective(model, batch, epoch, step)
        sink.append(float(loss))
        return loss, n
    return wrapped


def test_fp16_on_a_cpu_build_is_one_clear_line(tiny_tree, tmp_path):
    cfg = load_config(None, tiny_overrides(tiny_tree, tmp_path, "amp.enabled=true", "amp.dtype=float16"))
    with pytest.raises(UnsupportedError) as err:
        build_training(cfg)
    assert str(err.value) == ("amp.dtype=float16 needs a GPU and this Paddle build has no CUDA; "
                              "use amp.dtype=bfloat16 or amp.enabled=false on CPU")
    proc = run_cli(tiny_overrides(tiny_tree, tmp_path, "amp.enabled=true", "amp.dtype=float16"))
    assert proc.returncode == 3 and proc.stderr.strip().splitlines()[-1].startswith("error: amp.dtype=float16")


def test_nonfinite_losses_stop_the_run_with_a_message(tiny_tree, tmp_path):
    cfg = load_config(None, tiny_overrides(tiny_tree, tmp_path, "train.max_nonfinite_steps=3"))
    trainer = build_training(cfg)
    objective = trainer.step.objective

    def poisoned(model, batch, epoch, step):
        loss, n = objective(model, batch, epoch, step)
        return loss * float("nan") if step >= 2 else loss, n

    trainer.step.objective = poisoned
    before = {k: v.numpy().copy() for k, v in trainer.step.raw_model.state_dict().items()}
    with pytest.raises(Exception) as err:
        trainer.fit()
    assert "loss was NaN/inf for 3 consecutive steps" in str(err.value)
    assert trainer.global_step == 2  # the poisoned steps were skipped, not applied
    after = trainer.step.raw_model.state_dict()
    assert all(np.isfinite(after[k].numpy()).all() for k in before)


def test_gradient_accumulation_matches_the_big_batch(tiny_tree, tmp_path):
    """2 x 4 images accumulated == one batch of 8 (no BN-batch effects: eval-mode BN)."""
    results = []
    for extra in (["data.batch_size=8"], ["data.batch_size=4", "train.accumulate=2"]):
        cfg = load_config(None, tiny_overrides(tiny_tree, tmp_path / extra[-1], "train.epochs=1",
                                               "train.steps_per_epoch=2", "data.transforms.random=false",
                                               "loss.label_smoothing=0.0", *extra))
        paddle.seed(0)
        trainer = build_training(cfg)
        trainer.train_loader.batch_sampler.shuffle = False
        objective = trainer.step.objective

        def bn_frozen(model, batch, epoch, step, _objective=objective):
            for layer in model.sublayers():
                if isinstance(layer, paddle.nn.BatchNorm2D):
                    layer.training = False  # batch statistics would differ between 8 and 2 x 4
            return _objective(model, batch, epoch, step)

        trainer.step.objective = bn_frozen
        trainer.train_one_epoch()
        results.append({k: v.numpy() for k, v in trainer.step.raw_model.state_dict().items()})
    diffs = [float(np.abs(results[0][k] - results[1][k]).max()) for k in results[0]]
    assert max(diffs) < 1e-5
    assert trainer.global_step == 2


def test_fast_cpu_kernels_that_cannot_build_are_one_line_or_off(tiny_tree, tmp_path):
    """The oneDNN op cannot be built when its cache directory cannot be created: ``true`` is a
    one-line error (exit 3), ``auto`` trains on Paddle's kernels and says why in the log."""
    env = dict(os.environ, PPDLX_OPS_CACHE="/proc/ppdlx-ops")  # /proc: mkdir fails
    args = tiny_overrides(tiny_tree, tmp_path, "train.epochs=1", "train.steps_per_epoch=1")
    proc = run_cli([*args, "global.cpu_fast_kernels=true"], env=env)
    assert proc.returncode == 3
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: global.cpu_fast_kernels=true: building onednn_kernels.cc failed"), last
    assert "global.cpu_fast_kernels=false" in last
    proc = run_cli([*args, "global.cpu_fast_kernels=auto"], env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "global.cpu_fast_kernels=auto: off, building onednn_kernels.cc failed" in proc.stderr + proc.stdout
    # the decision is the run's plan, saved next to its config (the config keeps "auto")
    plan = yaml.safe_load(open(os.path.join(tmp_path, "plan.yaml")))
    assert plan["fast_cpu_kernels"] is False and plan["data_format"] == "NCHW"
    assert "cpu_fast_kernels: auto" in open(os.path.join(tmp_path, "config.yaml")).read()
