"""check_data on ImageFolder trees of real digits JPEGs with planted faults: a duplicate across train/val,
a corrupt file, an empty class, a class only in val, a split without images."""
import glob
import logging
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from ppdlx.analysis import check_before_training, check_data
from ppdlx.config import load_config
from ppdlx.errors import DataError
from tests.conftest import make_digits_tree

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml")
CHECK = os.path.join(ROOT, "tools", "check_data.py")
# what a class folder without images asks for: labels are positions in the sorted folder names
EMPTY_FIX = "add images to that folder or remove it from every split (class indices follow the sorted folder names)"


def overrides(root, *extra):
    return [f"data.root={root}", "data.backend=paddle", "model.num_classes=4", "data.workers=0", *extra]


def cfg_for(root, *extra):
    from ppdlx.tasks.preprocess import resolve_preprocessing  # the nulls: the model's default_cfg
    return resolve_preprocessing(load_config(CONFIG, overrides(root, *extra)))


@pytest.fixture
def faulty_tree(tmp_path):
    """4 classes x 20 digits (64 train / 16 val) plus: a corrupt train file, a val file that is a byte copy of a
    train file, and an empty train class folder '4' (with an empty val folder '4' so the classes still match)."""
    root = make_digits_tree(tmp_path / "digits", per_class=20, classes=4)
    corrupt = os.path.join(root, "train", "2", "corrupt.jpg")
    with open(corrupt, "wb") as f:
        f.write(b"not a jpeg at all\n" * 8)
    source = sorted(glob.glob(os.path.join(root, "train", "1", "*.jpg")))[0]
    copy = os.path.join(root, "val", "1", "copy_of_train.jpg")
    shutil.copyfile(source, copy)
    os.makedirs(os.path.join(root, "train", "4"))
    os.makedirs(os.path.join(root, "val", "4"))
    return {"root": root, "corrupt": corrupt, "source": source, "copy": copy}


def expected_counts(root, split):
    return [len(glob.glob(os.path.join(root, split, c, "*.jpg"))) for c in ("0", "1", "2", "3", "4")]


def test_counts_corrupt_duplicate_and_empty_class(faulty_tree):
    root = faulty_tree["root"]
    report = check_data(cfg_for(root, "model.num_classes=5"))
    train, val = report.splits["train"], report.splits["val"]
    assert train.classes == val.classes == ["0", "1", "2", "3", "4"]
    assert train.class_counts == expected_counts(root, "train")
    assert train.class_counts[4] == 0 and train.images == 64 + 1
    assert val.class_counts == expected_counts(root, "val") and val.images == 16 + 1
    assert train.imbalance == float("inf")
    assert train.unreadable == [(faulty_tree["corrupt"], "cannot be decoded (PIL: cannot identify image file)")]
    assert val.unreadable == []
    assert report.duplicates == [(faulty_tree["copy"], faulty_tree["source"])]
    assert set(train.sizes.values()) == {(32, 32)} and len(train.sizes) == 64
    # the empty class stops training in either split (a val class without images would leave it out of the
    # accuracy); the rest are warnings
    assert report.problems == [f"{os.path.join(root, 'train')}: 1 class without images ('4'); {EMPTY_FIX}",
                               f"{os.path.join(root, 'val')}: 1 class without images ('4'); {EMPTY_FIX}"]
    assert any(w.startswith(f"{os.path.join(root, 'train')}: 1 file cannot be decoded; the loader skips them")
               for w in report.warnings)
    assert any(w.startswith("1 val image byte-identical to a training image") for w in report.warnings)
    assert not any("class without images" in w for w in report.warnings)


def test_unreadable_files_are_the_ones_the_paddle_loader_skips(faulty_tree):
    from ppdlx.data.loader import build_classification_loader
    cfg = cfg_for(faulty_tree["root"], "model.num_classes=5", "data.batch_size=8")
    loader = build_classification_loader(cfg, "train")
    for _ in loader:
        pass
    report = check_data(cfg, hash_files=False)
    assert [p for p, _ in report.splits["train"].unreadable] == loader.skipped_files == [faulty_tree["corrupt"]]


