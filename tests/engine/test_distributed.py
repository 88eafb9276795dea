"""Collective data parallel on CPU (gloo) through paddle.distributed.launch: two processes, and three
(a world size that divides neither the train nor the val images)."""
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from ppdlx.checkpoint import load_states
from ppdlx.cpu_features import cpu_features, has_bf16
from tests.conftest import make_digits_tree

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(ROOT, "tests", "engine", "dp_worker.py")
DEMO = os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml")


@pytest.fixture(scope="module")
def odd_tree(tmp_path_factory):
    # 3 classes x 23 digits -> 15 val images: an odd count exposes padded duplicates
    return make_digits_tree(tmp_path_factory.mktemp("odd") / "digits", per_class=23, classes=3)


def common(tree, classes=3):
    return [f"data.root={tree}", "model.name=resnet18_bottleneck_tiny", f"model.num_classes={classes}", "data.workers=0",
            "global.device=cpu"]


def launch_ranks(tmp_path, tree, *extra, nan_on_rank1="", ranks=2, classes=3, node_local=False, env=None, log="log",
                 kill_rank1_at=0, launcher=(), out_name="out"):
    out = tmp_path / out_name
    out.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "paddle.distributed.launch", *launcher, "--nproc_per_node", str(ranks), "--log_dir",
           str(tmp_path / log), WORKER, str(out), DEMO]
    if nan_on_rank1:
        cmd += ["--nan-on-rank1", nan_on_rank1]
    if kill_rank1_at:
        cmd += ["--kill-rank1-at", str(kill_rank1_at)]
    if node_local:
        cmd += ["--node-local"]
    cmd += ["-o", *common(tree, classes), f"global.output_dir={out}", "data.batch_size=4", "lr.base_lr=0.05",
            "lr.scale_with_batch=false", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env=None if env is None else dict(os.environ, **env))
    logs = {f: open(tmp_path / log / f, errors="replace").read() for f in sorted(os.listdir(tmp_path / log))
            if f.startswith("workerlog")}
    return proc, out, logs


def rank_states(out, ranks=2):
    return [np.load(out / f"rank{r}.npz") for r in range(ranks)], \
        [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]


def assert_same_weights(states):
    a = states[0]
    for r, b in enumerate(states[1:], 1):
        assert sorted(a.files) == sorted(b.files)
        differ = [k for k in a.files if not np.array_equal(a[k], b[k])]
        assert not differ, f"{len(differ)} of {len(a.files)} tensors differ between rank 0 and {r}, e.g. {differ[:3]}"


def evaluate_alone(tmp_path, tree, weights, classes=3):
    """tools/eval.py in one process on the saved weights: its JSON report."""
    single = tmp_path / "single.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "eval.py"), "-c", DEMO, "--report",
                           str(single), "-o", *common(tree, classes), f"model.weights={weights}"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(single.read_text())


def test_two_ranks_train_in_sync_and_count_every_val_image_once(odd_tree, tmp_path):
    proc, out, logs = launch_ranks(tmp_path, odd_tree, "train.epochs=2")
    text = "".join(logs.values())
    assert proc.returncode == 0, text[-3000:]
    assert "global (" in text and "/device x 2)" in text
    # Both ranks hold bit-identical weights AND BatchNorm statistics (each rank's statistics follow its
    # own shard unless they are averaged before evaluation and saving).
    states, counters = rank_states(out)
    assert_same_weights(states)
    assert [c["images"] for c in counters] == [15, 15]
    # The merged sharded evaluation equals a single-process evaluation of the saved weights.
    single_report = evaluate_alone(tmp_path, odd_tree, f"{out}/latest")
    assert single_report["images"] == 15
    assert abs(single_report["top1"] - counters[0]["top1"]) < 1e-9
    saved = np.load(out / "rank0.npz")
    import paddle
    on_disk = paddle.load(str(out / "latest" / "model.pdparams"))
    assert all(np.array_equal(on_disk[k].numpy(), saved[k]) for k in saved.files)
    # each rank's DALI random state, gathered to rank 0's checkpoint (each rank draws its own crops)
    saved = load_states(str(out / "latest.pdstates"))
    loader_states = saved["train_loader"]
    assert len(loader_states) == 2 and loader_states[0]["dali_checkpoint"] != loader_states[1]["dali_checkpoint"]
    # and each rank's own random generators (seeded seed + rank), not rank 0's for both
    assert len(saved["rng"]) == 2 and not np.array_equal(saved["rng"][0]["numpy"][1], saved["rng"][1]["numpy"][1])


