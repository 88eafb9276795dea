"""Static-graph training (``train.graph=static``) and ``to_static`` against the dynamic trainer.

The same tiny ResNet, seed, data order (``data.transforms.random=false``, no mixup), fp32:
losses agree step by step, checkpoints load across modes with the same logits, resume
crosses modes, legacy IR (subprocess) agrees too.
"""
import itertools
import json
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest

from ppdlx import checkpoint as ckpt
from ppdlx.config import load_config
from ppdlx.data.mixing import MixSpec, draw_mix
from ppdlx.engine.hooks import Evaluation
from ppdlx.engine.run import build_training, plan_training_amp
from ppdlx.engine.static.step import ProgramModel
from ppdlx.errors import UnsupportedError
from ppdlx.models.from_config import build_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml")


def overrides(root, out, graph, *extra):
    return [f"data.root={root}", f"global.output_dir={out}", "global.device=cpu", "global.log_interval=1",
            "model.name=resnet18_bottleneck_tiny", "model.num_classes=4", "data.batch_size=8", "data.workers=0",
            "data.transforms.crop_size=32", "data.transforms.resize_short=32", "data.transforms.random=false",
            "train.mixup_alpha=0", "amp.enabled=false", "train.epochs=2", "train.steps_per_epoch=3",
            "lr.base_lr=0.1", "lr.scale_with_batch=false", "lr.warmup_epochs=0.5", f"train.graph={graph}",
            "global.cpu_fast_kernels=false",  # static and dynamic compared on the same CPU kernels
            *extra]


def train_recording(cfg):
    """Train ``cfg`` in-process; returns (trainer, per-micro-batch losses)."""
    losses = []
    trainer = build_training(cfg)
    if cfg.train.graph == "static":
        step = trainer.step
        run = step.run_program

        def recording_run(program, feed, fetch, _run=run):
            out = _run(program, feed, fetch)
            if program is step.pr.main:
                losses.append(float(np.asarray(out[0])))
            return out
        step.run_program = recording_run
    else:
        objective = trainer.step.objective

        def recording(model, batch, epoch, step, _objective=objective):
            loss, n = _objective(model, batch, epoch, step)
            losses.append(float(loss))
            return loss, n
        trainer.step.objective = recording
    trainer.fit()
    return trainer, losses


def params(prefix):
    return {k: np.asarray(v) for k, v in ckpt.read_pdparams(prefix).items()}


def max_diff(a, b):
    assert a.keys() == b.keys()
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


def assert_same_losses(ref, got):
    assert len(ref) == len(got) == 6
    rel = [abs(a - b) / abs(a) for a, b in zip(ref, got)]
    assert max(rel) < 1e-4, (ref, got)


@pytest.fixture(scope="module")
def runs(tiny_tree, tmp_path_factory):
    """2 epochs x 3 steps with an eval and a checkpoint in between, in each graph mode."""
    base = tmp_path_factory.mktemp("graph_modes")
    out = {}
    for graph in ("dynamic", "static", "to_static"):
        cfg = load_config(DEMO, overrides(tiny_tree, base / graph, graph))
        trainer, losses = train_recording(cfg)
        out[graph] = {"trainer": trainer, "losses": losses, "dir": base / graph, "cfg": cfg}
    return out