def test_unreadable_files_are_the_ones_the_dali_loader_skips(faulty_tree):
    pytest.importorskip("nvidia.dali")
    from ppdlx.data.loader import build_classification_loader
    cfg = cfg_for(faulty_tree["root"], "model.num_classes=5", "data.batch_size=8", "data.backend=dali",
                  "data.dali.device=cpu", "data.dali.num_threads=1")
    # the val loader refuses a class folder without images: give val '4' one
    shutil.copyfile(faulty_tree["copy"], os.path.join(faulty_tree["root"], "val", "4", "one.jpg"))
    loader = build_classification_loader(cfg, "val")  # val: every file once
    for _ in loader:
        pass
    truncated = os.path.join(faulty_tree["root"], "val", "3", "truncated.jpg")
    assert loader.skipped_files == []
    report = check_data(cfg, hash_files=False)
    assert report.splits["train"].decoder.startswith("DALI")
    assert [p for p, _ in report.splits["train"].unreadable] == [faulty_tree["corrupt"]]
    # a half JPEG: DALI's decoder rejects it, and the DALI loader skips it the same way
    data = open(faulty_tree["source"], "rb").read()
    with open(truncated, "wb") as f:
        f.write(data[: len(data) // 2])
    loader = build_classification_loader(cfg, "val")
    for _ in loader:
        pass
    report = check_data(cfg, hash_files=False)
    assert [p for p, _ in report.splits["val"].unreadable] == loader.skipped_files == [truncated]
    # corrupt_files=error: the loader would stop, so the data cannot train
    stop = check_data(cfg_for(faulty_tree["root"], "model.num_classes=5", "data.backend=dali",
                              "data.dali.corrupt_files=error"), hash_files=False)
    train_dir, val_dir = (os.path.join(faulty_tree["root"], split) for split in ("train", "val"))
    stops = "1 file cannot be decoded and the data.backend=dali loader stops on them"
    assert [p.split(" (first:")[0] for p in stop.problems] == [
        f"{train_dir}: 1 class without images ('4'); {EMPTY_FIX}", f"{train_dir}: {stops}", f"{val_dir}: {stops}"]


def test_class_mismatch_missing_split_and_num_classes(tmp_path):
    root = make_digits_tree(tmp_path / "digits", per_class=10, classes=3)
    os.makedirs(os.path.join(root, "val", "7"))
    Image.fromarray(np.full((32, 32, 3), 200, np.uint8)).save(os.path.join(root, "val", "7", "a.jpg"))
    report = check_data(cfg_for(root, "model.num_classes=3"))
    assert report.problems == [f"class names differ between {os.path.join(root, 'train')} and "
                               f"{os.path.join(root, 'val')}: only in train [], only in val ['7']"]
    report = check_data(cfg_for(root, "model.num_classes=10"))
    assert f"model.num_classes=10 but {os.path.join(root, 'train')} has 3 classes; set model.num_classes=3" \
        in report.problems
    shutil.rmtree(os.path.join(root, "train"))
    os.makedirs(os.path.join(root, "train", "0"))
    report = check_data(cfg_for(root, "model.num_classes=3"))
    assert report.problems[0].startswith(f"{os.path.join(root, 'train')}: no images with extensions")
    assert report.splits["train"].images == 0
    assert report.table().splitlines()[1].split() == ["train", "0", "-", "-", "-", "-", "-", "-"]
    assert report.table().splitlines()[-1].startswith("CANNOT TRAIN: ")


def run_tool(*args):
    return subprocess.run([sys.executable, CHECK, "-c", CONFIG, *args], capture_output=True, text=True,
                          timeout=600, cwd=ROOT)


def test_tool_exit_codes_files_and_table(faulty_tree, tmp_path):
    out = tmp_path / "report"
    proc = run_tool("--out", str(out), "--samples", "3", "-o", *overrides(faulty_tree["root"], "model.num_classes=5"))
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert lines[-1] == (f"error: {os.path.join(faulty_tree['root'], 'train')}: 1 class without images ('4'); "
                         f"{EMPTY_FIX}; {os.path.join(faulty_tree['root'], 'val')}: 1 class without images ('4'); "
                         f"{EMPTY_FIX}")
    table = proc.stdout.splitlines()
    counts = expected_counts(faulty_tree["root"], "train")
    assert counts == [16, 16, 17, 16, 0]
    train_row = next(r for r in table if r.startswith("train "))
    assert train_row.split()[:6] == ["train", "65", "5", "0/16/17", "inf", "1"]
    assert "duplicates across train/val (same bytes): 1" in proc.stdout
    md = (out / "data_report.md").read_text()
    assert "**CANNOT TRAIN: " in md and "| train | 65 | 5 | 0/16/17 | inf | 1 | 0 |" in md
    assert f"- {faulty_tree['copy']} - {faulty_tree['source']}" in md
    pytest.importorskip("matplotlib")
    with Image.open(out / "data_samples.png") as img:
        # 5 class rows x 3 columns of 96 px, a 120 px name column and a 50 px title
        assert img.size == (120 + 3 * 96, 50 + 5 * 96)
        assert np.asarray(img.convert("L"), np.float32).var() > 100.0

    # the same tree without the empty class folders trains: exit 0
    os.rmdir(os.path.join(faulty_tree["root"], "train", "4"))
    os.rmdir(os.path.join(faulty_tree["root"], "val", "4"))
    proc = run_tool("--out", str(out), "--quick", "-o", *overrides(faulty_tree["root"]))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ok: the data can train" in proc.stdout.splitlines()
    assert "duplicates across train/val: not checked" in proc.stdout


def test_check_before_training_logs_and_stops(faulty_tree, ppdlx_caplog):
    root = faulty_tree["root"]
    message = (f"{os.path.join(root, 'train')}: 1 class without images ('4'); {EMPTY_FIX}; "
               f"{os.path.join(root, 'val')}: 1 class without images ('4'); {EMPTY_FIX}")
    with pytest.raises(DataError, match=r"^" + re.escape(message) + "$"):
        check_before_training(cfg_for(root, "model.num_classes=5"))
    os.rmdir(os.path.join(root, "train", "4"))
    os.rmdir(os.path.join(root, "val", "4"))
    ppdlx_caplog.clear()
    ppdlx_caplog.set_level(logging.INFO, logger="ppdlx")  # as setup_logging() sets it for a run
    report = check_before_training(cfg_for(root))
    assert report.ok and report.splits["train"].decoder == "" and report.duplicates == []  # nothing decoded or hashed
    assert [r.getMessage() for r in ppdlx_caplog.records] == [
        f"data: train 65 images, 4 classes (16..17 each, imbalance 1.06) in {os.path.join(root, 'train')}",
        f"data: val 17 images, 4 classes (4..5 each, imbalance 1.25) in {os.path.join(root, 'val')}"]


def test_class_folders_of_non_image_files_are_named_in_either_split(tmp_path):
    # Before: a val class folder holding only files of another extension was a warning, and no message said why
    # the folder counted as empty.
    root = make_digits_tree(tmp_path / "digits", per_class=10, classes=3)
    for split, name in (("train", "scan.tif"), ("val", "notes.txt")):
        folder = os.path.join(root, split, "2")
        for old in os.listdir(folder):
            os.remove(os.path.join(folder, old))
        with open(os.path.join(folder, name), "wb") as f:
            f.write(b"a file the loader does not read")
    report = check_data(cfg_for(root, "model.num_classes=3"), decode=False, hash_files=False)
    note = "(1 file, none with an image extension (.jpg, .jpeg, .png, .bmp, .webp, .ppm): e.g. '{}')"
    assert report.problems == [
        f"{os.path.join(root, 'train')}: 1 class without images ('2' {note.format('scan.tif')}); {EMPTY_FIX}",
        f"{os.path.join(root, 'val')}: 1 class without images ('2' {note.format('notes.txt')}); {EMPTY_FIX}"]