@pytest.mark.skipif(not has_bf16(cpu_features()), reason="this CPU has neither avx512_bf16 nor amx_bf16: "
                    "ppdlx trains in float32 there")
def test_two_ranks_training_bf16_activations_stay_in_sync(odd_tree, tmp_path):
    proc, out, logs = launch_ranks(tmp_path, odd_tree, "train.epochs=1", "amp.enabled=true", "amp.dtype=bfloat16",
                                   "amp.cpu_bf16=true")
    text = "".join(logs.values())
    assert proc.returncode == 0, text[-3000:]
    assert "bf16 activations through 4 residual blocks" in text, text[-3000:]  # rank 0 logs the plan
    states, counters = rank_states(out)
    assert_same_weights(states)
    assert [c["images"] for c in counters] == [15, 15]


def test_three_ranks_stay_in_sync_on_uneven_shards_and_count_every_val_image_once(tiny_tree, tmp_path):
    # 64 train images in batches of 4 over 3 ranks, 16 val images over 3 ranks: neither divides, so a
    # sampler that pads or drops unevenly shows as a wrong count, a lost image or diverged weights.
    proc, out, logs = launch_ranks(tmp_path, tiny_tree, "train.epochs=1", ranks=3, classes=4)
    text = "".join(logs.values())
    assert proc.returncode == 0, text[-3000:]
    assert "/device x 3)" in text
    states, counters = rank_states(out, ranks=3)
    assert_same_weights(states)
    assert [c["images"] for c in counters] == [16, 16, 16]
    assert len({c["top1"] for c in counters}) == 1
    # 64 // (3 x 4): every rank runs the same number of steps (one more on a rank would hang the all-reduce)
    assert {c["global_step"] for c in counters} == {5}
    single_report = evaluate_alone(tmp_path, tiny_tree, f"{out}/latest", classes=4)
    assert single_report["images"] == 16
    assert abs(single_report["top1"] - counters[0]["top1"]) < 1e-9


def test_a_nan_loss_on_one_rank_skips_the_step_on_both(odd_tree, tmp_path):
    # Before: rank 1 skipped backward() while rank 0 entered the gradient all-reduce (NCCL hangs; gloo
    # paired mismatched collectives), and only rank 1 counted the skip.
    proc, out, logs = launch_ranks(tmp_path, odd_tree, "train.epochs=1", "train.steps_per_epoch=6",
                                       "global.log_interval=2", nan_on_rank1="2,3")
    text = "".join(logs.values())
    assert proc.returncode == 0, text[-3000:]
    states, counters = rank_states(out)
    assert [c["skipped_steps"] for c in counters] == [2, 2]
    assert [c["global_step"] for c in counters] == [4, 4]  # 6 windows, 2 skipped
    assert_same_weights(states)
    assert all(np.isfinite(states[0][k]).all() for k in states[0].files)


def test_a_persistent_nan_on_one_rank_stops_both_with_one_line(odd_tree, tmp_path):
    proc, out, logs = launch_ranks(tmp_path, odd_tree, "train.epochs=1", "train.max_nonfinite_steps=3",
                                       nan_on_rank1="all")
    assert proc.returncode != 0
    assert len(logs) == 2
    for name, text in logs.items():
        assert "error: loss was NaN/inf for 3 consecutive steps (epoch 1, step 0)" in text, (name, text[-2000:])
    assert not (out / "rank0.npz").exists()


def test_ranks_that_see_different_checkpoints_refuse_to_resume_alike(odd_tree, tmp_path):
    """Ranks on nodes with their own disks: only rank 0 writes checkpoints, so on resume rank 0 took up
    epoch 1 and rank 1 started fresh; both trained a whole epoch of different models and then stopped
    with 'ranks hold different weights ... bypasses DataParallel's gradient all-reduce' (exit 5), which
    names the wrong cause. Now every rank refuses before any step, with the same line."""
    proc, out, logs = launch_ranks(tmp_path, odd_tree, "train.epochs=1", node_local=True)
    assert proc.returncode == 0, "".join(logs.values())[-3000:]
    assert (out / "node0" / "latest").exists() and not (out / "node1" / "latest").exists()
    for r in range(2):
        (out / f"rank{r}.npz").unlink()
    proc, out, logs = launch_ranks(tmp_path, odd_tree, "train.epochs=2", "train.resume=auto", node_local=True,
                                   log="log2")
    assert proc.returncode != 0 and len(logs) == 2
    for name, text in logs.items():
        assert f"error: global.output_dir={out}/node{name[-1]}: the ranks of this job see different checkpoints " \
            f"there (rank 0: {out}/node0/latest (epoch 1); rank 1: no checkpoint (a fresh start)); every rank must " \
            "read the same global.output_dir" in text, (name, text[-2000:])
        assert "epoch 2" not in text  # no step was trained
    assert not (out / "rank0.npz").exists() and not (out / "rank1.npz").exists()


