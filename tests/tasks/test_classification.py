"""The class list a classification checkpoint carries (ppdlx/tasks/classification.py, class_list.py): saved
by training in every checkpoint, checked by evaluation, resume and export against the class folders."""
import os
import shutil
import subprocess
import sys

import pytest

from ppdlx.config import load_config
from ppdlx.errors import DataError
from tests.conftest import make_digits_tree

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml")
CLASSES = ["0", "1", "2", "3"]


def overrides(root, out, *extra):
    return [f"data.root={root}", f"global.output_dir={out}", "global.device=cpu", "model.name=resnet18_bottleneck_tiny",
            "model.num_classes=4", "data.batch_size=8", "data.workers=0", "data.backend=paddle",
            "data.transforms.crop_size=32", "data.transforms.resize_short=32", "train.epochs=1", *extra]


def tool(name, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "tools", name), "-c", CONFIG, "-o", *args],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)


def error_line(proc):
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return lines[-1]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One epoch of a tiny ResNet on 4 digit classes: (data root, output dir)."""
    base = tmp_path_factory.mktemp("classes")
    root = make_digits_tree(base / "digits", per_class=20, classes=4)
    out = str(base / "out")
    proc = tool("train.py", *overrides(root, out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, out


def copy_tree(root, tmp_path):
    dst = str(tmp_path / "digits")
    shutil.copytree(root, dst)
    return dst


def test_every_checkpoint_saves_the_class_list(trained):
    from ppdlx.tasks.class_list import saved_class_names
    _, out = trained
    for name in ("latest", "best", "epoch_1"):
        assert saved_class_names(os.path.join(out, name)) == CLASSES, name


def test_eval_refuses_a_val_split_missing_a_class(trained, tmp_path):
    root, out = trained
    weights = os.path.join(out, "best")
    ok = tool("eval.py", *overrides(root, out, f"model.weights={weights}"))
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert ok.stdout.strip().splitlines()[-1].startswith("eval: top1 ")
    data = copy_tree(root, tmp_path)
    shutil.rmtree(os.path.join(data, "val", "2"))
    # Before: exit 0 and an accuracy over labels shifted by one from class '2' on.
    proc = tool("eval.py", *overrides(data, out, f"model.weights={weights}"))
    assert proc.returncode == 2
    assert error_line(proc) == (f"error: {os.path.join(data, 'val')}: class folders differ from the class list saved "
                                f"with model.weights={weights} (missing '2'); every split needs the same class "
                                f"folders, as labels are the indices of the sorted folder names")
    shutil.copytree(os.path.join(data, "val", "1"), os.path.join(data, "val", "2"))
    shutil.copytree(os.path.join(data, "val", "1"), os.path.join(data, "val", "7"))
    proc = tool("eval.py", *overrides(data, out, f"model.weights={weights}"))
    assert proc.returncode == 2 and error_line(proc).endswith(f"model.weights={weights} (extra '7'); every split "
                                                              f"needs the same class folders, as labels are the "
                                                              f"indices of the sorted folder names")


def test_resume_refuses_other_training_folders(trained, tmp_path):
    root, out = trained
    data = copy_tree(root, tmp_path)
    run = str(tmp_path / "run")
    shutil.copytree(out, run)
    for split in ("train", "val"):  # the same number of classes, one renamed: the data check cannot see it
        os.rename(os.path.join(data, split, "3"), os.path.join(data, split, "x"))
    proc = tool("train.py", *overrides(data, run, "train.epochs=2", "train.resume=auto"))
    assert proc.returncode == 2
    assert error_line(proc) == (f"error: {os.path.join(data, 'train')}: class folders differ from the class list of "
                                f"the checkpoint being resumed (missing '3'; extra 'x'); every split needs the same "
                                f"class folders, as labels are the indices of the sorted folder names")


def test_checkpoints_without_a_list_are_checked_against_the_training_folders(tmp_path):
    from ppdlx.tasks.class_list import check_eval_classes
    root = make_digits_tree(tmp_path / "digits", per_class=4, classes=4)
    cfg = load_config(CONFIG, [f"data.root={root}", "model.num_classes=4"])
    val = os.path.join(root, "val")
    check_eval_classes(cfg, None, CLASSES, val)
    with pytest.raises(DataError) as err:
        check_eval_classes(cfg, None, ["0", "1", "3"], val)
    assert str(err.value) == (f"{val}: class folders differ from the training split's (missing '2'); every split "
                              f"needs the same class folders, as labels are the indices of the sorted folder names")
    shutil.rmtree(os.path.join(root, "train"))
    with pytest.raises(DataError) as err:
        check_eval_classes(cfg, None, ["0", "1", "3"], val)
    assert str(err.value) == (f"{val}: 3 class folders but model.num_classes=4; labels are the indices of the sorted "
                              f"folder names, so they would not match the model's")


def test_export_gets_the_checked_class_list(trained, tmp_path):
    from ppdlx.tasks import task_of
    root, out = trained
    weights = os.path.join(out, "latest")
    task = task_of(load_config(CONFIG, overrides(root, out)))
    assert task.saved_class_names(load_config(CONFIG, overrides(root, out)), weights) == CLASSES
    # without the data (an export on another machine) the saved list is the labels, unchecked
    assert task.saved_class_names(load_config(CONFIG, overrides(str(tmp_path / "none"), out)), weights) == CLASSES
    data = copy_tree(root, tmp_path)
    shutil.rmtree(os.path.join(data, "val", "0"))
    with pytest.raises(DataError, match=r"/val: class folders differ from the class list saved with model.weights=.*"
                                        r"\(missing '0'\)"):
        task.saved_class_names(load_config(CONFIG, overrides(data, out)), weights)
