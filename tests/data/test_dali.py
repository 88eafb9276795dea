"""DALI CPU pipelines (``ppdlx/data/dali.py``) on a small JPEG tree written here.

Every image is a solid colour: red encodes the class (sorted folder index), green a
unique image id, so labels, shards and val counts are checked from the pixels the
pipelines actually produce.
"""
import os

import numpy as np
import pytest

dali = pytest.importorskip("nvidia.dali")

import paddle  # noqa: E402
from PIL import Image  # noqa: E402

from ppdlx.config import load_config  # noqa: E402
from ppdlx.data import dali as dali_backend  # noqa: E402
from ppdlx.data.dali_fed_loader import find_undecodable  # noqa: E402
from ppdlx.data.loader import build_classification_loader  # noqa: E402
from ppdlx.errors import DataError, UnsupportedError  # noqa: E402

# Created in this order; sorted order (the labels) is apple, mango, zebra.
CLASS_DIRS = ["zebra", "apple", "mango"]
SORTED = sorted(CLASS_DIRS)
RED = {name: 40 + 80 * SORTED.index(name) for name in CLASS_DIRS}  # label 0,1,2 -> 40,120,200
SIZES = [(48, 40), (40, 56), (64, 48)]


def _write_tree(root, counts, corrupt=()):
    """``root/<split>/<class>/<id>.jpg``; returns {split: {id: label}}."""
    truth = {}
    for split, n in counts.items():
        truth[split] = {}
        for i in range(n):
            name = CLASS_DIRS[i % 3]
            folder = os.path.join(root, split, name)
            os.makedirs(folder, exist_ok=True)
            Image.new("RGB", SIZES[i % 3], (RED[name], 8 + 8 * i, 128)).save(
                os.path.join(folder, f"{i:03d}.jpg"), quality=95)
            truth[split][i] = SORTED.index(name)
    for split, folder_name, fname in corrupt:
        with open(os.path.join(root, split, folder_name, fname), "wb") as f:
            f.write(b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + b"\x13\x37garbage" * 40)
    return truth


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("jpegs"))
    return root, _write_tree(root, {"train": 24, "val": 23})


def _cfg(root, *extra):
    from ppdlx.tasks.preprocess import resolve_preprocessing  # the nulls: the model's default_cfg
    return resolve_preprocessing(load_config(None, [f"data.root={root}", "data.backend=dali", "data.dali.device=cpu", "data.batch_size=4",
                              "data.dali.num_threads=2", "data.transforms.crop_size=32",
                              "data.transforms.resize_short=36", "data.transforms.mean=[127.5,127.5,127.5]",
                              "data.transforms.std=[127.5,127.5,127.5]", "model.num_classes=3", *extra]))


def _decode_ids(images, labels, layout="NCHW"):
    """(ids, labels) from solid-colour outputs; asserts red matches the label."""
    x = images.astype("float32").numpy()
    mean = x[:, :3].mean(axis=(2, 3)) if layout == "NCHW" else x[..., :3].mean(axis=(1, 2))
    rgb = mean * 127.5 + 127.5
    y = labels.numpy()
    expected_red = 40 + 80 * y
    assert np.all(np.abs(rgb[:, 0] - expected_red) < 6), (rgb[:, 0], y)
    return [int(round((g - 8) / 8)) for g in rgb[:, 1]], y.tolist()


def _epoch(loader, epoch=0):
    loader.set_epoch(epoch)
    ids, labels, sizes = [], [], []
    for images, lab in loader:
        i, l = _decode_ids(images, lab)
        ids += i
        labels += l
        sizes.append(int(lab.shape[0]))
    return ids, labels, sizes


def test_train_shapes_dtypes_range_and_labels(tree):
    root, truth = tree
    loader = build_classification_loader(_cfg(root), "train")
    assert loader.classes == SORTED and loader.num_images == 24 and len(loader) == 6
    images, labels = next(iter(loader))
    assert images.shape == [4, 3, 32, 32] and images.dtype == paddle.float32 and images.place.is_cpu_place()
    assert labels.shape == [4] and labels.dtype == paddle.int64
    x = images.numpy()
    assert x.min() >= -1.0 - 1e-6 and x.max() <= 1.0 + 1e-6 and x.std() > 0.1
    ids, labels, sizes = _epoch(loader)
    assert sizes == [4] * 6 and sorted(ids) == list(range(24))  # one epoch = every image once, shuffled
    assert ids != list(range(24))
    assert all(truth["train"][i] == label for i, label in zip(ids, labels))
    ids_next, _, _ = _epoch(loader, epoch=1)
    assert sorted(ids_next) == list(range(24)) and ids_next != ids  # reshuffled per epoch