def test_a_rank_killed_mid_epoch_leaves_one_line_from_the_survivor(odd_tree, tmp_path):
    """Rank 1 SIGKILLed in epoch 2: rank 0's gradient all-reduce in backward() met the closed connection, and
    Paddle, unable to hand gloo's exception to Python, aborted with a C++ traceback within a second, so the
    launcher named rank 0 as the failed one. Now rank 0 says in one line what was lost and how to go on."""
    proc, out, logs = launch_ranks(tmp_path, odd_tree, "train.epochs=2", "train.steps_per_epoch=3",
                                   kill_rank1_at=5)
    survivor = logs["workerlog.0"]
    assert proc.returncode == 6, (proc.returncode, survivor[-3000:])
    line = (f"error: rank 1 of 2 was lost (its connection closed during the gradient all-reduce in backward()); "
            f"{out}/latest (epoch 1) is the newest complete checkpoint: rerun the same command with "
            f"train.resume=auto to continue from it")
    assert line in survivor.splitlines(), survivor[-3000:]
    assert survivor.count("error:") == 1
    assert "Traceback" not in survivor and "FatalError" not in survivor and "terminate called" not in survivor
    assert (out / "rank1.killed").exists() and not (out / "rank0.npz").exists()
    assert os.path.getsize(out / "train.lock") == 0  # released: the rerun takes it over without a warning


