"""Diagnostic (docs/cpu_speed.md, bf16 training): what bf16 activations between a ResNet50's layers
buy over bf16 convolutions on float32 tensors, next to float32, on this CPU. Each case trains
ResNet50 (NHWC, ppdlx's oneDNN kernels, momentum SGD, random data) in its own process, alternated
round by round; reported: img/s per round and the per-round ratios.

    python benchmarks/diagnostics/bf16_activations.py --size 128 --rounds 4 \\
        --report benchmarks/results/diag_bf16_activations_128px_<cpu>.json

Not a ``tools/benchmark.py`` case: the "bf16 convolutions only" case is the trainer's previous
plan, kept here only to measure the step from it.
"""
import argparse
import json
import os
import subprocess
import sys
import time

CASES = ("bf16-activations", "bf16-convolutions", "float32")


def worker(args):
    import numpy as np
    import paddle

    from ppdlx.engine.cpu_kernels import switch_to_fast_kernels
    from ppdlx.models import build_model
    paddle.seed(0)
    model = build_model("resnet50", num_classes=1000, data_format="NHWC")
    switch_to_fast_kernels(model, bf16=args.worker != "float32")
    if args.worker == "bf16-convolutions":
        del model.forward_features  # the class's forward: bf16 convolutions on float32 tensors
    model.train()
    optimizer = paddle.optimizer.Momentum(0.01, parameters=model.parameters())
    x = paddle.randn([args.batch_size, args.size, args.size, 3])
    labels = paddle.randint(0, 1000, [args.batch_size])

    def step():
        loss = paddle.nn.functional.cross_entropy(model(x), labels)
        loss.backward()
        optimizer.step()
        optimizer.clear_grad()
        return float(loss)
    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    print(json.dumps({"images_per_s": args.batch_size / float(np.median(times))}))


def driver(args):
    from ppdlx.benchmarks.infer import load_deploy_module
    from ppdlx.cpu_features import cpu_features
    ratio_stats = load_deploy_module().ratio_stats  # the benchmarks' per-round ratios and their spread
    per_round = {case: [] for case in CASES}
    for round_index in range(args.rounds):
        for case in CASES if round_index % 2 == 0 else CASES[::-1]:
            argv = [sys.executable, os.path.abspath(__file__), "--worker", case, "--size", str(args.size),
                    "--batch-size", str(args.batch_size), "--steps", str(args.steps), "--warmup", str(args.warmup)]
            env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
            out = subprocess.run(argv, capture_output=True, text=True, env=env, check=True).stdout
            per_round[case].append(json.loads(out.strip().splitlines()[-1])["images_per_s"])
            print(f"round {round_index} {case}: {per_round[case][-1]:.2f} img/s", flush=True)

    def ratio(a, b):
        return ratio_stats(per_round[a], per_round[b])
    report = {"cpu": cpu_features(), "size": args.size, "batch_size": args.batch_size, "threads": args.threads,
              "steps": args.steps, "rounds": args.rounds, "images_per_s_per_round": per_round,
              "ratios": {"bf16-activations / bf16-convolutions": ratio("bf16-activations", "bf16-convolutions"),
                         "bf16-activations / float32": ratio("bf16-activations", "float32"),
                         "bf16-convolutions / float32": ratio("bf16-convolutions", "float32")}}
    for name, r in report["ratios"].items():
        print(f"{name}: {r['median']:.3f} (range {r['min']:.3f}-{r['max']:.3f})")
    if args.report:
        with open(args.report, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=CASES)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--report")
    args = parser.parse_args()
    worker(args) if args.worker else driver(args)


if __name__ == "__main__":
    main()