@pytest.mark.parametrize("depth", [1, 3])
def test_one_pipeline_reads_each_epochs_sampler_order(tree, depth):
    """Every epoch yields exactly its sampler order through the pipeline built for the first one, also
    after an epoch left early, as the trainer leaves one at its last whole accumulation window (the
    batches it left in flight must not leak into the next epoch)."""
    root, _ = tree
    loader = build_classification_loader(_cfg(root, f"data.dali.prefetch_queue_depth={depth}"), "train")

    def sampler_ids(epoch):
        loader.sampler.set_epoch(epoch)
        return [int(os.path.basename(loader.files[i])[:3]) for batch in loader.sampler for i in batch]

    ids, _, _ = _epoch(loader, 0)
    first_pipe = loader._pipe
    assert ids == sampler_ids(0) and first_pipe is not None
    ids, _, _ = _epoch(loader, 1)
    assert ids == sampler_ids(1) != sampler_ids(0) and loader._pipe is first_pipe
    for left_after in (1, 5):
        loader.set_epoch(2)
        for step, _ in enumerate(loader):
            if step + 1 == left_after:
                break
    for epoch in (3, 4):
        ids, _, sizes = _epoch(loader, epoch)
        assert ids == sampler_ids(epoch) and sizes == [4] * 6
    assert loader._pipe is first_pipe


def test_file_names_that_are_not_utf8_are_read(tmp_path):
    """Paths go to DALI as the file system's bytes (``os.fsencode``): a Latin-1 folder name, which Python
    holds with surrogate escapes, is read like any other."""
    root = str(tmp_path)
    for split in ("train", "val"):
        for i, name in enumerate([b"caf\xe9", b"th\xc3\xa9", b"zoo"]):
            folder = os.path.join(root, split, os.fsdecode(name))
            os.makedirs(folder)
            for k in range(2):
                Image.new("RGB", (40, 40), (40 + 80 * i, 8 + 8 * k, 128)).save(os.path.join(folder, f"{k}.jpg"))
    loader = build_classification_loader(_cfg(root, "data.batch_size=2"), "train")
    labels = sorted(int(v) for _, lab in loader for v in lab.numpy())
    assert labels == [0, 0, 1, 1, 2, 2]


def test_nhwc_float16(tree):
    """Three channels, as every ppdlx model's stem takes (DALI's 4-channel pad_output, which
    NVIDIA's ResNet50 feeds to its own 4-channel stem, stopped the first convolution here)."""
    root, _ = tree
    cfg = _cfg(root, "model.data_format=NHWC", "data.dali.output_dtype=float16")
    images, labels = next(iter(build_classification_loader(cfg, "train")))
    assert images.shape == [4, 32, 32, 3] and images.dtype == paddle.float16
    x = images.astype("float32").numpy()
    assert np.abs(x).max() <= 1.0 + 1e-2
    _decode_ids(images, labels, layout="NHWC")
    with pytest.raises(Exception, match="data.dali.pad_output: unknown key"):
        _cfg(root, "data.dali.pad_output=true")


def test_float16_output_is_for_training_batches_validation_stays_float32(tree):
    """Evaluation runs the float32 weights a checkpoint holds, without autocast (on GPU too), so the
    val split ignores data.dali.output_dtype and yields the same float32 batches either way."""
    root, _ = tree
    half, full = (build_classification_loader(_cfg(root, f"data.dali.output_dtype={dtype}"), "val")
                  for dtype in ("float16", "float32"))
    batches = [(a, b) for (a, _), (b, _) in zip(half, full)]
    assert len(batches) == 6 and all(a.dtype == b.dtype == paddle.float32 for a, b in batches)
    assert max(float((a - b).abs().max()) for a, b in batches) == 0.0
    images, _ = next(iter(build_classification_loader(_cfg(root, "data.dali.output_dtype=float16"), "train")))
    assert images.dtype == paddle.float16


