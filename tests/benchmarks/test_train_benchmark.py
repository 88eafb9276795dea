"""tools/benchmark.py train plumbing: interleaved rounds, per-case step counts and ratios, and the
PyTorch worker process (when torch is installed). Speeds themselves are not asserted."""
import importlib.util

import pytest

from benchmarks.train import measure, ratio_to_best, settle_seconds
from ppdlx.config import load_config


class _Counter:
    def __init__(self, seconds_per_step, steps_scale=1.0):
        self.seconds_per_step, self.steps_scale, self.calls = seconds_per_step, steps_scale, []

    def run(self, steps):
        self.calls.append(steps)
        return self.seconds_per_step * steps  # its own timing, as the PyTorch worker reports


def _cfg(tmp_path):
    return load_config("configs/demo/rn50_demo.yaml", [
        "data.backend=synthetic", "data.batch_size=2", "data.transforms.crop_size=32", "ema.enabled=false",
        "amp.enabled=false", "model.name=resnet18_bottleneck_tiny", f"global.output_dir={tmp_path}"])


def test_measure_counts_steps_and_ratios(tmp_path, monkeypatch):
    monkeypatch.delenv("KMP_BLOCKTIME", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    fast, slow = _Counter(0.5), _Counter(2.0, steps_scale=0.25)
    order = []
    rows = measure(_cfg(tmp_path), steps=8, warmup=4, rounds=2, cases=("ppdlx",),
                   extra_runners={"fast": fast, "slow": slow}, order_out=order)
    # every timed run starts only after the previous one's OpenMP threads stopped spinning
    settle = settle_seconds()
    assert settle == pytest.approx(0.3) and {r["settle_s"] for r in rows} == {settle}
    assert [(o["round"], o["case"]) for o in order] == [(0, "ppdlx"), (0, "fast"), (0, "slow"),
                                                         (1, "slow"), (1, "fast"), (1, "ppdlx")]
    assert all(b["start"] - a["end"] >= settle for a, b in zip(order, order[1:]))
    by = {r["case"]: r for r in rows}
    assert fast.calls == [4, 4, 4] and slow.calls == [1, 1, 1]  # warm-up, then 2 rounds of 8 // 2 (x 0.25)
    assert by["fast"]["steps"] == 8 and by["slow"]["steps"] == 2
    assert by["fast"]["images_per_s"] == pytest.approx(2 / 0.5) and by["slow"]["images_per_s"] == pytest.approx(1.0)
    assert by["slow"]["ppdlx_vs_this"] == pytest.approx(by["ppdlx"]["images_per_s"] / 1.0)
    # per-round ratios (ppdlx's img/s in a round over the case's in the same round) and their spread
    mine = by["ppdlx"]["images_per_s_per_round"]
    assert len(mine) == 2 and by["fast"]["images_per_s_per_round"] == pytest.approx([4.0, 4.0])
    assert by["fast"]["ratios_per_round"] == pytest.approx(sorted(m / 4.0 for m in mine))
    assert by["fast"]["ratio_min"] == pytest.approx(min(mine) / 4.0)
    assert by["fast"]["ratio_max"] == pytest.approx(max(mine) / 4.0)
    assert by["fast"]["ratio_median"] == pytest.approx(sum(mine) / 2 / 4.0)


@pytest.mark.parametrize("environ, seconds", [
    ({}, 0.3), ({"KMP_BLOCKTIME": "0"}, 0.0), ({"KMP_BLOCKTIME": "50"}, 0.15), ({"KMP_BLOCKTIME": "1s"}, 1.1),
    ({"KMP_BLOCKTIME": "500us"}, 0.1005), ({"KMP_BLOCKTIME": "INFINITE"}, None), ({"OMP_WAIT_POLICY": "active"}, None),
    ({"OMP_WAIT_POLICY": "PASSIVE"}, 0.0), ({"KMP_BLOCKTIME": "fast"}, 0.3)])
def test_settle_pause_follows_the_openmp_block_time(environ, seconds):
    assert settle_seconds(environ) == (None if seconds is None else pytest.approx(seconds))


def test_ratio_to_best_takes_the_fastest_reference_of_each_round():
    rows = [{"case": "ppdlx", "images_per_s_per_round": [10.0, 6.0, 8.0]},
            {"case": "torch_eager", "images_per_s_per_round": [5.0, 8.0, 4.0]},
            {"case": "torch_channels_last", "images_per_s_per_round": [8.0, 4.0, 10.0]},
            {"case": "bare", "images_per_s_per_round": [100.0, 100.0, 100.0]}]
    best = ratio_to_best(rows)
    assert best["best_images_per_s_per_round"] == [8.0, 8.0, 10.0]
    assert best["ratios_per_round"] == pytest.approx([0.75, 0.8, 1.25])
    assert (best["ratio_min"], best["ratio_median"], best["ratio_max"]) == pytest.approx((0.75, 0.8, 1.25))
    assert ratio_to_best(rows[:1]) is None


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch is a benchmark-only extra")
def test_torch_worker_trains_in_its_own_process():
    from benchmarks.torch_compare import TorchWorker
    worker = TorchWorker(batch=2, size=32, num_classes=10, threads=1)
    try:
        seconds = [worker.run("torch eager float32", 1) for _ in range(2)]
    finally:
        worker.close()
    assert all(0 < s < 60 for s in seconds)
    assert worker.facts["torch_threads"] == 1 and worker.proc.returncode == 0


def test_ppdlx_fp32_case_is_the_same_trainer_with_amp_off(tmp_path):
    """``--cases ppdlx,ppdlx-fp32``: what bf16 buys, measured against the same trainer in float32,
    which writes to its own output directory. Where the CPU has bf16 hardware the ppdlx case is
    forced onto bf16 convolutions (``amp.cpu_bf16=true``); elsewhere both plans are float32."""
    import os

    from ppdlx.cpu_features import cpu_features, has_bf16
    bf16 = has_bf16(cpu_features())
    cfg = _cfg(tmp_path).replace({"amp.enabled": True, "amp.dtype": "bfloat16", "amp.cpu_bf16": bf16,
                                  "global.output_dir": str(tmp_path / "run")})
    plans = []
    rows = measure(cfg, steps=2, warmup=1, rounds=1, cases=("ppdlx", "ppdlx-fp32"), plans_out=plans)
    assert [r["case"] for r in rows] == ["ppdlx", "ppdlx-fp32"] and all(r["steps"] == 2 for r in rows)
    assert len(plans) == 2 and plans[1].startswith("ppdlx-fp32: plan: ") and plans[1].endswith("amp off (float32)")
    expected = "amp bfloat16 convolutions (oneDNN, float32 master weights)" if bf16 else "amp off (float32)"
    assert plans[0].startswith("ppdlx: plan: ") and plans[0].endswith(expected)
    assert os.path.isdir(tmp_path / "run") and os.path.isdir(tmp_path / "run_fp32")
