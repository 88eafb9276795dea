"""ppdlx's fast CPU settings (MKL_DEBUG_CPU_TYPE=5 where the CPU is not Intel and has avx2, all
usable cores, NHWC with oneDNN convs and 1x1 convs as matmuls) compute the same training losses as
paddle's plain defaults (no MKL override, 1 thread, NCHW conv kernels) on a fixed batch (issue 9);
``global.mkl_debug_cpu_type`` overrides the detection only when written (issue 17).

Each setting runs in its own process: MKL reads its environment when paddle loads."""
import json
import os
import subprocess
import sys

from ppdlx.config import load_config
from ppdlx.cpu_env import mkl_debug_cpu_type_setting
from ppdlx.cpu_features import cpu_features, mkl_debug_cpu_type_for

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

APPLY = r"""
import json, os, sys
from ppdlx.config import load_config
from ppdlx.cpu_env import apply_cpu_environment
applied = apply_cpu_environment(load_config(None, json.loads(sys.argv[1])))
print(json.dumps([applied, os.environ.get("MKL_DEBUG_CPU_TYPE"), "paddle" in sys.modules]))
"""


def _apply(overrides, user_value=None):
    env = {k: v for k, v in os.environ.items() if k != "MKL_DEBUG_CPU_TYPE"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    if user_value is not None:
        env["MKL_DEBUG_CPU_TYPE"] = user_value
    proc = subprocess.run([sys.executable, "-c", APPLY, json.dumps(overrides)], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_mkl_debug_cpu_type_follows_the_cpu_unless_the_config_names_it():
    # the schema's default is not the user's choice: only a written value overrides the detection
    assert mkl_debug_cpu_type_setting(load_config(None, [])) == "auto"
    assert mkl_debug_cpu_type_setting(load_config(None, ["global.mkl_debug_cpu_type=5"])) == 5
    assert mkl_debug_cpu_type_setting(load_config(None, ["global.mkl_debug_cpu_type=null"])) is None
    detected = mkl_debug_cpu_type_for(cpu_features())
    assert _apply([]) == [True, detected, False]
    assert _apply(["global.mkl_debug_cpu_type=3"]) == [True, "3", False]
    assert _apply(["global.mkl_debug_cpu_type=null"]) == [True, None, False]
    assert _apply(["global.mkl_debug_cpu_type=null"], user_value="4") == [True, "4", False]  # the user's export stays

SCRIPT = r"""
import json, os, sys
from ppdlx.config import load_config
from ppdlx.cpu_env import apply_cpu_environment
cfg = load_config(os.path.join("configs", "demo", "rn50_demo.yaml"), json.loads(sys.argv[1]))
apply_cpu_environment(cfg)
import paddle
from ppdlx.engine.run import build_training
paddle.seed(0)
trainer = build_training(cfg)
plan = trainer.plan  # what the run decided; the config keeps what was asked for
import numpy as np
rng = np.random.default_rng(0)  # one NCHW batch for both runs, transposed when the run trains in NHWC
images = rng.standard_normal((8, 3, 32, 32)).astype("float32")
if plan.data_format == "NHWC":
    images = images.transpose(0, 2, 3, 1)
batch = (paddle.to_tensor(images), paddle.to_tensor(rng.integers(0, 10, 8)))
losses = []
for step in range(3):  # one optimizer step each, then the after-step hooks (the LR schedule steps)
    trainer.result = trainer.step.run(batch, True)
    losses.append(float(trainer.result.loss))
    trainer.global_step += 1
    trainer.call_hooks("after_step")
saved = open(os.path.join(cfg.global_.output_dir, "plan.yaml")).read()
print(json.dumps({"losses": losses, "fast_kernels": plan.fast_cpu_kernels,
                  "saved_fast_kernels": "fast_cpu_kernels: %s" % str(plan.fast_cpu_kernels).lower() in saved,
                  "mkl": os.environ.get("MKL_DEBUG_CPU_TYPE"), "layout": plan.data_format,
                  "threads": plan.cpu_threads, "saved_threads": "cpu_threads: %d" % plan.cpu_threads in saved}))
"""


def _run(tmp_path, name, overrides):
    overrides = ["data.backend=synthetic", "data.batch_size=8", "amp.enabled=false", "ema.enabled=false",
                 f"global.output_dir={tmp_path / name}", *overrides]
    env = {k: v for k, v in os.environ.items() if k != "MKL_DEBUG_CPU_TYPE"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(overrides)], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_fast_cpu_settings_give_the_plain_losses(tmp_path):
    plain = _run(tmp_path, "plain", ["global.mkl_debug_cpu_type=null", "global.cpu_threads=1",
                                     "global.cpu_fast_kernels=false"])
    nchw = _run(tmp_path, "nchw", ["global.cpu_fast_kernels=false"])  # MKL_DEBUG_CPU_TYPE=5, all cores
    fast = _run(tmp_path, "fast", [])  # the defaults: + cpu_fast_kernels=auto -> NHWC, oneDNN convs, matmuls
    detected = mkl_debug_cpu_type_for(cpu_features())  # "5" on a non-Intel CPU with avx2, else None
    assert plain["mkl"] is None and nchw["mkl"] == fast["mkl"] == detected
    assert plain["layout"] == nchw["layout"] == "NCHW" and fast["layout"] == "NHWC"
    assert fast["fast_kernels"] is True and fast["saved_fast_kernels"]  # auto resolved and saved as true
    assert plain["threads"] == 1 and nchw["threads"] == fast["threads"] == len(os.sched_getaffinity(0))
    assert plain["saved_threads"] and fast["saved_threads"]  # the resolved value is in the run's plan.yaml
    for run in (nchw, fast):
        for a, b in zip(plain["losses"], run["losses"]):
            assert abs(a - b) <= 1e-4 * abs(a), (plain["losses"], run["losses"])
    assert fast["losses"][-1] != fast["losses"][0]  # the optimizer steps changed the weights
