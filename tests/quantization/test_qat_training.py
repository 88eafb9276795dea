"""Quantization-aware training through the one trainer (``qat.enabled``): the same steps in every graph mode, its
checkpoints carry the quanters' states, a kill inside a save resumes bit-identically, and what cannot go with it is
one line."""
import numpy as np
import pytest

from ppdlx import checkpoint as ckpt
from ppdlx.config import load_config
from ppdlx.errors import UnsupportedError
from ppdlx.layers.cpu_kernels import plan_fast_cpu_kernels
from tests.checkpoint.test_checkpoint_kill import finish, params, start
from tests.engine.test_static import DEMO, max_diff, overrides, train_recording


@pytest.fixture(scope="module")
def graph_runs(tiny_tree, tmp_path_factory):
    base = tmp_path_factory.mktemp("qat_graphs")
    runs = {}
    for graph in ("dynamic", "to_static", "static"):
        cfg = load_config(DEMO, overrides(tiny_tree, base / graph, graph, "qat.enabled=true"))
        _, losses = train_recording(cfg)
        runs[graph] = {"losses": losses, "params": params(str(base / graph / "latest"))}
    return runs


def test_qat_trains_the_same_steps_in_every_graph_mode(graph_runs):
    """One model built with fake quantization trains bit-identically eager, with its forward compiled
    (to_static) and as one static PIR program: losses and every checkpointed tensor, quanter states included."""
    dynamic = graph_runs["dynamic"]
    assert len(dynamic["losses"]) == 6
    quanter_states = [k for k in dynamic["params"] if k.endswith(("_quanter._scale", "_quanter._accum"))]
    assert len(quanter_states) == 3 * 18  # per conv (17) and linear: weight scales, activation range and sum
    assert all(np.all(dynamic["params"][k] > 0) for k in quanter_states)
    for graph in ("to_static", "static"):
        assert graph_runs[graph]["losses"] == dynamic["losses"], graph
        assert max_diff(dynamic["params"], graph_runs[graph]["params"]) == 0.0, graph


def test_a_kill_inside_a_qat_save_resumes_bit_identically(tiny_tree, tmp_path):
    """SIGKILL inside the write of epoch 2's optimizer state (tests/checkpoint/fault_injection), resume: the run ends
    with the weights, quanter states and EMA shadows of a run that was never interrupted."""
    qat = ("qat.enabled=true", "train.steps_per_epoch=2", "train.epochs=3")
    straight_dir, out = tmp_path / "straight", tmp_path / "killed"
    straight = start(tiny_tree, straight_dir, *qat)
    code, log = finish(start(tiny_tree, out, *qat, kill="write epoch_2.tmp-<pid>/optimizer.pdopt"))
    assert code == -9, log[-2000:]
    code, log = finish(start(tiny_tree, out, *qat, "train.resume=auto"))
    assert code == 0, log[-3000:]
    assert f"resumed from {out}/latest -> epoch_1 at epoch 1 (step 2)" in log, log[-3000:]
    code, straight_log = finish(straight)
    assert code == 0, straight_log[-3000:]
    a, b = params(str(straight_dir / "latest")), params(str(out / "latest"))
    assert any("activation_quanter._accum" in k for k in a)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    sa, sb = ckpt.load_states(str(straight_dir / "latest")), ckpt.load_states(str(out / "latest"))
    assert any("_quanter." in k for k in sa["ema"]["shadow"])
    assert all(np.array_equal(sa["ema"]["shadow"][k], sb["ema"]["shadow"][k]) for k in sa["ema"]["shadow"])


def test_the_fast_cpu_kernels_step_aside_under_qat():
    """They replace the convolutions' forward, which QAT runs with fake quantization: ``auto`` turns them off,
    ``true`` is one line."""
    with pytest.raises(UnsupportedError, match="global.cpu_fast_kernels=true with qat.enabled"):
        plan_fast_cpu_kernels(True, "cpu", "dynamic", False, qat_enabled=True)
    assert plan_fast_cpu_kernels("auto", "cpu", "dynamic", False, qat_enabled=True) is False