def test_static_and_to_static_losses_match_dynamic_step_by_step(runs):
    ref = runs["dynamic"]["losses"]
    assert ref[-1] != ref[0]  # it trains
    for graph in ("static", "to_static"):
        assert_same_losses(ref, runs[graph]["losses"])
        final = params(str(runs[graph]["dir"] / "latest"))
        assert max_diff(params(str(runs["dynamic"]["dir"] / "latest")), final) < 1e-5
        dyn, got = runs["dynamic"]["trainer"].last_metrics, runs[graph]["trainer"].last_metrics
        assert (got["top1"], got["top5"], got["images"]) == (dyn["top1"], dyn["top5"], dyn["images"])
    # the same files, the same progress lines
    static_dir = runs["static"]["dir"]
    for name in ("latest", "best", "epoch_1", "epoch_2"):
        ckpt.verify(str(static_dir / name))  # complete: every file its manifest lists, intact
        assert sorted(os.listdir(static_dir / name)) == ["manifest.json", "model.pdparams", "optimizer.pdopt",
                                                         "states.pdstates"]
    records = [json.loads(line) for line in open(static_dir / "metrics.jsonl")]
    assert [r["kind"] for r in records].count("train") == 6 and [r["kind"] for r in records].count("eval") == 2
    assert all("ips_global" in r and "ips_per_device" in r for r in records if r["kind"] == "train")
    # optimizer state: the dynamic optimizer's layout and values (keys can differ in-process)
    dyn_opt = paddle.load(str(runs["dynamic"]["dir"] / "latest" / "optimizer.pdopt"))
    st_opt = paddle.load(str(static_dir / "latest" / "optimizer.pdopt"))
    assert dyn_opt["LR_Scheduler"] == st_opt["LR_Scheduler"]
    dyn_vals = [np.asarray(v) for k, v in dyn_opt.items() if k != "LR_Scheduler"]
    st_vals = [np.asarray(v) for k, v in st_opt.items() if k != "LR_Scheduler"]
    assert len(dyn_vals) == len(st_vals) and max(float(np.abs(a - b).max()) for a, b in zip(dyn_vals, st_vals)) < 1e-5


def test_checkpoints_load_across_modes_with_the_same_logits(runs, tiny_tree, tmp_path):
    static = runs["static"]["trainer"]
    images, _ = next(iter(static.find_hook(Evaluation).evaluator.loader))
    # static checkpoint -> dynamic model (what export does)
    model = build_model(runs["static"]["cfg"])
    assert ckpt.load_weights(model, str(runs["static"]["dir"] / "latest")) == []
    model.eval()
    with paddle.no_grad():
        dyn_logits = model(images).numpy()
    static_logits = ProgramModel(static.step)(images).numpy()
    assert np.abs(dyn_logits - static_logits).max() < 1e-5
    # dynamic checkpoint -> static programs (model.weights)
    cfg = load_config(DEMO, overrides(tiny_tree, tmp_path, "static",
                                      f"model.weights={runs['dynamic']['dir'] / 'latest'}"))
    loaded = build_training(cfg)
    dynamic = runs["dynamic"]["trainer"].step.raw_model
    dynamic.eval()
    with paddle.no_grad():
        ref = dynamic(images).numpy()
    assert np.abs(ProgramModel(loaded.step)(images).numpy() - ref).max() < 1e-5


def test_resume_crosses_graph_modes(runs, tiny_tree, tmp_path):
    """dynamic epoch 1 -> static epoch 2, and static epoch 1 -> dynamic epoch 2 (fresh process,
    tools/train.py): both end where the uninterrupted runs ended (weights, momentum, LR, step)."""
    cfg = load_config(DEMO, overrides(tiny_tree, tmp_path / "s", "static",
                                      f"train.resume={runs['dynamic']['dir'] / 'epoch_1'}"))
    trainer = build_training(cfg)
    assert (trainer.epoch, trainer.global_step) == (1, 3)
    trainer.fit()
    assert max_diff(params(str(tmp_path / "s" / "latest")), params(str(runs["dynamic"]["dir"] / "latest"))) < 1e-5

    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "train.py"), "-c", DEMO, "-o",
                           *overrides(tiny_tree, tmp_path / "d", "dynamic",
                                      f"train.resume={runs['static']['dir'] / 'epoch_1'}")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "resumed from" in proc.stdout
    assert max_diff(params(str(tmp_path / "d" / "latest")), params(str(runs["static"]["dir"] / "latest"))) < 1e-5
    assert ckpt.load_states(str(tmp_path / "d" / "latest.pdstates"))["global_step"] == 6


