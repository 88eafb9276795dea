"""Two-process collective data parallel on CPU (gloo) through paddle.distributed.launch."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import make_digits_tree

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(ROOT, "tests", "engine", "dp_worker.py")
DEMO = os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml")


@pytest.fixture(scope="module")
def odd_tree(tmp_path_factory):
    # 3 classes x 23 digits -> 15 val images: an odd count exposes padded duplicates
    return make_digits_tree(tmp_path_factory.mktemp("odd") / "digits", per_class=23, classes=3)


def common(tree):
    return [f"data.root={tree}", "model.name=resnet18_bottleneck_tiny", "model.num_classes=3", "data.workers=0",
            "global.device=cpu"]


def launch_two_ranks(tmp_path, tree, *extra, nan_on_rank1=""):
    out = tmp_path / "out"
    out.mkdir()
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir",
           str(tmp_path / "log"), WORKER, str(out), DEMO]
    if nan_on_rank1:
        cmd += ["--nan-on-rank1", nan_on_rank1]
    cmd += ["-o", *common(tree), f"global.output_dir={out}", "data.batch_size=4", "lr.base_lr=0.05",
            "lr.scale_with_batch=false", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    logs = {f: open(tmp_path / "log" / f).read() for f in sorted(os.listdir(tmp_path / "log"))
            if f.startswith("workerlog")}
    return proc, out, logs


def rank_states(out):
    return [np.load(out / f"rank{r}.npz") for r in (0, 1)], \
        [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def assert_same_weights(states):
    a, b = states
    assert sorted(a.files) == sorted(b.files)
    differ = [k for k in a.files if not np.array_equal(a[k], b[k])]
    assert not differ, f"{len(differ)} of {len(a.files)} tensors differ between the ranks, e.g. {differ[:3]}"


def test_two_ranks_train_in_sync_and_count_every_val_image_once(odd_tree, tmp_path):
    proc, out, logs = launch_two_ranks(tmp_path, odd_tree, "train.epochs=2")
    text = "".join(logs.values())
    assert proc.returncode == 0, text[-3000:]
    assert "global (" in text and "/device x 2)" in text
    # Both ranks hold bit-identical weights AND BatchNorm statistics (each rank's statistics follow its
    # own shard unless they are averaged before evaluation and saving).
    states, counters = rank_states(out)
    assert_same_weights(states)
    assert [c["images"] for c in counters] == [15, 15]
    # The merged sharded evaluation equals a single-process evaluation of the saved weights.
    single = tmp_path / "single.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "eval.py"), "-c", DEMO, "--report",
                           str(single), "-o", *common(odd_tree), f"model.weights={out}/latest"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    single_report = json.loads(single.read_text())
    assert single_report["images"] == 15
    assert abs(single_report["top1"] - counters[0]["top1"]) < 1e-9
    saved = np.load(out / "rank0.npz")
    import paddle
    on_disk = paddle.load(str(out / "latest" / "model.pdparams"))
    assert all(np.array_equal(on_disk[k].numpy(), saved[k]) for k in saved.files)


def test_a_nan_loss_on_one_rank_skips_the_step_on_both(odd_tree, tmp_path):
    # Before: rank 1 skipped backward() while rank 0 entered the gradient all-reduce (NCCL hangs; gloo
    # paired mismatched collectives), and only rank 1 counted the skip.
    proc, out, logs = launch_two_ranks(tmp_path, odd_tree, "train.epochs=1", "train.steps_per_epoch=6",
                                       "global.log_interval=2", nan_on_rank1="2,3")
    text = "".join(logs.values())
    assert proc.returncode == 0, text[-3000:]
    states, counters = rank_states(out)
    assert [c["skipped_steps"] for c in counters] == [2, 2]
    assert [c["global_step"] for c in counters] == [4, 4]  # 6 windows, 2 skipped
    assert_same_weights(states)
    assert all(np.isfinite(states[0][k]).all() for k in states[0].files)


def test_a_persistent_nan_on_one_rank_stops_both_with_one_line(odd_tree, tmp_path):
    proc, out, logs = launch_two_ranks(tmp_path, odd_tree, "train.epochs=1", "train.max_nonfinite_steps=3",
                                       nan_on_rank1="all")
    assert proc.returncode != 0
    assert len(logs) == 2
    for name, text in logs.items():
        assert "error: loss was NaN/inf for 3 consecutive steps (epoch 1, step 0)" in text, (name, text[-2000:])
    assert not (out / "rank0.npz").exists()
