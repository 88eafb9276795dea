"""A checkpoint is one directory that appears whole and that readers verify (``ppdlx.checkpoint.unit``),
named as before; the earlier three-file layout still reads; a failed save leaves the previous one intact.
Real files, real damage (cut, garbled, removed), a real kernel write failure (RLIMIT_FSIZE)."""
import os
import resource
import signal
import time

import numpy as np
import paddle
import pytest

from ppdlx import checkpoint as ckpt
from ppdlx.checkpoint.files import atomic_save
from ppdlx.errors import ConfigError  # ppdlx.checkpoint.unit.CheckpointError is one
from ppdlx.models import build_model

IDENTITY = {"name": "resnet18_bottleneck_tiny", "num_classes": 4}


def training_state(seed=0, epoch=1):
    """(model state, optimizer state, .pdstates) as a training writes them, from a real model and optimizer."""
    paddle.seed(seed)
    model = build_model("resnet18_bottleneck_tiny", num_classes=4)
    schedule = paddle.optimizer.lr.StepDecay(0.1, step_size=2)
    optimizer = paddle.optimizer.Momentum(schedule, parameters=model.parameters())
    loss = model(paddle.rand([2, 3, 32, 32])).mean()
    loss.backward()
    optimizer.step()
    for _ in range(epoch):
        schedule.step()
    states = {"epoch": epoch, "global_step": epoch, "best_metric": 0.5, "lr_schedule": schedule.state_dict(),
              "rng": ckpt.capture_rng()}
    return model.state_dict(), optimizer.state_dict(), states


def save_run(out, epochs=3, improved=(1,)):
    for epoch in range(1, epochs + 1):
        ckpt.save_epoch(str(out), epoch, *training_state(epoch, epoch), identity=IDENTITY, improved=epoch in improved)


def checkpoint_file(directory, name, role):
    """The ``role`` (model, optimizer, states) file of checkpoint ``name``, in whichever layout is on disk."""
    unit_file = {"model": "model.pdparams", "optimizer": "optimizer.pdopt", "states": "states.pdstates"}[role]
    suffix = {"model": ".pdparams", "optimizer": ".pdopt", "states": ".pdstates"}[role]
    path = os.path.join(directory, name)
    return os.path.join(path, unit_file) if os.path.isdir(path) else path + suffix