def test_training_order_without_random_transforms_is_paddle_ios_shuffled_order(tree):
    """data.transforms.random=false turns the random crop and flip off (identical batches across
    graph modes); before, it also stopped the DALI training order from shuffling, so every batch held
    one class, while the paddle.io loader kept shuffling."""
    root, _ = tree
    off = "data.transforms.random=false"
    dali_ids, dali_labels, _ = _epoch(build_classification_loader(_cfg(root, off), "train"))
    paddle_ids, _, _ = _epoch(build_classification_loader(_cfg(root, off, "data.backend=paddle", "data.workers=0"),
                                                          "train"))
    assert dali_ids == paddle_ids and sorted(dali_ids) == list(range(24))
    assert any(len(set(dali_labels[i:i + 4])) > 1 for i in range(0, 24, 4))


def test_train_shards_are_disjoint(tree):
    root, _ = tree
    per_rank = []
    for rank in (0, 1):
        loader = dali_backend.build_dali_loader(_cfg(root), "train", rank, 2)
        assert len(loader) == 3
        ids, _, sizes = _epoch(loader)
        assert sizes == [4, 4, 4]
        per_rank.append(ids)
    assert not set(per_rank[0]) & set(per_rank[1])
    assert sorted(per_rank[0] + per_rank[1]) == list(range(24))


def test_val_counts_every_image_once_across_ranks(tree):
    root, truth = tree
    seen = []
    for rank, expected_sizes in ((0, [4, 4, 4]), (1, [4, 4, 3])):
        loader = dali_backend.build_dali_loader(_cfg(root), "val", rank, 2)
        assert len(loader) == 3
        first = _epoch(loader, 0)
        assert first[2] == expected_sizes
        assert _epoch(loader, 1) == first  # the reused pipeline restarts aligned, same images
        seen += first[0]
        assert all(truth["val"][i] == label for i, label in zip(first[0], first[1]))
    assert len(seen) == 23 and sorted(seen) == list(range(23))


@pytest.mark.parametrize("orientation", [None, 6])
def test_val_matches_paddle_io_geometry(tmp_path, orientation):
    """Fused ROI decode + resize == resize-shorter + centre-crop of the paddle.io path, also for a
    photo with an EXIF orientation tag (6: shown turned by 90 degrees), which both read in its stored
    frame, as PIL and deploy's pre-processing do (DALI turned it before)."""
    root = str(tmp_path)
    yy, xx = np.mgrid[0:48, 0:80]
    arr = np.stack([xx * 3, yy * 5, (xx + yy) * 2], axis=-1).clip(0, 255).astype(np.uint8)
    exif = Image.Exif()
    if orientation:
        exif[0x0112] = orientation
    for split in ("train", "val"):
        os.makedirs(os.path.join(root, split, "a"))
        Image.fromarray(arr).save(os.path.join(root, split, "a", "g.jpg"), quality=98, exif=exif.tobytes())
    dali_x = next(iter(build_classification_loader(_cfg(root, "data.batch_size=1", "model.num_classes=1"),
                                                   "val")))[0].numpy()
    paddle_cfg = _cfg(root, "data.batch_size=1", "model.num_classes=1", "data.backend=paddle", "data.workers=0")
    paddle_x = next(iter(build_classification_loader(paddle_cfg, "val")))[0].numpy()
    assert dali_x.shape == paddle_x.shape == (1, 3, 32, 32)
    assert np.abs(dali_x - paddle_x).mean() < 0.03 and np.abs(dali_x - paddle_x).max() < 0.2


def test_cpu_outputs_reach_paddle_zero_copy(tree):
    root, _ = tree
    import nvidia.dali.fn as fn

    def graph():
        jpegs, _ = fn.readers.file(file_root=os.path.join(root, "train"), name="Reader")
        return fn.crop(fn.decoders.image(jpegs), crop=(16, 16))

    pipe = dali.pipeline_def(graph)(batch_size=4, num_threads=1, device_id=None, exec_dynamic=True)
    pipe.build()
    held = []
    for _ in range(5):
        (out,) = pipe.run()
        x = dali_backend.to_paddle(out, "cpu")
        assert x.data_ptr() == out.as_tensor().data_ptr()  # same buffer: no copy
        held.append((x, x.numpy().copy()))
    # Buffers handed out are not recycled while paddle holds them.
    assert all(np.array_equal(x.numpy(), copy) for x, copy in held)


