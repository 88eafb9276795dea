"""Diagnostic (docs/cpu_speed.md): what each step of ppdlx's CPU training plan for a ResNet50 buys
over the plan before it, on this CPU. Each case trains ResNet50 (NHWC, ppdlx's oneDNN kernels,
momentum SGD, random data) in its own process, alternated round by round; reported: img/s per round
and the per-round ratios of each pair below.

* ``float32``: the trainer's float32 plan; ``float32-paddle-add-relu``: the same with each block's
  residual add and ReLU on Paddle's kernels (the plan before the fused oneDNN add + ReLU).
* ``bf16-activations``: the trainer's bf16 plan; ``bf16-paddle-sum``: the same with Paddle summing
  the two gradients of each block's input (the plan before ``onednn.fork``);
  ``bf16-convolutions``: bf16 convolutions on float32 tensors (the plan before bf16 activations).

    python benchmarks/diagnostics/residual_steps.py --size 128 --rounds 4 \\
        --report benchmarks/results/diag_residual_steps_128px_<cpu>.json

Not a ``tools/benchmark.py`` case: the earlier plans are kept here only to measure the steps from them.
"""
import argparse
import json
import os
import subprocess
import sys
import time

CASES = ("float32", "float32-paddle-add-relu", "bf16-activations", "bf16-paddle-sum", "bf16-convolutions")
PAIRS = (("float32", "float32-paddle-add-relu"), ("bf16-activations", "bf16-paddle-sum"),
         ("bf16-paddle-sum", "bf16-convolutions"), ("bf16-activations", "float32"))


def _earlier_plan(model, case):
    """Undo the plan's latest step where ``case`` asks for the plan before it."""
    import ppdlx.models.resnet_bf16 as activations
    from ppdlx.ops import onednn
    if case == "float32-paddle-add-relu":
        for block in [b for stage in model.stages for b in stage]:
            block.cpu_kernel = None  # Paddle's add and ReLU
    elif case == "bf16-convolutions":
        model.bf16_activations = False  # the float32 forward: bf16 convolutions on float32 tensors
    elif case == "bf16-paddle-sum":
        def bottleneck(block, x, bf16=True):  # the block's input read twice: Paddle sums its gradients
            identity = x if block.shortcut is None else activations.conv_norm(block.shortcut, x, bf16)
            y = activations.conv_norm(block.conv1, x, bf16)
            return onednn.add_relu(activations.conv_norm(block.conv3, activations.conv_norm(block.conv2, y)),
                                   identity)
        activations.bottleneck = bottleneck


def worker(args):
    import numpy as np
    import paddle

    from ppdlx.layers import layer_config
    from ppdlx.models import build_model
    paddle.seed(0)
    with layer_config(cpu_kernels=True, bf16=args.worker.startswith("bf16")):
        model = build_model("resnet50", num_classes=1000, data_format="NHWC")
    _earlier_plan(model, args.worker)
    model.train()
    optimizer = paddle.optimizer.Momentum(0.01, parameters=model.parameters())
    x = paddle.randn([args.batch_size, args.size, args.size, 3])
    labels = paddle.randint(0, 1000, [args.batch_size])

    def step():
        loss = paddle.nn.functional.cross_entropy(model(x), labels)
        loss.backward()
        optimizer.step()
        optimizer.clear_grad(set_to_zero=False)  # as the trainer does
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
    from benchmarks.infer import load_deploy_module
    from ppdlx.cpu_features import cpu_features
    ratio_stats = load_deploy_module().ratio_stats  # the benchmarks' per-round ratios and their spread
    cases = [c for c in CASES if c in args.cases.split(",")]
    per_round = {case: [] for case in cases}
    for round_index in range(args.rounds):
        for case in cases if round_index % 2 == 0 else cases[::-1]:
            argv = [sys.executable, os.path.abspath(__file__), "--worker", case, "--size", str(args.size),
                    "--batch-size", str(args.batch_size), "--steps", str(args.steps), "--warmup", str(args.warmup)]
            env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
            out = subprocess.run(argv, capture_output=True, text=True, env=env, check=True).stdout
            per_round[case].append(json.loads(out.strip().splitlines()[-1])["images_per_s"])
            print(f"round {round_index} {case}: {per_round[case][-1]:.2f} img/s", flush=True)
    ratios = {f"{a} / {b}": ratio_stats(per_round[a], per_round[b]) for a, b in PAIRS if a in cases and b in cases}
    report = {"cpu": cpu_features(), "size": args.size, "batch_size": args.batch_size, "threads": args.threads,
              "steps": args.steps, "rounds": args.rounds, "images_per_s_per_round": per_round, "ratios": ratios}
    for name, r in ratios.items():
        print(f"{name}: {r['median']:.3f} (range {r['min']:.3f}-{r['max']:.3f})")
    if args.report:
        with open(args.report, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=CASES)
    parser.add_argument("--cases", default=",".join(CASES), help="comma list of " + ", ".join(CASES))
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--report")
    args = parser.parse_args()
    unknown = set(args.cases.split(",")) - set(CASES)
    if unknown:
        parser.error(f"--cases {args.cases}: unknown {', '.join(sorted(unknown))}; choose from {', '.join(CASES)}")
    worker(args) if args.worker else driver(args)


if __name__ == "__main__":
    main()
