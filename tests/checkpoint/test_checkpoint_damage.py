"""A truncated or corrupted checkpoint file is one line naming it, exit 2, in every tool that reads checkpoints:
train (resume), eval and export (``model.weights``), prune_asp --check; in both layouts."""
import os
import subprocess
import sys

from ppdlx import checkpoint as ckpt
from ppdlx.checkpoint.files import atomic_save
from tests.checkpoint.test_checkpoint_unit import checkpoint_file, damage, training_state
from tests.engine.test_training import tiny_overrides

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml")


def tool(name, *args):
    return subprocess.Popen([sys.executable, os.path.join(ROOT, "tools", name), *map(str, args)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_damaged_checkpoint_files_are_one_line_naming_the_file_in_every_tool(tiny_tree, tmp_path):
    out, old = tmp_path / "run", tmp_path / "old"
    for epoch in (1, 2, 3, 4):
        ckpt.save_checkpoint(str(out / f"epoch_{epoch}"), *training_state(epoch, epoch))
    files = {"epoch_1": "states", "epoch_2": "optimizer", "epoch_3": "model", "epoch_4": "model"}
    sizes = {name: os.path.getsize(checkpoint_file(out, name, role)) for name, role in files.items()}
    for name, role in files.items():
        damage(checkpoint_file(out, name, role), "garbled" if name == "epoch_4" else "cut")
    atomic_save(training_state()[0], str(old / "latest.pdparams"))  # the earlier layout
    damage(old / "latest.pdparams", "cut")
    common = ("-c", CONFIG, "-o", *tiny_overrides(tiny_tree, tmp_path / "tool"))
    runs = {  # started together, checked one by one
        "resume": tool("train.py", *common, f"train.resume={out}/epoch_2"),
        "eval": tool("eval.py", *common, f"model.weights={out}/epoch_3"),
        "export": tool("export_model.py", *common, f"model.weights={out}/epoch_4", "--output-dir", tmp_path / "exp"),
        "check": tool("prune_asp.py", "--check", out / "epoch_1"),
        "old": tool("eval.py", *common, f"model.weights={old}/latest"),
    }
    expected = {
        "resume": f"error: train.resume={out}/epoch_2: {out}/epoch_2/optimizer.pdopt is truncated or damaged "
                  f"({sizes['epoch_2'] // 2} bytes; manifest.json says {sizes['epoch_2']}); resume from another "
                  f"checkpoint, e.g. train.resume=auto (the newest complete one in {tmp_path / 'tool'})",
        "eval": f"error: model.weights={out}/epoch_3: {out}/epoch_3/model.pdparams is truncated or damaged "
                f"({sizes['epoch_3'] // 2} bytes; manifest.json says {sizes['epoch_3']})",
        "export": f"error: model.weights={out}/epoch_4: {out}/epoch_4/model.pdparams is damaged (its sha256 differs "
                  f"from the one in manifest.json)",
        "check": f"error: --check {out}/epoch_1: {out}/epoch_1/states.pdstates is truncated or damaged "
                 f"({sizes['epoch_1'] // 2} bytes; manifest.json says {sizes['epoch_1']})",
        "old": f"error: model.weights={old}/latest: {old}/latest.pdparams is truncated or damaged (it ",
    }
    for name, proc in runs.items():
        _, stderr = proc.communicate(timeout=600)
        last = stderr.strip().splitlines()[-1]
        assert proc.returncode == 2, (name, stderr[-3000:])
        assert "Traceback" not in stderr, (name, stderr[-3000:])
        assert last == expected[name] or (name == "old" and last.startswith(expected[name])), (name, last)
