"""A training killed (SIGKILL) between and inside the file writes of its checkpoint saves: ``train.resume=auto``
continues from a complete checkpoint each time, says which, and ends bit-identical to a training that was
never interrupted.

The kills come from ``tests/checkpoint/fault_injection/sitecustomize.py`` (on PYTHONPATH for the trainings started
here, nothing in ppdlx): the process sends itself SIGKILL at one file-system call of a save. One training is
killed in a save, resumed, killed in a later save, resumed ..., so each resume also runs as the process the next
kill interrupts. The points, in a 4-epoch run:

1. ``epoch_1`` renamed into place, ``latest`` not yet created (between the directory rename and the pointer);
2. inside the write of ``epoch_2``'s ``optimizer.pdopt`` (half of it on disk) -- ``latest`` is still missing, so
   both resumes fall back to ``epoch_1``;
3. ``epoch_3`` renamed into place, ``latest`` not yet moved from ``epoch_2``: the resume continues from ``latest``
   and its next save replaces the complete ``epoch_3`` that no pointer names;
4. between files: ``epoch_4``'s ``model.pdparams`` and ``optimizer.pdopt`` written, ``states.pdstates`` not.
"""
import glob
import os
import subprocess
import sys

import numpy as np

from ppdlx import checkpoint as ckpt
from tests.engine.test_training import tiny_overrides

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "tools", "train.py")
CONFIG = os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml")
FAULTS = os.path.join(ROOT, "tests", "checkpoint", "fault_injection")
KILLS = [
    "symlink latest.tmp-<pid> -> epoch_1",
    "write epoch_2.tmp-<pid>/optimizer.pdopt",
    "symlink latest.tmp-<pid> -> epoch_3",
    "open epoch_4.tmp-<pid>/states.pdstates",
]


def overrides(tree, out, *extra):
    return tiny_overrides(tree, out, "train.epochs=4", "train.steps_per_epoch=2", "ema.enabled=true",
                          "ema.decay=0.9", "train.mixup_alpha=0.2", *extra)


def start(tree, out, *extra, kill=None):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([FAULTS, os.environ.get("PYTHONPATH", "")]),
               PPDLX_FAULT_DIR=str(out))
    if kill:
        env["PPDLX_FAULT_KILL"] = kill
    return subprocess.Popen([sys.executable, TRAIN, "-c", CONFIG, "-o", *overrides(tree, out, *extra)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)


def finish(proc):
    output, _ = proc.communicate(timeout=600)
    return proc.returncode, output


def params(prefix):
    return {k: np.asarray(v) for k, v in ckpt.read_pdparams(prefix).items()}


def test_kills_inside_saves_resume_from_a_complete_checkpoint_bit_identically(tiny_tree, tmp_path):
    straight_dir, out = tmp_path / "straight", tmp_path / "killed"
    straight = start(tiny_tree, straight_dir)  # runs while the killed chain does

    code, log = finish(start(tiny_tree, out, kill=KILLS[0]))
    assert code == -9, log[-2000:]
    assert os.path.isfile(out / "epoch_1" / "manifest.json") and not os.path.lexists(out / "latest")

    fallback = (f"train.resume=auto: {out}/latest is missing; resuming from {out}/epoch_1 (epoch 1), the newest "
                f"complete checkpoint")
    expected = [  # what each resume must say: the complete checkpoint it continues from
        fallback,
        fallback,
        f"resumed from {out}/latest -> epoch_2 at epoch 2 (step 4)",
        f"resumed from {out}/latest -> epoch_3 at epoch 3 (step 6)",
    ]
    on_disk = [  # after each kill: what the interrupted save left
        lambda: os.path.getsize(glob.glob(str(out / "epoch_2.tmp-*" / "optimizer.pdopt"))[0]) > 0
        and not os.path.exists(out / "epoch_2") and not os.path.lexists(out / "latest"),
        lambda: ckpt.unit.read_manifest(str(out / "epoch_3"))["epoch"] == 3
        and os.readlink(out / "latest") == "epoch_2",
        lambda: glob.glob(str(out / "epoch_4.tmp-*" / "optimizer.pdopt")) and not os.path.exists(out / "epoch_4")
        and os.readlink(out / "latest") == "epoch_3",
    ]
    for k, kill in enumerate(KILLS[1:] + [None]):
        code, log = finish(start(tiny_tree, out, "train.resume=auto", kill=kill))
        assert expected[k] in log, (expected[k], log[-3000:])
        assert k != 1 or f"removed what interrupted saves left in {out}: epoch_2.tmp-" in log, log[-3000:]
        if kill is None:
            assert code == 0, log[-3000:]
            break
        assert code == -9, log[-3000:]
        assert on_disk[k](), (kill, sorted(os.listdir(out)))
    # the directories the kills inside a save left were removed by the next run, and nothing else was left
    assert log.count(f"removed what interrupted saves left in {out}: epoch_4.tmp-") == 1

    code, straight_log = finish(straight)
    assert code == 0, straight_log[-3000:]
    a, b = params(str(straight_dir / "latest")), params(str(out / "latest"))
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    sa, sb = ckpt.load_states(str(straight_dir / "latest")), ckpt.load_states(str(out / "latest"))
    assert sa["global_step"] == sb["global_step"] == 8
    assert all(np.array_equal(sa["ema"]["shadow"][k], sb["ema"]["shadow"][k]) for k in sa["ema"]["shadow"])
    for name in ("epoch_1", "epoch_2", "epoch_3", "epoch_4", "latest", "best"):
        ckpt.verify(str(out / name))
    assert not glob.glob(str(out / "*.tmp-*")) and not glob.glob(str(out / "*.old-*"))