def damage(path, how):
    data = open(path, "rb").read()
    if how == "cut":
        data = data[: len(data) // 2]
    elif how == "garbled":
        middle = len(data) // 2
        data = data[:middle] + bytes(b ^ 0xFF for b in data[middle:middle + 64]) + data[middle + 64:]
    with open(path, "wb") as f:
        f.write(data)


def test_a_save_is_one_directory_and_reading_names_each_damaged_file(tmp_path):
    save_run(tmp_path, epochs=2)
    assert sorted(os.listdir(tmp_path)) == ["best", "epoch_1", "epoch_2", "latest"]
    assert (os.readlink(tmp_path / "latest"), os.readlink(tmp_path / "best")) == ("epoch_2", "epoch_1")
    manifest = ckpt.unit.verify_unit(str(tmp_path / "latest"))
    assert manifest["epoch"] == 2 and manifest["model"]["name"] == "resnet18_bottleneck_tiny"
    assert sorted(manifest["files"]) == ["model.pdparams", "optimizer.pdopt", "states.pdstates"]
    model, optimizer, states = ckpt.load_checkpoint(str(tmp_path / "latest"))
    assert states["epoch"] == 2 and optimizer["LR_Scheduler"]["last_epoch"] == 2

    unit = tmp_path / "epoch_2"
    size = os.path.getsize(unit / "model.pdparams")
    damage(unit / "model.pdparams", "cut")
    with pytest.raises(ConfigError) as err:
        ckpt.load_checkpoint(str(tmp_path / "latest"))
    assert str(err.value) == (f"{tmp_path}/latest/model.pdparams is truncated or damaged ({size // 2} bytes; "
                              f"manifest.json says {size})")
    damage(unit / "optimizer.pdopt", "garbled")  # same size, other bytes: the sha256 tells
    with pytest.raises(ConfigError, match=r"^.*/epoch_2/optimizer.pdopt is damaged \(its sha256 differs from the "
                                              r"one in manifest.json\)$"):
        ckpt.read_checkpoint(str(unit), ("optimizer",))
    os.remove(unit / "states.pdstates")
    with pytest.raises(ConfigError, match=r"/epoch_2/states.pdstates is missing \(listed in manifest.json\)$"):
        ckpt.load_states(str(unit))
    damage(tmp_path / "epoch_1" / "manifest.json", "cut")
    with pytest.raises(ConfigError, match=r"^.*/best/manifest.json is damaged \("):
        ckpt.verify(str(tmp_path / "best"))
    with pytest.raises(ConfigError, match=r"^model.weights=.*/best: .*/best/manifest.json is damaged \("):
        ckpt.load_weights(build_model("resnet18_bottleneck_tiny", num_classes=4), str(tmp_path / "best"))
    os.remove(tmp_path / "epoch_1" / "manifest.json")  # what a directory without its manifest is: incomplete
    with pytest.raises(ConfigError, match=r"/epoch_1/manifest.json is missing: .*/epoch_1 is not a complete "
                                              r"checkpoint \(its save was interrupted\)$"):
        ckpt.verify(str(tmp_path / "epoch_1"))


def test_every_name_of_a_checkpoint_loads_the_same_weights(tmp_path):
    save_run(tmp_path, epochs=2)
    expected = ckpt.read_checkpoint(str(tmp_path / "epoch_1"), ("model",))["model"]
    for name in ("best", "best.pdparams", "best/model.pdparams", "epoch_1", "epoch_1.pdstates", "epoch_1/"):
        model = build_model("resnet18_bottleneck_tiny", num_classes=4)
        assert ckpt.load_weights(model, str(tmp_path / name)) == [], name
        got = model.state_dict()
        assert all(np.array_equal(got[k].numpy(), expected[k].numpy()) for k in expected), name
    assert ckpt.resolve_resume(str(tmp_path / "best.pdparams"), str(tmp_path)) == str(tmp_path / "best")
    with pytest.raises(ConfigError, match=rf"^model.weights={tmp_path}: {tmp_path} is a directory, not a "
                                              rf"checkpoint \(use {tmp_path}/best\)$"):
        ckpt.read_pdparams(str(tmp_path))


def test_the_earlier_three_file_layout_still_loads_and_a_mixed_one_is_refused(tmp_path, ppdlx_caplog):
    """Checkpoints written by 001894d: ``<prefix>.pdparams``/``.pdopt``/``.pdstates``, one atomic file each."""
    def write_old(prefix, state):
        model_state, optimizer_state, states = state
        atomic_save(model_state, prefix + ".pdparams")
        atomic_save(optimizer_state, prefix + ".pdopt")
        atomic_save(states, prefix + ".pdstates", plain_pickle=True)

    out = tmp_path / "old"
    write_old(str(out / "epoch_1"), training_state(1, 1))
    write_old(str(out / "latest"), training_state(2, 2))
    model = build_model("resnet18_bottleneck_tiny", num_classes=4)
    assert ckpt.load_weights(model, str(out / "latest")) == []
    assert ckpt.load_weights(model, str(out / "latest.pdparams")) == []
    assert ckpt.resolve_resume("auto", str(out)) == str(out / "latest")
    assert ckpt.load_checkpoint(str(out / "latest"))[2]["epoch"] == 2
    # killed between renames: .pdopt of the next save over .pdstates of this one
    atomic_save(training_state(3, 3)[1], str(out / "latest.pdopt"))
    with pytest.raises(ConfigError) as err:
        ckpt.load_checkpoint(str(out / "latest"))
    assert str(err.value) == (f"{out}/latest.pdopt (LR step 3) and {out}/latest.pdstates (LR step 2) come from "
                              f"different saves: a save was interrupted between them")
    with ppdlx_caplog.at_level("WARNING", logger="ppdlx"):
        assert ckpt.resolve_resume("auto", str(out)) == str(out / "epoch_1")
    assert ppdlx_caplog.messages[-1].startswith(f"train.resume=auto: {out}/latest.pdopt (LR step 3) and ")
    # .pdparams of a later save (no step inside): written long after its .pdstates
    write_old(str(out / "latest"), training_state(2, 2))
    late = time.time() - 3600
    os.utime(out / "latest.pdstates", (late, late))
    os.utime(out / "latest.pdopt", (late, late))
    with pytest.raises(ConfigError, match=rf"^{out}/latest.pdparams was written 3\d\d\d s after {out}/latest."
                                              rf"pdstates: it comes from a later save that was interrupted"):
        ckpt.verify(str(out / "latest"))
    os.remove(out / "epoch_1.pdopt")
    with pytest.raises(ConfigError, match=rf"^train.resume={out}/epoch_1: {out}/epoch_1.pdopt is missing; "):
        ckpt.resolve_resume(str(out / "epoch_1"), str(out))
    damage(str(out / "latest.pdparams"), "cut")
    with pytest.raises(ConfigError, match=rf"^model.weights={out}/latest: {out}/latest.pdparams is truncated or "
                                              rf"damaged \(it "):
        ckpt.load_weights(model, str(out / "latest"))


def test_resume_auto_falls_back_to_the_newest_complete_checkpoint(tmp_path, ppdlx_caplog):
    save_run(tmp_path, epochs=3)
    assert ckpt.resolve_resume("auto", str(tmp_path)) == str(tmp_path / "latest")
    size = os.path.getsize(tmp_path / "epoch_3" / "states.pdstates")
    damage(tmp_path / "epoch_3" / "states.pdstates", "cut")  # latest -> epoch_3
    with ppdlx_caplog.at_level("WARNING", logger="ppdlx"):
        assert ckpt.resolve_resume("auto", str(tmp_path)) == str(tmp_path / "epoch_2")
    assert ppdlx_caplog.messages[-1] == (
        f"train.resume=auto: {tmp_path}/latest/states.pdstates is truncated or damaged ({size // 2} bytes; "
        f"manifest.json says {size}); resuming from {tmp_path}/epoch_2 (epoch 2), the newest complete checkpoint")
    os.remove(tmp_path / "latest")
    damage(tmp_path / "epoch_2" / "model.pdparams", "garbled")
    with ppdlx_caplog.at_level("WARNING", logger="ppdlx"):
        assert ckpt.resolve_resume("auto", str(tmp_path)) == str(tmp_path / "epoch_1")
    assert ppdlx_caplog.messages[-1] == (f"train.resume=auto: {tmp_path}/latest is missing; resuming from "
                                         f"{tmp_path}/epoch_1 (epoch 1), the newest complete checkpoint")
    damage(tmp_path / "epoch_1" / "optimizer.pdopt", "cut")
    with pytest.raises(ConfigError) as err:
        ckpt.resolve_resume("auto", str(tmp_path))
    assert str(err.value).startswith(f"train.resume=auto: {tmp_path} holds checkpoints but none is complete "
                                     f"({tmp_path}/latest is missing; ")
    assert str(err.value).endswith("; resume from a checkpoint elsewhere (train.resume=<path>) or start over with "
                                   "train.resume=never")


def test_a_failed_save_leaves_the_previous_checkpoint_intact_and_no_temporary_files(tmp_path):
    """The kernel refuses the writes (RLIMIT_FSIZE -> EFBIG, as a full disk refuses them with ENOSPC)."""
    save_run(tmp_path, epochs=1)
    before = sorted(os.listdir(tmp_path))
    state = training_state(2, 2)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, limits[1]))
    try:
        with pytest.raises(ConfigError) as err:
            ckpt.save_epoch(str(tmp_path), 2, *state, identity=IDENTITY, improved=True)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
    assert str(err.value) == (f"saving checkpoint {tmp_path}/epoch_2 failed (File too large: "
                              f"{tmp_path}/epoch_2.tmp-{os.getpid()}/model.pdparams); latest -> epoch_1 is complete. "
                              f"Free space or fix the directory, then continue with train.resume=auto")
    assert sorted(os.listdir(tmp_path)) == before
    ckpt.verify(str(tmp_path / "latest"))
    assert ckpt.resolve_resume("auto", str(tmp_path)) == str(tmp_path / "latest")


def test_pointers_move_and_unkept_epochs_go_when_nothing_names_them(tmp_path):
    for epoch in (1, 2, 3, 4):
        ckpt.save_epoch(str(tmp_path), epoch, *training_state(epoch, epoch), improved=epoch == 2,
                        keep=lambda e: e % 2 == 0)
    # epoch_1 went when latest moved on (best never named it); epoch_3 when latest moved to epoch_4
    assert sorted(os.listdir(tmp_path)) == ["best", "epoch_2", "epoch_4", "latest"]
    assert (os.readlink(tmp_path / "latest"), os.readlink(tmp_path / "best")) == ("epoch_4", "epoch_2")