def test_the_loader_keeps_each_batch_until_paddles_later_work_cannot_read_it(tree):
    """A GPU batch dropped by paddle returns to DALI's pool and DALI's stream may write the next
    batches into it while paddle's stream still reads it (an accumulation window reads nothing
    back). The loader holds each batch for prefetch_queue_depth + 1 more batches; on CPU the reuse
    shows as the same buffer address, here within 2 batches when nothing holds them."""
    loader = dali_backend.build_dali_loader(_cfg(tree[0], "data.dali.num_threads=1"), "train")
    window = loader.dali_cfg.prefetch_queue_depth + 1
    addresses = [images.data_ptr() for images, _ in loader]  # each batch dropped when the next is taken
    assert len(addresses) == 6
    reused = [(j, i) for j, a in enumerate(addresses) for i in range(max(0, j - window), j) if addresses[i] == a]
    assert not reused, f"(batch, reuses the memory of batch): {reused}"
    from ppdlx.data.dali_handover import HeldBatches
    held = HeldBatches(2)
    for n in range(4):
        held.consumed((paddle.zeros([1]), paddle.zeros([1])))
        assert len(held) == min(n + 1, 2)
    held.release_all()
    assert len(held) == 0


def _plugin_dlpack_tensor(tensor_list):
    """What DALIGenericIterator yields with the dynamic executor (nvidia/dali/plugin/paddle.py:348-353)."""
    out = paddle.framework.core.from_dlpack(tensor_list.as_tensor().__dlpack__())
    out.set_recursive_sequence_lengths([])
    return out


def _plugin_copied_tensor(tensor_list):
    """What DALIGenericIterator yields without it: a LoDTensor filled by feed_ndarray (plugin/paddle.py:336-346)."""
    from nvidia.dali.plugin.paddle import feed_ndarray, to_paddle_type
    tensor = tensor_list.as_tensor()
    out = paddle.framework.core.LoDTensor()
    out._set_dims(tensor.shape())
    feed_ndarray(tensor, out._mutable_data(paddle.CPUPlace(), to_paddle_type(tensor)))
    return out


BATCH_FORMS = {
    "TensorList": lambda tl: tl,
    "as_tensor": lambda tl: tl.as_tensor(),
    "plugin_dlpack_DenseTensor": _plugin_dlpack_tensor,
    "plugin_copied_DenseTensor": _plugin_copied_tensor,
    "paddle.Tensor": lambda tl: paddle.utils.dlpack.from_dlpack(tl.as_tensor()),
}


def _first_raw_batch(loader):
    """The DALI outputs of the loader's first batch, before the hand-over to paddle."""
    loader._feed.start(loader._order())
    return loader._build(0).run()


@pytest.mark.parametrize("form", sorted(BATCH_FORMS))
def test_every_output_form_reaches_a_model_as_a_paddle_tensor(tree, form):
    """The hand-over both devices use, fed each object DALI or its paddle plugin yields for a batch."""
    from ppdlx.models.resnet import resnet_tiny
    root, _ = tree
    loader = dali_backend.build_dali_loader(_cfg(root), "val")
    images, labels = _first_raw_batch(loader)
    assert type(BATCH_FORMS[form](images)).__name__ == {"TensorList": "TensorListCPU", "as_tensor": "TensorCPU",
                                                        "paddle.Tensor": "Tensor"}.get(form, "DenseTensor")
    x = dali_backend.to_paddle(BATCH_FORMS[form](images), loader.device)
    y = dali_backend.to_paddle(BATCH_FORMS[form](labels), loader.device).reshape([-1])
    assert isinstance(x, paddle.Tensor) and isinstance(y, paddle.Tensor) and x.place.is_cpu_place()
    np.testing.assert_array_equal(x.numpy(), images.as_array())
    np.testing.assert_array_equal(y.numpy(), labels.as_array().reshape(-1))
    assert x.shape == [4, 3, 32, 32] and y.shape == [4] and y.dtype == paddle.int64
    paddle.seed(0)
    model = resnet_tiny(num_classes=3)
    model.eval()
    logits = model(x[:3])
    loss = paddle.nn.functional.cross_entropy(logits, y[:3])
    assert logits.shape == [3, 3] and np.isfinite(float(loss))


