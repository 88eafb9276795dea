"""Where a CPU training step spends its time: Paddle's profiler, before vs after ppdlx's CPU settings.

``tools/benchmark.py profile -c CFG`` runs the ppdlx trainer on a synthetic batch in three child
processes (MKL and thread settings only take effect before paddle loads):

* ``paddle defaults``: no ``MKL_DEBUG_CPU_TYPE``, paddle's own 1 math thread, its NCHW conv kernels;
* ``paddle kernels``: ``global.mkl_debug_cpu_type`` (5) and ``global.cpu_threads`` (null = all
  usable cores), still paddle's NCHW conv kernels;
* ``ppdlx defaults``: also ``global.cpu_fast_kernels`` (NHWC, oneDNN convs, 1x1 convs as matmuls),

and lists the top operators by CPU time of each (forward ops are ``<op> dygraph``, backward
ops ``Global_<Op>GradNode``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import ppdlx
from benchmarks import add_config_and_steps, worker_env

SETTINGS = {
    "paddle defaults": ["global.mkl_debug_cpu_type=null", "global.cpu_threads=1", "global.cpu_fast_kernels=false"],
    "paddle kernels": ["global.cpu_fast_kernels=false"],
    "ppdlx defaults": [],
}


def add_arguments(parser):
    add_config_and_steps(parser, 3, "profiled steps", 2, "unprofiled steps first")
    parser.add_argument("--top", type=int, default=8, help="operators listed per setting")


def _child(config, overrides, steps, warmup, top):
    import paddle.profiler as profiler
    from paddle.profiler.profiler_statistic import StatisticData

    from benchmarks.train import _Trainer
    from ppdlx.config import load_config
    # after the user's overrides: the settings compared are CPU switches and the profiler's target is the
    # CPU, so on a GPU host the rows would be kernel-launch times of one same GPU run
    cfg = load_config(config, ["data.backend=synthetic", "global.log_interval=1000000", "ema.enabled=false",
                               *overrides, "global.device=cpu"])
    cfg = cfg.replace({"global.output_dir": cfg.global_.output_dir.rstrip("/") + "_profile"})
    runner = _Trainer(cfg)
    runner.run(warmup)
    prof = profiler.Profiler(targets=[profiler.ProfilerTarget.CPU])
    prof.start()
    start = time.perf_counter()
    for _ in range(steps):
        runner.run(1)
        prof.step()
    seconds = time.perf_counter() - start
    prof.stop()
    items = StatisticData(prof.profiler_result.get_data(), prof.profiler_result.get_extra_info()).event_summary.items
    total_ns = sum(item.cpu_time for item in items.values())
    ranked = sorted(items.values(), key=lambda item: item.cpu_time, reverse=True)[:top]
    return {"images_per_s": steps * cfg.data.batch_size / seconds, "cpu_threads": cfg.global_.cpu_threads,
            "MKL_DEBUG_CPU_TYPE": os.environ.get("MKL_DEBUG_CPU_TYPE"),
            "ops": [{"op": item.name, "calls": item.call, "ms_per_step": item.cpu_time / 1e6 / steps,
                     "share": item.cpu_time / total_ns} for item in ranked]}


def run(args):
    from ppdlx.config import flatten_overrides
    overrides = flatten_overrides(args.override)
    rows, notes = [], []
    env = dict(os.environ)
    if not ppdlx.MKL_DEBUG_CPU_TYPE_FROM_USER:  # this process's default is not the user's choice
        env.pop("MKL_DEBUG_CPU_TYPE", None)
    for setting, setting_overrides in SETTINGS.items():
        request = json.dumps([args.config, [*overrides, *setting_overrides], args.steps, args.warmup, args.top])
        proc = subprocess.run([sys.executable, "-m", "benchmarks.profile", request], env=worker_env(env),
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"error: profiling '{setting}' failed: {proc.stderr.strip().splitlines()[-1:]}")
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        notes.append(f"{setting}: {result['images_per_s']:.2f} img/s under the profiler, "
                     f"{result['cpu_threads']} threads, MKL_DEBUG_CPU_TYPE={result['MKL_DEBUG_CPU_TYPE']}")
        for op in result["ops"]:
            rows.append({"setting": setting, **op, "share": round(op["share"] * 100, 1)})
    notes.append("share = % of all operator CPU time in the profiled steps")
    return {"rows": rows, "notes": notes}


if __name__ == "__main__":
    from ppdlx.config import load_config
    from ppdlx.cpu_env import apply_cpu_environment
    _request = json.loads(sys.argv[1])
    apply_cpu_environment(load_config(_request[0], _request[1]))  # as the tools do, before paddle loads
    print(json.dumps(_child(*_request)))
