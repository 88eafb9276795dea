"""ppdlx's reader of Paddle pickles: genuine ``paddle.save`` files and ppdlx's ``.pdstates`` (both layouts) read
back exactly as ``paddle.load`` / ``pickle`` read them; a payload pickle of any kind is refused naming the global,
and nothing runs. ``PAYLOADS`` and ``plant`` are shared with tests/engine/test_checkpoint_security.py."""
import builtins
import collections
import hashlib
import io
import json
import os
import pickle
import random
import subprocess

import numpy as np
import paddle
import pytest

from ppdlx.checkpoint import training as ckpt
from ppdlx.checkpoint.files import UnsafeCheckpointError, atomic_save, read_checkpoint
from ppdlx.weights.paddle_pickle import load_paddle_pickle
from ppdlx.weights.unpickle import Refused, restricted_loads


class Reduce:
    """Pickles as ``fn(*args)``: what a planted file makes the loader call (``fn`` may itself be a Reduce)."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args

    def __call__(self, *args):  # pickle accepts only a callable as the function of a reduce
        raise AssertionError("a payload stands for its result when unpickled, it is never called here")


def _touch(marker):
    return f"open({str(marker)!r}, 'w').close()"


# kind -> (payload that creates ``marker`` when unpickled, the global the refusal names)
PAYLOADS = {
    "os.system": (lambda m: Reduce(os.system, f"touch {m}"), "'posix.system'"),
    "subprocess": (lambda m: Reduce(subprocess.call, ["touch", str(m)]), "'subprocess.call'"),
    "eval": (lambda m: Reduce(builtins.eval, _touch(m)), "builtins.eval of \"open("),
    "exec": (lambda m: Reduce(builtins.exec, _touch(m)), "'builtins.exec'"),
    "getattr": (lambda m: Reduce(Reduce(getattr, Reduce(builtins.__import__, "os"), "system"), f"touch {m}"),
                "'builtins.getattr'"),
}


def plant(path, payload):
    """Add ``payload`` to the dict pickled in ``path`` (as any writer of the file could), and re-hash the
    file in its unit's manifest.json when there is one, so that the manifest accepts it."""
    value = restricted_loads(open(path, "rb").read()) if os.path.exists(path) else {}
    value["evil"] = payload
    with open(path, "wb") as f:
        pickle.dump(value, f, protocol=4)
    manifest = os.path.join(os.path.dirname(path), "manifest.json")
    if os.path.exists(manifest):
        with open(manifest) as f:
            content = json.load(f)
        data = open(path, "rb").read()
        content["files"][os.path.basename(path)] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        with open(manifest, "w") as f:
            json.dump(content, f)
    return str(path)


@pytest.mark.parametrize("kind", sorted(PAYLOADS))
def test_every_payload_runs_under_pickle_and_is_refused_here(kind, tmp_path):
    make, refused = PAYLOADS[kind]
    live = tmp_path / "live"
    pickle.loads(pickle.dumps({"w": np.ones(2), "evil": make(live)}, protocol=4))
    assert live.exists()  # the payload is real: plain pickle runs it

    marker = tmp_path / "marker"
    data = pickle.dumps({"w": np.ones(2), "evil": make(marker)}, protocol=4)
    for read in (restricted_loads, load_paddle_pickle):
        with pytest.raises(Refused) as err:
            read(data)
        assert str(err.value).startswith(refused)
    for role, suffix in (("model", ".pdparams"), ("optimizer", ".pdopt"), ("states", ".pdstates")):
        plant(tmp_path / f"old{suffix}", make(marker))
        with pytest.raises(UnsafeCheckpointError) as err:
            read_checkpoint(str(tmp_path / "old"), (role,))
        assert str(err.value).startswith(f"{tmp_path}/old{suffix}: refused to unpickle {refused}")
        assert str(err.value).endswith("a checkpoint may only hold tensors, arrays, numbers, strings and "
                                       "containers of them (anything else could run code)")
    assert not marker.exists()