def test_accumulation_ema_mixup_and_cutmix_match_dynamic(tiny_tree, tmp_path):
    extra = ["data.batch_size=4", "train.accumulate=2", "ema.enabled=true", "ema.decay=0.9",
             "ema.dynamic_decay=true", "train.mixup_alpha=0.2", "train.cutmix_alpha=1.0", "train.epochs=1",
             "train.steps_per_epoch=3"]
    cfg = load_config(DEMO, overrides(tiny_tree, tmp_path, "dynamic", *extra))
    draws = [draw_mix(MixSpec.of(cfg.train), cfg.global_.seed, 0, step, 32, 32) for step in range(3)]
    assert [d.box[1] > d.box[0] for d in draws] == [False, True, False]  # Mixup, CutMix, Mixup
    results = {}
    for graph in ("dynamic", "static"):
        cfg = load_config(DEMO, overrides(tiny_tree, tmp_path / graph, graph, *extra))
        trainer, losses = train_recording(cfg)
        results[graph] = (trainer, losses)
    ref, got = results["dynamic"][1], results["static"][1]
    assert len(ref) == len(got) == 6  # 3 optimizer steps x 2 micro-batches
    assert max(abs(a - b) / abs(a) for a, b in zip(ref, got)) < 1e-4
    assert max_diff(params(str(tmp_path / "dynamic" / "latest")), params(str(tmp_path / "static" / "latest"))) < 1e-5
    dyn_ema = ckpt.load_states(str(tmp_path / "dynamic" / "latest.pdstates"))["ema"]
    st_ema = ckpt.load_states(str(tmp_path / "static" / "latest.pdstates"))["ema"]
    assert dyn_ema["updates"] == st_ema["updates"] == 3
    assert max(float(np.abs(dyn_ema["shadow"][k] - st_ema["shadow"][k]).max()) for k in dyn_ema["shadow"]) < 1e-5
    assert results["static"][0].last_metrics["weights"] == "ema"


def test_global_norm_clipping_matches_dynamic(tiny_tree, tmp_path):
    """optimizer.grad_clip_norm clips by the norm of all gradients. Before, the dynamic step's optimizer
    held two parameter groups (decay / no decay) and Paddle clips each group on its own, so the
    dynamic weights left the static ones (one list) by 3.6e-3 with this norm."""
    extra = ["optimizer.grad_clip_norm=0.05", "train.epochs=1", "train.steps_per_epoch=3"]
    for graph in ("dynamic", "static"):
        train_recording(load_config(DEMO, overrides(tiny_tree, tmp_path / graph, graph, *extra)))
    dynamic, static = params(str(tmp_path / "dynamic" / "latest")), params(str(tmp_path / "static" / "latest"))
    assert max_diff(dynamic, static) < 1e-5
    unclipped = tmp_path / "unclipped"
    train_recording(load_config(DEMO, overrides(tiny_tree, unclipped, "dynamic", "train.epochs=1",
                                                "train.steps_per_epoch=3")))
    assert max_diff(dynamic, params(str(unclipped / "latest"))) > 1e-3  # the norm binds


def test_nonfinite_steps_are_skipped_then_stop_the_run(tiny_tree, tmp_path):
    # The NaN batches also reach the BN running statistics (forward), which the weight check at each log line
    # and before each checkpoint reports (tests/engine/test_nonfinite_weights.py); rare logging and an epoch
    # longer than the poisoned run let the loss limit speak first here.
    cfg = load_config(DEMO, overrides(tiny_tree, tmp_path, "static", "train.max_nonfinite_steps=3",
                                      "train.mixup_alpha=0.2", "global.log_interval=100", "train.steps_per_epoch=6"))
    trainer = build_training(cfg)
    feed = trainer.step.feed
    before = {}

    def poisoned(batch, last_of_window):  # a NaN mixup weight -> NaN targets -> NaN loss and grads
        out = feed(batch, last_of_window)
        if trainer.global_step >= 2:
            before.setdefault("weights", trainer.step.model_state())
            out["mix_lam"] = out["mix_lam"] * np.float32("nan")
        return out
    trainer.step.feed = poisoned
    with pytest.raises(Exception) as err:
        trainer.fit()
    assert "loss was NaN/inf for 3 consecutive steps" in str(err.value)
    assert trainer.global_step == 2  # the poisoned steps were skipped in the program, not applied
    trainable = [k for k in before["weights"] if not k.endswith(("_mean", "_variance"))]  # BN stats move in forward
    after = trainer.step.model_state()
    assert max(float(np.abs(before["weights"][k] - after[k]).max()) for k in trainable) == 0.0


