import logging
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from ppdlx.config import load_config
from ppdlx.data.loader import build_classification_loader
from ppdlx.data.samplers import EvalBatchSampler, TrainBatchSampler
from ppdlx.errors import DataError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cfg_for(root, *extra):
    from ppdlx.tasks.preprocess import resolve_preprocessing  # the nulls: the model's default_cfg
    return resolve_preprocessing(load_config(None, [
        f"data.root={root}", "data.batch_size=8", "data.workers=0", "model.num_classes=4",
        "data.transforms.crop_size=32", "data.transforms.resize_short=32", "data.transforms.hflip=0.0", *extra]))


def test_train_and_val_batches_shapes_labels_and_normalisation(tiny_tree):
    cfg = cfg_for(tiny_tree)
    train = build_classification_loader(cfg, "train")
    assert train.dataset.classes == ["0", "1", "2", "3"]
    # each sample's label is the index of its class folder in the sorted class list
    assert all(os.path.basename(os.path.dirname(path)) == train.dataset.classes[label]
               for path, label in train.dataset.samples)
    images, labels = next(iter(train))
    assert images.shape == [8, 3, 32, 32] and str(images.dtype) == "paddle.float32"
    assert str(labels.dtype) == "paddle.int64" and set(labels.numpy().tolist()) <= {0, 1, 2, 3}
    val = build_classification_loader(cfg, "val")
    seen = sum(int(y.shape[0]) for _, y in val)
    assert seen == val.num_images == 16
    # ImageNet mean/std normalisation of 0..255 pixels lands within about [-2.2, 2.7]
    assert float(images.min()) >= -2.2 and float(images.max()) <= 2.7


def test_nhwc_layout(tiny_tree):
    cfg = cfg_for(tiny_tree, "model.data_format=NHWC")
    images, _ = next(iter(build_classification_loader(cfg, "val")))
    assert images.shape[1:] == [32, 32, 3]


def test_augmentation_is_a_function_of_seed_epoch_and_index(tiny_tree):
    cfg = cfg_for(tiny_tree, "data.transforms.scale=[0.3, 1.0]")
    a = build_classification_loader(cfg, "train")
    b = build_classification_loader(cfg.replace({"data.workers": 1}), "train")
    for loader in (a, b):
        loader.set_epoch(3)
    xa, ya = next(iter(a))
    xb, yb = next(iter(b))
    assert np.array_equal(ya.numpy(), yb.numpy()) and np.abs(xa.numpy() - xb.numpy()).max() == 0.0
    a.set_epoch(4)
    xc, _ = next(iter(a))
    assert np.abs(xa.numpy() - xc.numpy()).max() > 0.1


def test_corrupt_jpeg_is_skipped_with_one_warning_naming_it(tiny_tree, tmp_path, ppdlx_caplog):
    caplog = ppdlx_caplog
    import shutil
    root = tmp_path / "tree"
    shutil.copytree(tiny_tree, root)
    bad = root / "val" / "0" / "corrupt.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 this is not a jpeg")
    cfg = cfg_for(str(root))
    loader = build_classification_loader(cfg, "val")
    with caplog.at_level(logging.WARNING, logger="ppdlx.data"):
        seen = sum(int(y.shape[0]) for _, y in loader)
        seen_again = sum(int(y.shape[0]) for _, y in loader)
    assert loader.num_images == 17 and seen == 16 and seen_again == 16
    warnings = [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()]
    assert warnings == [f"skipping unreadable image {bad} (Truncated File Read; 1 skipped so far)"]
    assert loader.skipped_files == [str(bad)]


@pytest.mark.parametrize("unreadable_batch", [0, 3])
def test_a_training_pass_keeps_its_length_when_a_whole_batch_is_unreadable(tiny_tree, tmp_path, unreadable_batch):
    """Each training step of several ranks is a collective: a rank that dropped a batch would run one
    step fewer (gloo stopped at the next all-reduce with a size mismatch; NCCL would hang)."""
    import shutil
    from ppdlx.data.samplers import TrainBatchSampler
    root = tmp_path / "tree"
    shutil.copytree(tiny_tree, root)
    cfg = cfg_for(str(root), "data.batch_size=2")
    loader = build_classification_loader(cfg, "train")
    assert isinstance(loader.batch_sampler, TrainBatchSampler)
    loader.set_epoch(0)
    batch = list(loader.batch_sampler)[unreadable_batch]
    for index in batch:
        with open(loader.dataset.samples[index][0], "wb") as f:
            f.write(b"\xff\xd8\xff\xe0 not a jpeg")
    sizes = [int(y.shape[0]) for _, y in loader]
    assert len(sizes) == len(loader) and sizes == [2] * len(loader)
    assert len(loader.skipped_files) == 2
    val = build_classification_loader(cfg_for(str(root)), "val")
    assert sum(int(y.shape[0]) for _, y in val) == val.num_images  # evaluation counts each image once


def test_missing_or_empty_split_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match=r"split directory not found"):
        build_classification_loader(cfg_for(str(tmp_path / "nope")), "train")
    (tmp_path / "empty" / "train").mkdir(parents=True)
    with pytest.raises(DataError, match="no class sub-directories"):
        build_classification_loader(cfg_for(str(tmp_path / "empty")), "train")


