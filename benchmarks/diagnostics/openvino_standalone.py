"""Diagnostic (docs/cpu_speed.md, Intel Xeon section): is the predictor's gap to onnxruntime Paddle's
OpenVINO engine or OpenVINO itself? Times one export three ways, each in its own process, alternated
round by round: onnxruntime and a standalone OpenVINO on ``inference.onnx``, Paddle Inference's
OpenVINO engine on ``inference.pdmodel``.

    python -m venv /tmp/ov && /tmp/ov/bin/pip install openvino==2025.0.0 numpy   # Paddle 3.3.1's OpenVINO
    python benchmarks/diagnostics/openvino_standalone.py --export-dir output/rn50_tf32/bench_infer \\
        --openvino-python /tmp/ov/bin/python --report benchmarks/results/<name>.json

Not a ``tools/benchmark.py`` runtime: OpenVINO's own package is not a ppdlx dependency.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

RUNTIMES = ("onnxruntime", "openvino", "paddle-openvino")


def session(runtime, export_dir, threads):
    if runtime == "openvino":
        import openvino as ov
        compiled = ov.Core().compile_model(os.path.join(export_dir, "inference.onnx"), "CPU", {
            "INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"})
        request = compiled.create_infer_request()
        return lambda x: request.infer({0: x})
    if runtime == "onnxruntime":
        import onnxruntime as ort
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        sess = ort.InferenceSession(os.path.join(export_dir, "inference.onnx"), options,
                                    providers=["CPUExecutionProvider"])
        name = sess.get_inputs()[0].name
        return lambda x: sess.run(None, {name: x})
    import paddle.inference as pi
    config = pi.Config(os.path.join(export_dir, "inference.pdmodel"), os.path.join(export_dir, "inference.pdiparams"))
    config.disable_gpu()
    config.disable_glog_info()
    config.set_cpu_math_library_num_threads(threads)
    config.enable_openvino_engine(pi.PrecisionType.Float32)
    config.set_optim_cache_dir(os.path.join(export_dir, "_openvino_cache"))
    predictor = pi.create_predictor(config)
    feed = predictor.get_input_handle(predictor.get_input_names()[0])
    fetch = predictor.get_output_handle(predictor.get_output_names()[0])

    def run(x):
        feed.reshape(x.shape)
        feed.copy_from_cpu(x)
        predictor.run()
        return fetch.copy_to_cpu()
    return run


def worker(args):
    run = session(args.worker, args.export_dir, args.threads)
    x = np.random.default_rng(0).random((args.batch_size, 3, args.size, args.size), dtype=np.float32)
    for _ in range(args.warmup):
        run(x)
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        run(x)
        times.append(time.perf_counter() - start)
    print(json.dumps({"median_ms": 1000.0 * float(np.median(times))}))


def driver(args):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from benchmarks.infer import load_deploy_module
    from ppdlx.cpu_features import cpu_features
    ratio_stats = load_deploy_module().ratio_stats  # the benchmarks' per-round ratios and their spread
    rows = []
    for batch_size in args.batch_sizes:
        medians = {r: [] for r in RUNTIMES}
        for round_index in range(args.rounds):
            order = RUNTIMES if round_index % 2 == 0 else RUNTIMES[::-1]
            for runtime in order:
                python = args.openvino_python if runtime == "openvino" else sys.executable
                argv = [python, os.path.abspath(__file__), "--worker", runtime, "--export-dir", args.export_dir,
                        "--batch-size", str(batch_size), "--threads", str(args.threads), "--steps", str(args.steps),
                        "--warmup", str(args.warmup), "--size", str(args.size)]
                out = subprocess.run(argv, capture_output=True, text=True, check=True,
                                     env={**os.environ, "PYTHONWARNINGS": "ignore"})
                medians[runtime].append(json.loads(out.stdout.strip().splitlines()[-1])["median_ms"])
        for runtime in RUNTIMES[1:]:
            ratio = ratio_stats(medians[runtime], medians["onnxruntime"])
            rows.append({"batch_size": batch_size, "runtime": runtime, "round_ms": medians[runtime],
                         "onnxruntime_round_ms": medians["onnxruntime"], "ratio_median": ratio["median"],
                         "ratio_min": ratio["min"], "ratio_max": ratio["max"]})
            print(f"bs {batch_size} {runtime} / onnxruntime: {ratio['median']:.3f} "
                  f"({ratio['min']:.3f}-{ratio['max']:.3f})")
    if args.report:
        with open(args.report, "w") as f:
            json.dump({"cpu": cpu_features(), "threads": args.threads, "rounds": args.rounds, "steps": args.steps,
                       "rows": rows}, f, indent=1)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--export-dir", required=True, help="a ppdlx export with inference.pdmodel and inference.onnx")
    p.add_argument("--openvino-python", default=sys.executable, help="a python with the openvino package")
    p.add_argument("--batch-sizes", type=lambda s: [int(v) for v in s.split(",")], default=[1, 8])
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--report")
    p.add_argument("--worker", choices=RUNTIMES)
    args = p.parse_args()
    worker(args) if args.worker else driver(args)


if __name__ == "__main__":
    main()