@pytest.mark.parametrize("graph", ["dynamic", "static"])
def test_a_nan_micro_batch_skips_its_whole_accumulation_window(tiny_tree, tmp_path, graph):
    """The static program applied a window whose first micro-batch was NaN when its last was finite."""
    cfg = load_config(DEMO, overrides(tiny_tree, tmp_path, graph, "data.batch_size=4", "train.accumulate=2",
                                      "train.mixup_alpha=0.2", "lr.warmup_epochs=0"))
    trainer = build_training(cfg)
    step, calls = trainer.step, []
    trainer.train_loader.set_epoch(0)
    step.train_mode()
    first, second = itertools.islice(iter(trainer.train_loader), 2)
    if graph == "static":  # a NaN mixup weight: NaN targets, so a NaN loss
        feed = step.feed

        def poisoned(batch, last_of_window):
            out = feed(batch, last_of_window)
            calls.append(1)
            if len(calls) == 1:
                out["mix_lam"] = out["mix_lam"] * np.float32("nan")
            return out
        step.feed = poisoned
    else:
        objective = step.objective

        def poisoned(model, batch, epoch, global_step):
            loss, n = objective(model, batch, epoch, global_step)
            calls.append(1)
            return (loss * float("nan") if len(calls) == 1 else loss), n
        step.objective = poisoned
    def weights():  # BN statistics move in every forward
        return {k: np.array(v.numpy() if hasattr(v, "numpy") else v) for k, v in step.model_state().items()
                if not k.endswith(("_mean", "_variance"))}

    before = weights()
    assert not np.isfinite(float(step.run(first, False).loss))
    result = step.run(second, True)
    assert np.isfinite(float(result.loss)) and not bool(result.finite) and not result.applied
    assert max(float(np.abs(before[k] - v).max()) for k, v in weights().items()) == 0.0
    window = step.run(first, False), step.run(second, True)  # the next window is applied again
    assert window[1].applied and max(float(np.abs(before[k] - v).max()) for k, v in weights().items()) > 0.0


def test_unsupported_combinations_are_one_line(tiny_tree, tmp_path):
    # fp16 on a CPU build: the dynamic trainer's line
    cfg = load_config(DEMO, overrides(tiny_tree, tmp_path, "static", "amp.enabled=true", "amp.dtype=float16"))
    with pytest.raises(UnsupportedError) as err:
        build_training(cfg)
    assert str(err.value).startswith("amp.dtype=float16 needs a GPU")
    # bf16 on this CPU: a note, then float32 (the probe step of this model: no bf16 batch_norm kernel)
    cfg = load_config(DEMO, overrides(tiny_tree, tmp_path, "static", "amp.enabled=true", "amp.dtype=bfloat16",
                                      "amp.level=O2"))
    plan = plan_training_amp(cfg, "cpu")
    assert not plan.enabled and plan.note.endswith("training runs in float32")
    assert "batch_norm" in plan.note, plan.note
    # oneDNN breaks static programs (to_static: "dst_tensor ... defined"): refused up front
    paddle.set_flags({"FLAGS_use_onednn": True})
    try:
        for graph in ("static", "to_static"):
            cfg = load_config(DEMO, overrides(tiny_tree, tmp_path, graph))
            with pytest.raises(UnsupportedError) as err:
                build_training(cfg)
            assert str(err.value).startswith(f"train.graph={graph} with FLAGS_use_onednn=1:")
    finally:
        paddle.set_flags({"FLAGS_use_onednn": False})


LEGACY_SCRIPT = r"""
import json, sys
sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
import paddle
assert not paddle.base.framework.use_pir_api()
from ppdlx.config import load_config
from tests.engine.test_static import DEMO, overrides, train_recording
out = {{}}
for graph in ("dynamic", "static", "to_static"):
    cfg = load_config(DEMO, overrides({tree!r}, {out!r} + "/" + graph, graph, *{extra!r}))
    trainer, losses = train_recording(cfg)
    out[graph] = losses
print("LOSSES " + json.dumps(out))
"""


def test_legacy_ir_matches_too(tiny_tree, tmp_path):
    """FLAGS_enable_pir_api=0 (set before paddle loads, hence a subprocess)."""
    code = LEGACY_SCRIPT.format(root=ROOT, tests=os.path.join(ROOT, "tests"), tree=tiny_tree, out=str(tmp_path),
                                extra=["train.accumulate=2", "data.batch_size=4", "train.epochs=1"])
    env = dict(os.environ, FLAGS_enable_pir_api="0")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "graph static (legacy IR" in proc.stdout
    losses = json.loads(proc.stdout.split("LOSSES ", 1)[1].splitlines()[0])
    assert_same_losses(losses["dynamic"], losses["static"])
    assert_same_losses(losses["dynamic"], losses["to_static"])
