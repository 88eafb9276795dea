"""``tools/benchmark.py infer`` compares runtimes the way a sceptical engineer accepts (issue 17):
each runtime in its own fresh worker process, alternated round by round, per-round ratios reported
with their spread, and the JSON records the CPU, the libraries and the thread settings."""
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from benchmarks.infer import load_deploy_module
from ppdlx.cpu_features import cpu_features, has_bf16

D = load_deploy_module()
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCHMARK = os.path.join(ROOT, "tools", "benchmark.py")


def _tool(*args, timeout=900):
    env = {k: v for k, v in os.environ.items() if k != "PPDLX_DEPLOY_DIR"}
    return subprocess.run([sys.executable, BENCHMARK, "infer", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=timeout)


def test_rounds_alternate_the_order_of_the_runtimes():
    assert D.alternating_order(["a", "b", "c"], 4) == [["a", "b", "c"], ["c", "b", "a"], ["a", "b", "c"],
                                                       ["c", "b", "a"]]
    assert D.alternating_order(["a", "b"], 1) == [["a", "b"]]


def _reply(round_times_ms, first_output):
    return {"times_s": {"1": [t / 1000.0 for t in round_times_ms]}, "outputs": {"1": first_output}}


def test_ratio_statistics_from_known_per_round_times():
    # per-round medians: a = 10, 12, 30 ms (the 500 ms batch is one outlier of three); b = 5, 6, 10 ms
    a = [_reply([9, 10, 500], [1.0, 2.0]), _reply([12, 12, 13], [1.0, 2.0]), _reply([30, 29, 31], [1.0, 2.0])]
    b = [_reply([5, 5, 5], [1.0, 2.5]), _reply([6, 7, 5], [1.0, 2.5]), _reply([10, 10, 10], [1.0, 2.5])]
    summary = D.summarize_rounds({"a": a, "b": b}, [1], [("a", "b")])
    (ratio,) = summary["ratios"]
    assert ratio["per_round"] == pytest.approx([2.0, 2.0, 3.0])
    assert (ratio["median"], ratio["min"], ratio["max"], ratio["n"]) == pytest.approx((2.0, 2.0, 3.0, 3))
    assert (ratio["q1"], ratio["q3"]) == pytest.approx((2.0, 2.5))  # numpy's linear percentiles of 2, 2, 3
    assert ratio["output_max_abs_diff"] == pytest.approx(0.5)
    runtime_a = summary["runtimes"][("a", 1)]
    assert runtime_a["median_ms"] == pytest.approx(13.0)  # median of all nine timed batches (9..500)
    assert runtime_a["batches"] == 9 and runtime_a["round_median_ms"]["median"] == pytest.approx(12.0)
    with pytest.raises(D.DeployError, match="same, non-zero number of rounds"):
        D.ratio_stats([1.0, 2.0], [1.0])


def test_the_default_deployment_is_compared_with_the_fastest_runtime_by_its_median():
    """auto over the runtime with the lowest median, round by round; not over each round's least time,
    which two equally fast runtimes with noise would push below either of them."""
    from benchmarks.infer_runtimes import vs_fastest
    replies = {"paddle-cpu fp32": [_reply([30], [0.0]), _reply([30], [0.0]), _reply([30], [0.0])],
               "onnxruntime fp32": [_reply([10], [0.0]), _reply([12], [0.0]), _reply([10], [0.0])],
               "openvino fp32": [_reply([12], [0.0]), _reply([10], [0.0]), _reply([11], [0.0])],
               "auto fp32": [_reply([10], [0.0]), _reply([12], [0.0]), _reply([11], [0.0])]}
    (auto,) = vs_fastest(D, replies, "auto fp32", [1])
    assert auto["reference"] == "onnxruntime fp32" and auto["fastest_of"] == ["paddle-cpu fp32", "onnxruntime fp32",
                                                                             "openvino fp32"]
    assert auto["per_round"] == pytest.approx([1.0, 1.0, 1.1]) and auto["median"] == pytest.approx(1.0)
    (paddle,) = vs_fastest(D, replies, "paddle-cpu fp32", [1])  # Paddle's own ratio, to the fastest other runtime
    assert paddle["fastest_of"] == ["onnxruntime fp32", "openvino fp32"] and paddle["median"] == pytest.approx(3.0)
    assert vs_fastest(D, {"auto fp32": replies["auto fp32"], "openvino fp32": replies["openvino fp32"]},
                      "auto fp32", [1]) is None


def test_zero_steps_is_one_line_and_fails():
    proc = _tool("-c", "configs/demo/rn50_demo.yaml", "--steps", "0")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == ("error: benchmark infer --steps 0: need at least 1 timed batch per runtime, "
                                   "batch size and round")


def test_unknown_or_unoffered_runtime_is_one_line():
    proc = _tool("-c", "configs/demo/rn50_demo.yaml", "--runtimes", "auto,paddle-cpu fp32 turbo")
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: benchmark infer --runtimes: 'paddle-cpu fp32 turbo': unknown "
                                          "variant 'turbo' for paddle-cpu (known: default, memory-optim, ")
    if not has_bf16(cpu_features()):
        proc = _tool("-c", "configs/demo/rn50_demo.yaml", "--runtimes", "paddle-cpu bf16,onnxruntime fp32")
        assert proc.returncode == 3
        assert proc.stderr.strip() == ("error: benchmark infer --runtimes: 'paddle-cpu bf16': this CPU has neither "
                                       "avx512_bf16 nor amx_bf16, so paddle-cpu bf16 is not offered (oneDNN would "
                                       "emulate it)")


