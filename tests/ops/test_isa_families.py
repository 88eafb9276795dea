"""The CPU families ppdlx meets, checked on whichever machine runs the suite. oneDNN dispatches by the
instruction sets its ``ONEDNN_MAX_CPU_ISA`` allows, and ppdlx's CPU features follow that cap, so an AVX-512
machine runs here what an AVX2-only or an SSE4.1 machine would run: the oneDNN-op tests, and short trainings
with the fast CPU kernels and with ``amp.dtype: bfloat16``. Each runs in a subprocess, so a crash under a cap
is a failing test, not a dead CI run."""
import json
import os
import re
import subprocess
import sys

import pytest

from ppdlx.cpu_features import cpu_features, flags_within

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "tools", "train.py")
CAPS = {"AVX2": {"avx2", "fma"}, "SSE41": {"sse4_2"}}  # cap -> the flags the CPU needs to run it


def _capped_env(cap):
    needs = CAPS[cap] - set(cpu_features()["hardware_flags"])
    if needs:
        pytest.skip(f"this CPU lacks {', '.join(sorted(needs))}: oneDNN's {cap} family cannot run here")
    env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")}
    env["ONEDNN_MAX_CPU_ISA"] = cap
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.mark.parametrize("cap", list(CAPS))
def test_features_under_a_cap_are_what_onednn_dispatches(cap):
    env = _capped_env(cap)
    probe = ("import json, paddle; from ppdlx.cpu_features import cpu_features, has_bf16, onednn_runs_bf16; "
             "from ppdlx.ops import onednn; x = paddle.randn([1, 8, 8, 8]); w = paddle.randn([8, 8, 3, 3]); "
             "onednn.conv2d(x, w, 1, [1] * 4, 1, 1, True); f = cpu_features(); "
             "print('FEATURES ' + json.dumps([f['flags'], f['onednn_max_cpu_isa'], has_bf16(f), onednn_runs_bf16(f)]))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                          env=dict(env, ONEDNN_VERBOSE="1"), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    flags, reported_cap, bf16, bf16_ops = json.loads(
        [line for line in proc.stdout.splitlines() if line.startswith("FEATURES ")][-1][9:])
    assert reported_cap == cap and not bf16 and not bf16_ops
    assert set(flags) == flags_within(cpu_features()["hardware_flags"], cap) and not any("avx512" in f for f in flags)
    kernels = [line.split(",")[6] for line in proc.stdout.splitlines()
               if line.startswith("onednn_verbose") and ",exec,cpu,convolution," in line]
    assert kernels and not any("avx512" in k for k in kernels), kernels  # oneDNN kept to the cap too
    if cap == "SSE41":
        assert not any("avx" in k for k in kernels) and "avx2" not in flags, (kernels, flags)


@pytest.mark.parametrize("cap", list(CAPS))
def test_the_onednn_op_tests_pass_under_a_cap(cap):
    env = _capped_env(cap)
    proc = subprocess.run([sys.executable, "-m", "pytest", os.path.join("tests", "ops", "test_onednn.py"), "-q",
                           "-p", "no:cacheprovider", "-rs"], capture_output=True, text=True, timeout=1200, env=env,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed and int(passed.group(1)) >= 30, proc.stdout[-2000:]
    # the bf16 cases skip with the reason instead of reaching oneDNN
    assert "oneDNN has no bfloat16 primitives below AVX-512" in proc.stdout, proc.stdout[-2000:]


def _train(tree, out, env, *extra):
    overrides = [f"data.root={tree}", f"global.output_dir={out}", "global.device=cpu", "global.log_interval=1",
                 "model.name=resnet18_bottleneck_tiny", "model.num_classes=4", "data.batch_size=8",
                 "data.workers=0", "data.backend=paddle", "train.epochs=1", "train.steps_per_epoch=2",
                 "global.cpu_fast_kernels=true", "amp.enabled=true", "amp.dtype=bfloat16", *extra]
    return subprocess.run([sys.executable, TRAIN, "-c", os.path.join(ROOT, "configs", "demo", "rn50_demo.yaml"),
                           "--report", str(out) + ".json", "-o", *overrides], capture_output=True, text=True,
                          timeout=900, env=env, cwd=ROOT)


@pytest.mark.parametrize("cap", list(CAPS))
def test_bf16_training_under_a_cap_runs_float32_on_the_fast_kernels(cap, tiny_tree, tmp_path):
    env = _capped_env(cap)
    proc = _train(tiny_tree, tmp_path / "auto", env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    notes = [line for line in (proc.stdout + proc.stderr).splitlines() if "amp: bfloat16 requested, but" in line]
    assert len(notes) == 1 and f"under ONEDNN_MAX_CPU_ISA={cap}" in notes[0], notes
    plan = open(tmp_path / "auto" / "plan.yaml", encoding="utf-8").read()
    assert "fast_cpu_kernels: true" in plan and "cpu_bf16_convs: false" in plan, plan
    report = json.loads((tmp_path / "auto.json").read_text())
    assert report["epochs"] == 1 and 0.0 <= report["top1"] <= 1.0
    forced = _train(tiny_tree, tmp_path / "forced", env, "amp.cpu_bf16=true")
    lines = [line for line in forced.stderr.splitlines() if line.startswith("error:")]
    assert forced.returncode != 0 and len(lines) == 1, forced.stderr[-2000:]
    assert lines[0].startswith("error: amp.cpu_bf16=true: this CPU has neither avx512_bf16 nor amx_bf16"), lines