def test_gloo_errors_are_told_from_others_and_name_the_lost_rank(monkeypatch):
    """The messages Paddle 3.3.1's gloo gave in the kill tests (a reset connection; the immediate 'TIMEOUT' of a
    closed one, which names the peer), and errors that are not a lost peer."""
    from ppdlx.dist import lost_peer, lost_peer_collective
    reset = RuntimeError("[/paddle/third_party/gloo/gloo/transport/tcp/pair.cc:576] Read error [127.0.0.1]:42709: "
                         "Connection reset by peer")
    closed = "[/paddle/third_party/gloo/gloo/transport/tcp/pair.cc:584] TIMEOUT self_rank = 0 pair_rank = 2 peer_str"
    assert lost_peer_collective(reset) == "a collective"  # raised here, not under paddle/distributed
    assert lost_peer_collective(RuntimeError("(InvalidArgument) shapes differ")) is None
    assert lost_peer_collective(ValueError(str(reset))) is None
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "2")
    monkeypatch.setenv("PADDLE_TRAINER_ID", "0")
    assert lost_peer(str(reset)) == "rank 1 of 2"
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "4")
    assert lost_peer(closed) == "rank 2 of 4"
    assert lost_peer(str(reset)) == "a peer rank of the 4 (the launcher's log names it)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def etcd_server(tmp_path):
    """A real etcd on loopback ports: the store paddle.distributed.launch's elastic controller (the only one that
    honours --max_restart) keeps its peers and heartbeats in."""
    if shutil.which("etcd") is None:
        pytest.skip("no etcd server on PATH (Debian: apt-get install etcd-server)")
    etcd3 = pytest.importorskip("etcd3", reason="paddle.distributed.launch talks to etcd through the etcd3 module "
                                "(pip install cslab-etcd3)")
    client_port, peer_port = free_port(), free_port()
    server = subprocess.Popen(["etcd", "--data-dir", str(tmp_path / "etcd"),
                               "--listen-client-urls", f"http://127.0.0.1:{client_port}",
                               "--advertise-client-urls", f"http://127.0.0.1:{client_port}",
                               "--listen-peer-urls", f"http://127.0.0.1:{peer_port}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:  # a new client each time: one that failed to connect stays failed
                etcd3.client(host="127.0.0.1", port=client_port).status()
                break
            except Exception:  # not serving yet (grpc's connection errors, or the client's ValueError)
                assert time.monotonic() < deadline and server.poll() is None, "etcd did not start"
                time.sleep(0.2)
        yield f"etcd://127.0.0.1:{client_port}"
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_a_rank_killed_mid_epoch_is_restarted_by_the_launcher_to_the_same_weights(odd_tree, tmp_path, etcd_server):
    """paddle.distributed.launch --max_restart with train.resume=auto: rank 1 killed in epoch 2, the launcher stops
    the survivor and starts both again, they resume from epoch 1's checkpoint and end with the weights of an
    uninterrupted run, bit for bit."""
    settings = ("train.epochs=2", "train.steps_per_epoch=3", "train.resume=auto")
    proc, out, logs = launch_ranks(tmp_path, odd_tree, *settings, kill_rank1_at=5, log="log_restarted",
                                   launcher=("--master", etcd_server, "--nnodes", "1", "--job_id", tmp_path.name,
                                             "--max_restart", "1", "--elastic_level", "1"))
    assert proc.returncode == 0, proc.stderr[-3000:] + logs["workerlog.0"][-3000:]
    assert (out / "rank1.killed").exists()
    assert "error: rank 1 of 2 was lost" in logs["workerlog.0"]
    assert f"resumed from {out}/latest -> epoch_1 at epoch 1 (step 3)" in logs["workerlog.0"]
    restarted, counters = rank_states(out)
    assert_same_weights(restarted)
    assert [c["global_step"] for c in counters] == [6, 6]
    proc, plain_out, logs = launch_ranks(tmp_path, odd_tree, *settings, log="log_plain", out_name="plain")
    assert proc.returncode == 0, logs["workerlog.0"][-3000:]
    plain, _ = rank_states(plain_out)
    assert_same_weights([plain[0], restarted[0]])


def test_a_cpu_run_takes_gloo_whatever_paddle_would_choose():
    """Paddle's default backend 'auto' means NCCL on every CUDA build, also for a global.device=cpu run,
    whose CPU tensors NCCL cannot carry: paddle.distributed.launch sets gloo only where it finds no GPU,
    so the README's CPU demo launch failed at its first collective inside the GPU image."""
    from ppdlx.dist import collective_backend
    from ppdlx.errors import ConfigError
    assert collective_backend("cpu", {}) == "gloo"
    assert collective_backend("cpu", {"PADDLE_DISTRI_BACKEND": "auto"}) == "gloo"
    assert collective_backend("cpu", {"PADDLE_DISTRI_BACKEND": "gloo"}) == "gloo"
    assert collective_backend("gpu:0", {}) == "auto"
    assert collective_backend("gpu:3", {"PADDLE_DISTRI_BACKEND": "nccl"}) == "nccl"
    with pytest.raises(ConfigError) as err:
        collective_backend("cpu", {"PADDLE_DISTRI_BACKEND": "nccl"})
    assert str(err.value) == ("global.device=cpu with PADDLE_DISTRI_BACKEND=nccl: a CPU run's tensors go through gloo "
                              "only; unset PADDLE_DISTRI_BACKEND (or set it to gloo), or train with global.device=gpu")



def test_precise_bn_gives_every_rank_the_image_weighted_statistics_of_all_ranks(tmp_path):
    """Ranks whose shards hold different numbers of batches each divided the summed statistics by their
    own count (rank 0's means were half of rank 1's), and a rank with no batch skipped the reduction the
    others waited in."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "engine"))
    from precise_bn_worker import SAMPLES
    proc = subprocess.run([sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir",
                           str(tmp_path / "log"), os.path.join(ROOT, "tests", "engine", "precise_bn_worker.py"),
                           str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    logs = "".join(open(tmp_path / "log" / f).read() for f in sorted(os.listdir(tmp_path / "log")))
    assert proc.returncode == 0, logs[-3000:]
    r0, r1 = (np.load(tmp_path / f"rank{r}.npz") for r in range(2))
    assert (int(r0["used"]), int(r1["used"]), int(r0["used_one"]), int(r1["used_one"])) == (2, 1, 1, 0)
    batches = [SAMPLES[[0, 2]], SAMPLES[[4]], SAMPLES[[1, 3]]]  # rank 0: [0, 2], [4]; rank 1: [1, 3]
    expected = sum(len(b) * b.mean(axis=(0, 2, 3)) for b in batches) / len(SAMPLES)
    for rank in (r0, r1):
        np.testing.assert_allclose(rank["mean"], expected, rtol=1e-5)
        np.testing.assert_allclose(rank["mean_one"], SAMPLES[0].mean(axis=(1, 2)), rtol=1e-5)