def test_runtimes_run_in_alternating_fresh_processes_and_the_json_records_the_machine(tmp_path):
    pytest.importorskip("onnxruntime")
    report = tmp_path / "infer.json"
    proc = _tool("-c", "configs/demo/rn50_demo.yaml", "-o", "model.name=resnet18_bottleneck_tiny",
                 "model.num_classes=3", f"global.output_dir={tmp_path / 'out'}", "--resolution", "32",
                 "--batch-sizes", "1,2", "--rounds", "2", "--steps", "2", "--warmup", "1", "--threads", "2",
                 "--runtimes", "auto,paddle-cpu fp32 mkl-fc", "--matmul-size", "256", "--report", str(report))
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(report.read_text())
    openvino = importlib.util.find_spec("openvino") is not None
    names = ["paddle-cpu fp32", "onnxruntime fp32"] + (["openvino fp32"] if openvino else []) + ["auto fp32"] + \
        (["paddle-cpu bf16"] if has_bf16(cpu_features()) else []) + ["paddle-cpu fp32 mkl-fc"]
    # every runtime once per round, in its own process, order reversed every other round
    expected = [n for rnd in D.alternating_order(names, 2) for n in rnd]
    assert expected[len(names):] == expected[:len(names)][::-1]
    assert [o["runtime"] for o in r["order"]] == expected
    assert [o["round"] for o in r["order"]] == [i // len(names) for i in range(len(expected))]
    pids = [o["pid"] for o in r["order"]]
    assert len(set(pids)) == len(pids) and os.getpid() not in pids
    # per pair and batch size: the per-round ratios and their spread
    pairs = {(x["runtime"], x["reference"], x["batch_size"]) for x in r["ratios"]}
    assert ("paddle-cpu fp32", "onnxruntime fp32", 1) in pairs and ("paddle-cpu fp32", "onnxruntime fp32", 2) in pairs
    assert ("paddle-cpu fp32 mkl-fc", "paddle-cpu fp32", 2) in pairs
    for x in r["ratios"]:
        assert len(x["per_round"]) == 2 and x["n"] == 2
        assert x["min"] <= x["q1"] <= x["median"] <= x["q3"] <= x["max"]
        assert x["median"] == pytest.approx(float(np.median(x["per_round"])))
        if "bf16" in x["runtime"] + x["reference"]:  # bf16 rounds every layer's inputs, and really ran
            assert 0 < x["output_max_abs_diff"] < 5e-2
        else:  # the runtimes computed the same logits
            assert x["output_max_abs_diff"] < 1e-4
    rows = {(row["case"], row["batch_size"]): row for row in r["rows"]}
    assert set(rows) == {(n, bs) for n in names for bs in (1, 2)}
    assert rows[("paddle-cpu fp32", 1)]["vs_reference"] == pytest.approx(
        next(x["median"] for x in r["ratios"] if x["runtime"] == "paddle-cpu fp32" and x["batch_size"] == 1
             and x["reference"] == "onnxruntime fp32"))
    assert rows[("onnxruntime fp32", 1)]["engine"] == "onnxruntime" and rows[("paddle-cpu fp32", 1)]["threads"] == 2
    # each row's GFLOP/s from the model's own MAC count, and its share of the matrix-product peak,
    # which is the fastest of the products timed before and after the rounds
    from ppdlx.models import build_model
    from ppdlx.models.info import model_info
    peak = r["matmul_peak"]
    gflop = 2 * model_info(build_model("resnet18_bottleneck_tiny", num_classes=3), 32)["macs"] / 1e9
    assert peak["model_gflop_per_image"] == pytest.approx(gflop, rel=1e-12) and gflop > 0
    timings = peak["before"]["timings"] + peak["after"]["timings"]
    assert {t["library"] for t in timings} >= {"numpy"}
    assert all(t["size"] == 256 and t["threads"] == 2 for t in timings)
    assert all(t["gflop_per_s"] == pytest.approx(2 * 256 ** 3 / (t["median_ms"] / 1e3) / 1e9) for t in timings)
    assert peak["gflop_per_s"] == max(t["gflop_per_s"] for t in timings)
    for (name, bs), row in rows.items():
        assert row["gflop_per_s"] == pytest.approx(gflop * bs / (row["median_ms"] / 1e3))
        assert row["of_matmul_peak"] == pytest.approx(row["gflop_per_s"] / peak["gflop_per_s"])
    assert sum(n.startswith("matmul peak: ") for n in r["notes"]) == 1
    # the machine: CPU model, vendor, flags that matter, cores; libraries; thread settings
    here = cpu_features()
    machine = r["machine"]
    assert machine["cpu"] == here["model_name"] and machine["cpu_features"]["vendor"] == here["vendor"]
    assert machine["cpu_features"]["flags"] == here["flags"]
    assert machine["cpu_features"]["usable_cpus"] == len(os.sched_getaffinity(0))
    import onnxruntime
    import paddle
    assert machine["libraries"]["paddlepaddle"] == paddle.__version__
    assert machine["libraries"]["onnxruntime"] == onnxruntime.__version__
    assert machine["threads"]["benchmark"]["per_runtime"] == 2
    assert set(machine["threads"]["environment"]) >= {"OMP_NUM_THREADS", "MKL_DEBUG_CPU_TYPE", "KMP_BLOCKTIME"}
    workers = r["workers"]
    assert workers["paddle-cpu fp32 mkl-fc"]["calls"][-1] == "disable_onednn_fc_passes"
    assert workers["onnxruntime fp32"]["versions"]["onnxruntime"] == onnxruntime.__version__
    assert "paddle" not in workers["onnxruntime fp32"]["versions"]  # no Paddle thread pool in that process
    assert workers["paddle-cpu fp32"]["versions"]["paddle"] == paddle.__version__
    assert any(line.startswith("bs 1: paddle-cpu fp32 / onnxruntime fp32 = ") and "(median of 2 rounds; range " in line
               for line in r["notes"])
    # the default deployment: decided once per batch size before the rounds, then timed as the runtime it chose,
    # and compared round by round with the fastest of the runtimes run separately
    for bs in (1, 2):
        decision = r["auto_decisions"][str(bs)]
        assert decision["line"].startswith(f"backend auto: {decision['chosen']}, median ")
        assert decision["chosen"].split()[0] in ("paddle-cpu", "onnxruntime", "openvino")
        assert rows[("auto fp32", bs)]["engine"] in ("onednn", "paddle-openvino", "onnxruntime", "openvino")
        fastest = next(x for x in r["vs_fastest"] if x["runtime"] == "auto fp32" and x["batch_size"] == bs)
        separate = [n for n in ("paddle-cpu fp32", "onnxruntime fp32", "openvino fp32") if n in names]
        assert len(fastest["per_round"]) == 2 and fastest["fastest_of"] == separate
        assert fastest["reference"] == min(separate, key=lambda n: rows[(n, bs)]["round_median_ms"]["median"])
        assert rows[("auto fp32", bs)]["vs_fastest"] == pytest.approx(fastest["median"])
    if openvino:  # no Paddle thread pool in the OpenVINO worker either
        versions = workers["openvino fp32"]["versions"]
        assert "paddle" not in versions and "openvino" in versions


def test_profile_splits_each_batch_into_convolutions_other_kernels_and_the_rest(tmp_path):
    """``--profile``: one more worker per runtime splits a batch's time by kernel, from oneDNN's
    verbose log (Paddle) and onnxruntime's profiler; both must see every convolution of the model
    once per run, and the parts must add up to the profiled wall time."""
    pytest.importorskip("onnxruntime")
    import paddle
    from ppdlx.models import build_model
    report = tmp_path / "infer.json"
    proc = _tool("-c", "configs/demo/rn50_demo.yaml", "-o", "model.name=resnet18_bottleneck_tiny",
                 "model.num_classes=3", f"global.output_dir={tmp_path / 'out'}", "--resolution", "32",
                 "--batch-sizes", "1,2", "--rounds", "1", "--steps", "4", "--warmup", "2", "--threads", "1",
                 "--runtimes", "paddle-cpu fp32,onnxruntime fp32", "--profile", "--matmul-size", "0",
                 "--report", str(report))
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(report.read_text())
    # --matmul-size 0: no peak timed, no GFLOP/s columns
    assert r["matmul_peak"]["gflop_per_s"] is None and r["matmul_peak"]["before"] is None
    assert not any("gflop_per_s" in row for row in r["rows"])
    convs = sum(isinstance(layer, paddle.nn.Conv2D)
                for layer in build_model("resnet18_bottleneck_tiny", num_classes=3).sublayers())
    assert convs > 5
    assert set(r["profile"]) == {"paddle-cpu fp32", "onnxruntime fp32"}
    for name, per_bs in r["profile"].items():
        assert set(per_bs) == {"1", "2"}
        for split in per_bs.values():
            assert split["runs"] == 4
            assert split["convolutions_per_run"] == convs, (name, split)
            assert split["convolution_ms"] > 0 and split["kernels_per_run"] > convs  # pooling, matmul, ...
            assert split["wall_ms"] == pytest.approx(split["kernels_ms"] + split["outside_kernels_ms"])
            assert split["kernels_ms"] == pytest.approx(split["convolution_ms"] + sum(split["other_kernels_ms"].values()))
    assert r["profile"]["paddle-cpu fp32"]["1"]["tool"] == "oneDNN verbose log"
    assert r["profile"]["onnxruntime fp32"]["1"]["tool"] == "onnxruntime profiler"
    lines = [n for n in r["notes"] if n.startswith("profile bs 2: paddle-cpu fp32 ")]
    assert len(lines) == 1 and "convolutions / onnxruntime fp32's: " in lines[0]
    assert " without either profiler's cost" in lines[0]


def test_a_ratio_next_to_1_shows_which_side_it_is_on():
    from benchmarks.infer import ratio_text
    assert [ratio_text(x) for x in (1.0004, 0.9996, 1.0, 1.0123, 0.8861)] == ["1.0004", "0.9996", "1.000", "1.012",
                                                                              "0.886"]


def test_matmul_timing_of_an_unknown_library_is_refused_before_any_process():
    from benchmarks.matmul_peak import time_matmul
    with pytest.raises(ValueError, match="library 'blis': choose from numpy, torch"):
        time_matmul("blis", 1)


def test_convolution_ratio_bounds_take_out_each_profilers_cost():
    """The AMD EPYC run of docs/cpu_speed.md at bs 1: onnxruntime's profiled convolutions (59.46 ms)
    exceed its whole unprofiled batch (50.35 ms), so the profiled ratio 0.864 is no measure."""
    from benchmarks.infer import convolution_ratio_bounds
    paddle = {"wall_ms": 59.18, "convolution_ms": 51.36}
    ort = {"wall_ms": 60.96, "convolution_ms": 59.46}
    lo, hi = convolution_ratio_bounds(paddle, 55.68, ort, 50.35)
    assert lo == pytest.approx((51.36 - 3.50) / 50.35) and hi == pytest.approx(51.36 / (59.46 - 10.61))
    assert lo < 1.0 < hi and 51.36 / 59.46 < lo
    # a profiler that costs nothing leaves one number
    same = {"wall_ms": 10.0, "convolution_ms": 8.0}
    assert convolution_ratio_bounds(same, 10.0, {"wall_ms": 5.0, "convolution_ms": 4.0}, 5.0) == \
        pytest.approx((2.0, 2.0))


def test_onednn_log_lines_are_read_as_kind_implementation_and_time():
    log = ("onednn_verbose,v1,info,oneDNN v3.6.0\n"
           "onednn_verbose,v1,primitive,exec,cpu,convolution,brgconv_1x1:avx2,forward_inference,"
           "src:f32:a:blocked:acdb::f0 wei:f32:a:blocked:Acdb16a::f0 bia:f32::blocked:a::f0 "
           "dst:f32:a:blocked:acdb::f0,attr-post-ops:eltwise_relu,alg:convolution_direct,"
           "mb1_ic64oc64_ih56oh56kh1sh1dh0ph0_iw56ow56kw1sw1dw0pw0,0.28125\n"
           "onednn_verbose,v1,primitive,exec,cpu,reorder,simple:any,undef,src:f32::blocked:acdb::f0 "
           "dst:f32::blocked:acdb::f0,,,1x256x56x56,1.5\n"
           "run 3.2\n")
    kernels = D.kernel_profile.onednn_kernels(log)
    assert kernels == [("convolution", "brgconv_1x1:avx2", 0.28125), ("reorder", "simple:any", 1.5)]
    split = D.kernel_profile.split_time(kernels + kernels, [2.0, 4.0])
    assert split["convolution_ms"] == pytest.approx(0.28125) and split["other_kernels_ms"] == {"reorder": 1.5}
    assert split["outside_kernels_ms"] == pytest.approx(3.0 - 1.78125) and split["convolutions_per_run"] == 1