def _same(a, b, where="top"):
    """Deep equality of what two loaders returned: types, keys, tensor dtypes/names/values."""
    assert type(a) is type(b), (where, type(a), type(b))
    if isinstance(a, dict):
        assert list(a) == list(b), where
        for key in a:
            _same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, paddle.Tensor):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), where
        assert a.name == b.name or a.name.startswith("generated_tensor"), where  # else a counter's value
        assert np.array_equal(a.numpy(), b.numpy()), where
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b), where
    elif isinstance(a, paddle.framework.core.GeneratorState):
        assert (a.current_seed(), a.__getstate__()) == (b.current_seed(), b.__getstate__()), where
    else:
        assert a == b, where


def _genuine_files():
    """What paddle.save writes for a model, optimizers with their LR schedules, nested and numpy content."""
    paddle.seed(3)
    model = paddle.nn.Sequential(paddle.nn.Conv2D(3, 4, 3), paddle.nn.BatchNorm2D(4), paddle.nn.Flatten(),
                                 paddle.nn.Linear(4 * 6 * 6, 2))
    files = {"model": model.state_dict()}
    for name, make in (("momentum", paddle.optimizer.Momentum), ("adamw", paddle.optimizer.AdamW)):
        schedule = paddle.optimizer.lr.LinearWarmup(paddle.optimizer.lr.CosineAnnealingDecay(0.1, 10), 2, 0, 0.1)
        optimizer = make(schedule, parameters=model.parameters())
        model(paddle.rand([2, 3, 8, 8])).mean().backward()
        optimizer.step()
        schedule.step()
        files[name] = optimizer.state_dict()
    files["nested"] = {"ema": {"shadow": model.state_dict()}, "tensors": [paddle.ones([2], dtype="bfloat16")],
                       "ordered": collections.OrderedDict(h=paddle.ones([3], dtype="float16"))}
    files["numpy"] = {"a": np.arange(6, dtype=np.int64).reshape(2, 3), "s": np.float32(1.5), "epoch": 3, "t": "x"}
    return files


@pytest.mark.parametrize("protocol", [2, 4])
def test_genuine_paddle_save_files_read_as_paddle_load_reads_them(protocol):
    for name, value in _genuine_files().items():
        buffer = io.BytesIO()
        paddle.save(value, buffer, protocol=protocol)
        data = buffer.getvalue()
        for return_numpy in (False, True):
            _same(paddle.load(io.BytesIO(data), return_numpy=return_numpy),
                  load_paddle_pickle(data, return_numpy=return_numpy), f"{name} numpy={return_numpy}")


def test_pdstates_of_every_layout_read_back_and_restore_the_random_state(tmp_path):
    paddle.seed(11)
    np.random.seed(11)
    random.seed(11)
    rng = ckpt.capture_rng()
    states = {"epoch": 2, "global_step": 8, "rng": [rng], "scaler": {"scale": 1024.0, "incr_count": 3},
              "ema": {"updates": 8, "shadow": {"w": np.ones((2, 2), np.float32)}}, "last_metrics": {"top1": 0.5}}
    expected = (paddle.rand([3]).numpy(), np.random.rand(3), random.random())
    written = {"unit": None, "paddle.save": False, "pickle": True}  # today's unit, then the two earlier layouts
    for layout, plain in written.items():
        if plain is None:
            ckpt.save_checkpoint(str(tmp_path / layout), {"w": paddle.ones([2])}, None, states)
        else:
            atomic_save(states, str(tmp_path / f"{layout}.pdstates"), plain_pickle=plain)
        path = str(tmp_path / layout) + ("" if plain is None else ".pdstates")
        loaded = ckpt.load_states(path)
        data = open(os.path.join(path, "states.pdstates") if plain is None else path, "rb").read()
        _same(pickle.loads(data), loaded, layout)  # what the earlier, unrestricted reader returned
        ckpt.restore_rng(loaded["rng"][0])
        drawn = (paddle.rand([3]).numpy(), np.random.rand(3), random.random())
        assert np.array_equal(drawn[0], expected[0]) and np.array_equal(drawn[1], expected[1]), layout
        assert drawn[2] == expected[2], layout
