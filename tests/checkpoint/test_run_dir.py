"""The training's output directory (``ppdlx.checkpoint.run_dir``): one training at a time (a lock a killed holder
leaves is taken over), never a fresh start over checkpoints unless asked, an unwritable directory or a failed
save is one line, and a checkpoint of another model is refused before training."""
import os
import signal
import subprocess
import sys
import time

import paddle
import pytest

from ppdlx import checkpoint as ckpt
from ppdlx.config import load_config
from ppdlx.errors import ConfigError
from ppdlx.models import build_model
from tests.engine.test_training import tiny_overrides

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "tools", "train.py")
CONFIG = os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml")
FAULTS = os.path.join(ROOT, "tests", "checkpoint", "fault_injection")


def start(tree, out, *extra, **faults):
    """tools/train.py on the tiny tree; ``faults``: PPDLX_FAULT_<NAME> settings (tests/checkpoint/fault_injection)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([FAULTS, os.environ.get("PYTHONPATH", "")]),
               PPDLX_FAULT_DIR=str(out), **{f"PPDLX_FAULT_{k.upper()}": v for k, v in faults.items()})
    return subprocess.Popen([sys.executable, TRAIN, "-c", CONFIG, "-o",
                             *tiny_overrides(tree, out, "train.epochs=2", "train.steps_per_epoch=1", *extra)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def finish(proc):
    stdout, stderr = proc.communicate(timeout=600)
    return proc.returncode, stdout, stderr


def last_line(text):
    return text.strip().splitlines()[-1]


def stopped(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def tiny_checkpoint(path, **identity):
    paddle.seed(0)
    model = build_model("resnet18_bottleneck_tiny", num_classes=4)
    extra = [identity] if identity else []  # the manifest's model identity
    ckpt.save_checkpoint(str(path), model.state_dict(), None, {"epoch": 1, "global_step": 1}, *extra)


def test_one_training_per_directory_a_killed_holder_is_taken_over_and_a_failed_save_stops_cleanly(tiny_tree, tmp_path):
    out = tmp_path / "run"
    holder = start(tiny_tree, out, stop="open config.yaml.tmp.<pid>")  # stops alive, after taking the directory
    deadline = time.time() + 300
    while not (os.path.exists(f"/proc/{holder.pid}") and stopped(holder.pid)):
        assert holder.poll() is None and time.time() < deadline, holder.communicate()
        time.sleep(0.1)
    try:
        code, _, stderr = finish(start(tiny_tree, out))
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.communicate()
    assert code == 2, stderr[-2000:]
    assert last_line(stderr) == (f"error: global.output_dir={out} is in use by another training (pid {holder.pid} "
                                 f"holds {out}/train.lock); wait for it to end, or use another global.output_dir")

    # the killed holder's lock is taken over; the second save fails for real (the kernel refuses writes past 4 KB)
    failing = start(tiny_tree, out, file_limit="mkdir epoch_2.tmp-<pid>=4096")
    code, stdout, stderr = finish(failing)
    assert f"took over {out}/train.lock from pid {holder.pid}, which ended without releasing it" in stdout + stderr
    assert code == 2, stderr[-2000:]
    assert last_line(stderr) == (f"error: saving checkpoint {out}/epoch_2 failed (File too large: "
                                 f"{out}/epoch_2.tmp-{failing.pid}/model.pdparams); latest -> epoch_1 is complete. "
                                 f"Free space or fix the directory, then continue with train.resume=auto")
    assert sorted(n for n in os.listdir(out) if "epoch" in n or n in ("latest", "best")) == ["best", "epoch_1",
                                                                                            "latest"]
    ckpt.verify(str(out / "latest"))
    assert ckpt.load_states(str(out / "latest"))["epoch"] == 1


def test_no_fresh_start_over_checkpoints_unless_asked(tiny_tree, tmp_path, ppdlx_caplog):
    out = tmp_path / "run"
    tiny_checkpoint(out / "latest")
    code, _, stderr = finish(start(tiny_tree, out))
    assert code == 2, stderr[-2000:]
    assert last_line(stderr) == (f"error: global.output_dir={out} already holds checkpoints (latest); pass "
                                 f"train.resume=auto to continue from the newest complete one, train.resume=never to "
                                 f"start over (replacing them), or another global.output_dir")
    assert os.path.isfile(out / "latest" / "manifest.json")  # untouched
    from ppdlx.checkpoint.run_dir import prepare_output_dir, release_output_dir
    cfg = load_config(None, tiny_overrides(tiny_tree, out, "train.resume=never"))
    with ppdlx_caplog.at_level("INFO", logger="ppdlx"):
        assert prepare_output_dir(cfg, rank=0) is None
    release_output_dir(str(out))
    assert ppdlx_caplog.messages[-1] == f"train.resume=never: removed the checkpoints in {out} (latest)"
    assert not os.path.lexists(out / "latest")


def test_an_unwritable_output_dir_is_one_line_before_anything_is_built(tiny_tree, tmp_path):
    (tmp_path / "file").write_text("not a directory")
    out = tmp_path / "file" / "run"
    code, _, stderr = finish(start(tiny_tree, out))
    assert code == 2, stderr[-2000:]
    assert last_line(stderr) == (f"error: global.output_dir={out}: cannot write there (Not a directory: {out}); "
                                 f"choose a writable global.output_dir")


def test_a_checkpoint_of_another_model_is_refused_before_training(tiny_tree, tmp_path):
    from ppdlx.engine.run import build_training
    resume = ["train.resume=auto", "global.cpu_fast_kernels=false"]
    out = tmp_path / "shapes"  # no name recorded, no optimizer state: the parameters tell
    paddle.seed(0)
    other = build_model("resnet18_bottleneck_tiny", num_classes=10)
    ckpt.save_checkpoint(str(out / "latest"), other.state_dict(), None, {"epoch": 1, "global_step": 1})
    with pytest.raises(ConfigError) as err:
        build_training(load_config(CONFIG, tiny_overrides(tiny_tree, out, *resume)))
    assert str(err.value) == (f"train.resume: {out}/latest is a checkpoint of another model (parameter 'fc.weight' is "
                              f"[512, 10] in the checkpoint but [512, 4] here); resume with the model.name/num_classes "
                              f"it was trained with, or train into another global.output_dir")
    out = tmp_path / "named"
    tiny_checkpoint(out / "latest", name="resnet50", num_classes=1000)  # manifest: another registry name
    with pytest.raises(ConfigError) as err:
        build_training(load_config(CONFIG, tiny_overrides(tiny_tree, out, *resume)))
    assert str(err.value) == (f"train.resume: {out}/latest is a checkpoint of model 'resnet50' (1000 classes) but this "
                              f"run builds 'resnet18_bottleneck_tiny'; set model.name=resnet50, or train into another "
                              f"global.output_dir (or train.resume=never to replace it)")


def test_resume_never_through_a_link_to_another_run_is_refused_naming_the_real_folder(tiny_tree, tmp_path):
    # Before: the other run's checkpoints were removed while the log named only the link.
    other = tmp_path / "other_run"
    tiny_checkpoint(other / "latest")
    (tmp_path / "runs").mkdir()
    link = tmp_path / "runs" / "mine"
    os.symlink(other, link)
    from ppdlx.checkpoint.run_dir import prepare_output_dir, release_output_dir
    for out in (link, link / "."):  # the link itself, or a path through it
        cfg = load_config(None, tiny_overrides(tiny_tree, out, "train.resume=never"))
        with pytest.raises(ConfigError) as err:
            prepare_output_dir(cfg, rank=0)
        assert str(err.value) == (f"global.output_dir={out} leads through a symbolic link to {other}, which holds "
                                  f"checkpoints (latest); train.resume=never would remove them: to start over there, "
                                  f"pass global.output_dir={other}, or choose another global.output_dir")
    assert sorted(os.listdir(other)) == ["latest"] and os.path.isfile(other / "latest" / "manifest.json")
    # through the link without checkpoints behind it, or named by its real path, a fresh start goes ahead
    cfg = load_config(None, tiny_overrides(tiny_tree, other, "train.resume=never"))
    assert prepare_output_dir(cfg, rank=0) is None
    release_output_dir(str(other))
    assert not os.path.lexists(other / "latest")
    cfg = load_config(None, tiny_overrides(tiny_tree, link, "train.resume=never"))
    assert prepare_output_dir(cfg, rank=0) is None
    release_output_dir(str(link))


@pytest.mark.parametrize("inside", ["train", "train/run", "", "elsewhere/../val/x"])
def test_an_output_dir_inside_the_data_is_refused_before_anything_is_created(tiny_tree, tmp_path, inside):
    # Before: the run created its folder among the class folders, then blamed the data ("1 class without images"),
    # and so did every later run on that data.
    root = tmp_path / "tree"
    import shutil
    shutil.copytree(tiny_tree, root)
    before = sorted(os.listdir(root / "train"))
    out = os.path.join(str(root), inside) if inside else str(root)
    code, _, stderr = finish(start(str(root), out))
    assert code == 2, stderr[-2000:]
    assert last_line(stderr) == (f"error: global.output_dir={out} is inside data.root={root}: what a run writes there "
                                 f"would mix with the data (in an image-folder split, its folder would become a "
                                 f"class); choose a global.output_dir outside data.root")
    assert sorted(os.listdir(root / "train")) == before and not os.path.exists(os.path.join(str(root), "elsewhere"))


def test_resuming_at_another_global_batch_says_what_changes(tiny_tree, tmp_path):
    # Before: only the usual plan line; the global batch and the peak learning rate changed silently.
    out = tmp_path / "run"
    code, _, stderr = finish(start(tiny_tree, out, "lr.scale_with_batch=true", "lr.base_batch=8", "train.epochs=1"))
    assert code == 0, stderr[-2000:]
    code, stdout, stderr = finish(start(tiny_tree, out, "lr.scale_with_batch=true", "lr.base_batch=8",
                                        "train.resume=auto", "data.batch_size=4"))
    assert code == 0, stderr[-2000:]
    lines = [line for line in (stdout + stderr).splitlines() if "was trained with global batch" in line]
    assert len(lines) == 1 and lines[0].endswith(
        f"{out}/latest was trained with global batch 8 (8 x 1 rank x 1 accumulate), peak lr 0.1; this run uses global "
        f"batch 4 (4 x 1 rank x 1 accumulate), peak lr 0.05: the learning rate schedule goes on at 0.5x the "
        f"checkpoint's, and the schedule continues from the same fraction of the training (its step count is carried "
        f"over); resume with the checkpoint's data.batch_size / train.accumulate / ranks to keep its recipe"), lines


def test_the_global_batch_line_says_nothing_for_the_same_recipe_or_an_older_checkpoint():
    from ppdlx.optim import batch_change_line
    now = {"batch_size": 4, "ranks": 2, "accumulate": 2, "global": 16, "peak_lr": 0.016}
    assert batch_change_line(dict(now), now, "ckpt") is None
    assert batch_change_line(None, now, "ckpt") is None  # a checkpoint written before the record: nothing to compare
    unscaled = batch_change_line(dict(now, ranks=1, **{"global": 8}), dict(now), "ckpt")
    assert unscaled.startswith("ckpt was trained with global batch 8 (4 x 1 rank x 2 accumulate), peak lr 0.016; this "
                               "run uses global batch 16 (4 x 2 ranks x 2 accumulate), peak lr 0.016: the learning "
                               "rate schedule is unchanged (lr.scale_with_batch=false), and the schedule continues")