@pytest.mark.parametrize("accessor", ["at", "getitem"])
def test_per_sample_outputs_become_paddle_tensors(tree, accessor):
    root, _ = tree
    loader = dali_backend.build_dali_loader(_cfg(root), "val")
    images, _ = _first_raw_batch(loader)
    reference = images.as_array()
    for i in range(len(images)):
        sample = images.at(i) if accessor == "at" else images[i]
        x = dali_backend.to_paddle(sample, "cpu")
        assert isinstance(x, paddle.Tensor) and x.shape == [3, 32, 32]
        np.testing.assert_array_equal(x.numpy(), reference[i])


def test_file_root_labels_are_sorted_folder_indices(tree):
    """DALI's own file_root labelling agrees with ImageFolder's (we pass explicit lists anyway)."""
    root, truth = tree
    import nvidia.dali.fn as fn

    def graph():
        jpegs, labels = fn.readers.file(file_root=os.path.join(root, "val"), name="Reader")
        return fn.decoders.image(jpegs), labels

    pipe = dali.pipeline_def(graph)(batch_size=23, num_threads=1, device_id=None)
    pipe.build()
    images, labels = pipe.run()
    for k in range(23):
        red = np.asarray(images[k])[..., 0].mean()
        assert abs(red - (40 + 80 * int(np.asarray(labels[k])[0]))) < 6


def test_corrupt_file_is_skipped_once_by_name(tmp_path, ppdlx_caplog):
    caplog = ppdlx_caplog
    root = str(tmp_path)
    _write_tree(root, {"train": 23, "val": 11}, corrupt=[("train", "apple", "bad.jpg"), ("val", "mango", "bad.jpg")])
    val = build_classification_loader(_cfg(root), "val")
    with caplog.at_level("WARNING", logger="ppdlx.data"):
        ids, _, _ = _epoch(val)
        assert sorted(ids) == list(range(11))  # the 11 good images, each once
        assert sorted(_epoch(val, 1)[0]) == list(range(11))
    bad_val = os.path.join(root, "val", "mango", "bad.jpg")
    assert val.skipped_files == [bad_val]
    assert sum(bad_val in r.getMessage() for r in caplog.records) == 1
    train = build_classification_loader(_cfg(root), "train")
    assert len(train) == 6  # 24 files // 4, all of them read in epoch 0
    ids, _, sizes = _epoch(train)
    # Still 6 full batches (ranks stay in step): the 23 good images and one repeat in place of the bad one.
    assert sizes == [4] * 6 and set(ids) == set(range(23)) and len(ids) == 24
    assert train.skipped_files == [os.path.join(root, "train", "apple", "bad.jpg")]


def test_corrupt_file_error_mode_names_the_file(tmp_path):
    root = str(tmp_path)
    _write_tree(root, {"train": 8, "val": 6}, corrupt=[("val", "zebra", "broken.jpg")])
    val = build_classification_loader(_cfg(root, "data.dali.corrupt_files=error"), "val")
    with pytest.raises(DataError) as info:
        _epoch(val)
    message = str(info.value)
    assert os.path.join(root, "val", "zebra", "broken.jpg") in message and "\n" not in message


@pytest.mark.skipif(paddle.is_compiled_with_cuda(), reason="needs a CPU-only Paddle build")
def test_gpu_device_on_cpu_build_is_one_line(tree):
    root, _ = tree
    with pytest.raises(UnsupportedError) as info:
        build_classification_loader(_cfg(root, "data.dali.device=gpu"), "train")
    message = str(info.value)
    assert "data.dali.device=gpu" in message and "data.dali.device=cpu" in message and "\n" not in message