def test_cli_missing_data_dir_exits_nonzero_with_one_line(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "train.py"), "-c",
                           os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml"), "-o",
                           f"data.root={tmp_path}/missing", f"global.output_dir={tmp_path}/out"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 2
    err_lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    # the data check before training names every missing split in the one line
    missing = [f"{tmp_path}/missing/{split}: split directory not found (expected <data.root>/<split>/<class>/*.jpg; "
               f"set data.root, or run tools/prepare_demo_data.py for the demo data)" for split in ("train", "val")]
    assert err_lines == ["error: " + "; ".join(missing)]
    assert "Traceback" not in proc.stderr


def test_train_sampler_shards_are_disjoint_and_even():
    shards = [list(TrainBatchSampler(10, 2, rank=r, world_size=2, seed=1)) for r in range(2)]
    flat = [sorted(sum(s, [])) for s in shards]
    assert len(flat[0]) == len(flat[1]) == 4  # 5 per rank, full batches of 2 only
    assert not set(flat[0]) & set(flat[1])


def test_eval_sampler_counts_every_image_once_over_ranks():
    got = sorted(i for r in range(3) for batch in EvalBatchSampler(11, 4, r, 3) for i in batch)
    assert got == list(range(11))


def test_val_class_folders_that_differ_are_named(tiny_tree, tmp_path):
    root = str(tmp_path / "tree")
    shutil.copytree(tiny_tree, root)
    shutil.rmtree(os.path.join(root, "val", "2"))
    shutil.copytree(os.path.join(root, "val", "1"), os.path.join(root, "val", "zz"))
    cfg = cfg_for(root)
    train = build_classification_loader(cfg, "train")
    with pytest.raises(DataError) as err:
        build_classification_loader(cfg, "val", classes=train.dataset.classes)
    # Before: "<root>/val: class folders ['0', '1', '3', 'zz']... differ from the training split's"
    assert str(err.value) == (f"{os.path.join(root, 'val')}: class folders differ from the training split's (missing "
                              f"'2'; extra 'zz'); every split needs the same class folders, as labels are the indices "
                              f"of the sorted folder names")


@pytest.mark.parametrize("backend", ["paddle", "dali"])
def test_val_class_folder_without_images_is_an_error(tiny_tree, tmp_path, backend):
    if backend == "dali":
        pytest.importorskip("nvidia.dali")
    root = str(tmp_path / "tree")
    shutil.copytree(tiny_tree, root)
    folder = os.path.join(root, "val", "3")
    shutil.rmtree(folder)
    os.makedirs(folder)
    for name in ("notes.txt", "a.tif"):
        with open(os.path.join(folder, name), "wb") as f:
            f.write(b"not an image the loader reads")
    cfg = cfg_for(root, f"data.backend={backend}", "data.dali.device=cpu")
    build_classification_loader(cfg, "train")  # training folders are the data check's (tests/analysis)
    with pytest.raises(DataError) as err:
        build_classification_loader(cfg, "val")
    # Before: no error; the val accuracy silently left class '3' out.
    assert str(err.value) == (f"{os.path.join(root, 'val')}: 1 class folder without images ('3' (2 files, none with an "
                              f"image extension (.jpg, .jpeg, .png, .bmp, .webp, .ppm): e.g. 'a.tif')); an evaluation "
                              f"split needs images of every class: add them, or remove the folder from every split")


def _spoil_every_image(split_dir):
    for dirpath, _, files in os.walk(split_dir):
        for k, name in enumerate(sorted(files)):
            with open(os.path.join(dirpath, name), "wb") as f:
                f.write(b"" if k % 2 else b"\xff\xd8 not a jpeg")


def test_split_without_one_readable_image_is_one_error(tiny_tree, tmp_path):
    root = str(tmp_path / "tree")
    shutil.copytree(tiny_tree, root)
    _spoil_every_image(os.path.join(root, "train"))
    loader = build_classification_loader(cfg_for(root), "train")
    with pytest.raises(DataError) as err:
        for _ in loader:
            pass
    # Before: the loader yielded nothing: an epoch of 0 steps.
    message = str(err.value)
    train = os.path.join(root, "train")
    assert message.startswith(f"{train}: none of the 64 images this rank read can be decoded (first: {train}")
    assert message.endswith("); replace the files (tools/check_data.py lists every unreadable one) or fix data.root")


def test_cli_training_on_unreadable_images_exits_2_without_a_checkpoint(tiny_tree, tmp_path):
    root = str(tmp_path / "tree")
    shutil.copytree(tiny_tree, root)
    _spoil_every_image(os.path.join(root, "train"))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "train.py"), "-c",
                           os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml"), "-o", f"data.root={root}",
                           f"global.output_dir={out}", "model.name=resnet18_bottleneck_tiny", "model.num_classes=4",
                           "data.batch_size=8", "data.workers=0", "data.backend=paddle", "data.transforms.crop_size=32",
                           "data.transforms.resize_short=32", "train.epochs=1"],
                          capture_output=True, text=True, timeout=600)
    # Before: exit 0 after an epoch of 0 steps, with the untrained weights saved as "best".
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = [line for line in proc.stderr.splitlines() if line.strip()][-1]
    assert last.startswith(f"error: {os.path.join(root, 'train')}: none of the 64 images this rank read can be decoded")
    assert "Traceback" not in proc.stderr
    assert not any(name.startswith(("best", "latest", "epoch_")) for name in os.listdir(out))