def _plant_unreadable(root, split):
    """A zero-byte JPEG and a truncated real JPEG between valid ones of ``root/split`` (sorted order: the zero-byte
    file right after apple/004.jpg, the truncated one right after mango/005.jpg)."""
    zero = os.path.join(root, split, "apple", "004z.jpg")
    open(zero, "wb").close()
    truncated = os.path.join(root, split, "mango", "005t.jpg")
    with open(os.path.join(root, split, "mango", "005.jpg"), "rb") as f:
        data = f.read()
    with open(truncated, "wb") as f:
        f.write(data[: len(data) // 2])
    return zero, truncated


def test_find_undecodable_names_each_bad_file_not_its_neighbour(tmp_path):
    root = str(tmp_path)
    _write_tree(root, {"val": 12})
    zero, truncated = _plant_unreadable(root, "val")
    good = [os.path.join(root, "val", "apple", "004.jpg"), os.path.join(root, "val", "apple", "007.jpg")]
    missing = os.path.join(root, "val", "apple", "gone.jpg")
    bad = find_undecodable([good[0], zero, good[1], truncated, missing])
    # Before: DALI's file reader reads one sample ahead, so the empty file failed the run of apple/004.jpg and
    # that valid image was named (reason "Critical error in pipeline:").
    assert [path for path, _ in bad] == [zero, truncated, missing]
    assert bad[0][1] == "empty file: 0 bytes" and bad[2][1] == "No such file or directory"
    assert bad[1][1].startswith("DALI's decoder rejects it")


def test_zero_byte_jpeg_is_skipped_by_its_own_name(tmp_path, ppdlx_caplog):
    root = str(tmp_path)
    _write_tree(root, {"train": 11, "val": 12})
    zero, truncated = _plant_unreadable(root, "val")
    val = build_classification_loader(_cfg(root), "val")
    with ppdlx_caplog.at_level("WARNING", logger="ppdlx.data"):
        ids, _, sizes = _epoch(val)
    assert sorted(ids) == list(range(12)) and sum(sizes) == 12  # every valid image once, none dropped
    assert val.skipped_files == [zero, truncated]
    warnings = [r.getMessage() for r in ppdlx_caplog.records if "unreadable" in r.getMessage()]
    assert warnings[0] == f"skipping unreadable image {zero} (empty file: 0 bytes; 1 skipped so far)"
    assert warnings[1].startswith(f"skipping unreadable image {truncated} (DALI's decoder rejects it")
    assert len(warnings) == 2
    # training (shuffled; 11 valid files and the empty one make 3 full batches): the same file named, every valid
    # image read, one of them twice in place of the empty one
    zero_train, _ = _plant_unreadable(root, "train")
    os.remove(os.path.join(root, "train", "mango", "005t.jpg"))
    train = build_classification_loader(_cfg(root), "train")
    ids, _, sizes = _epoch(train)
    assert train.skipped_files == [zero_train] and set(ids) == set(range(11)) and sizes == [4, 4, 4]


def test_zero_byte_jpeg_error_mode_names_it(tmp_path):
    root = str(tmp_path)
    _write_tree(root, {"train": 12, "val": 12})
    zero, _ = _plant_unreadable(root, "val")
    val = build_classification_loader(_cfg(root, "data.dali.corrupt_files=error"), "val")
    with pytest.raises(DataError) as info:
        _epoch(val)
    # Before: "<root>/val/apple/004.jpg: DALI cannot decode this image (Critical error in pipeline:); delete or
    # replace it, ..." -- the valid image before the empty one.
    assert str(info.value) == (f"{zero}: empty file: 0 bytes; the data.backend=dali loader cannot read it: delete or "
                               f"replace it, or set data.dali.corrupt_files=skip to leave such files out")


def test_split_without_one_readable_image_is_one_error(tmp_path):
    root = str(tmp_path)
    _write_tree(root, {"train": 6, "val": 6})
    for split in ("train", "val"):
        for dirpath, _, files in os.walk(os.path.join(root, split)):
            for name in files:
                with open(os.path.join(dirpath, name), "wb") as f:
                    f.write(b"" if name < "003" else b"\xff\xd8 not a jpeg")
    for split, n in (("train", 6), ("val", 6)):
        loader = build_classification_loader(_cfg(root, "data.batch_size=2"), split)
        with pytest.raises(DataError) as info:
            _epoch(loader)
        message = str(info.value)
        assert message.startswith(f"{os.path.join(root, split)}: none of the {n} images this rank read can be "
                                  f"decoded (first: {os.path.join(root, split)}")
        assert message.endswith("); replace the files (tools/check_data.py lists every unreadable one) or fix "
                                "data.root") and "\n" not in message
