"""PyTorch ResNet50 v1.5 training next to ppdlx (``tools/benchmark.py train --compare-torch``).

PyTorch is an optional, benchmark-only dependency (``pip install torch==2.13.0`` gives the
CPU build). The network is written here, layer for layer like ``ppdlx.models.resnet``
(stride on the 3x3 conv), so no torchvision is needed. Same batch, same threads, fp32 and
bf16 autocast (channels-last where asked).

PyTorch runs in its own worker process, driven round by round between the ppdlx rounds: two
OpenMP runtimes in one process compete for the cores (PyTorch measured several times slower
in-process next to Paddle on 2 cores than alone).
"""
from __future__ import annotations

import json
import subprocess
import sys
import time

from benchmarks import worker_env

VARIANTS = {  # case name -> (autocast dtype, channels_last)
    "torch eager float32": ("float32", False),
    "torch eager float32 channels_last": ("float32", True),
    "torch eager bfloat16 channels_last": ("bfloat16", True),
}


def _torch_resnet50(num_classes):
    import torch.nn as nn

    def cbr(cin, cout, k, s=1, act=True):
        layers = [nn.Conv2d(cin, cout, k, s, (k - 1) // 2, bias=False), nn.BatchNorm2d(cout)]
        return nn.Sequential(*layers, nn.ReLU(inplace=True)) if act else nn.Sequential(*layers)

    class Bottleneck(nn.Module):
        def __init__(self, cin, width, stride):
            super().__init__()
            out = width * 4
            self.body = nn.Sequential(cbr(cin, width, 1), cbr(width, width, 3, stride), cbr(width, out, 1, act=False))
            self.short = cbr(cin, out, 1, stride, act=False) if stride != 1 or cin != out else nn.Identity()
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            return self.relu(self.body(x) + self.short(x))

    blocks, cin = [], 64
    for i, (depth, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512))):
        for j in range(depth):
            blocks.append(Bottleneck(cin, width, 2 if i > 0 and j == 0 else 1))
            cin = width * 4
    return nn.Sequential(cbr(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1), *blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(2048, num_classes))


def _make_step(batch, size, num_classes, dtype, channels_last):
    import torch
    torch.manual_seed(0)
    model = _torch_resnet50(num_classes).train()
    x = torch.randn(batch, 3, size, size)
    y = torch.randint(0, num_classes, (batch,))
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.875, weight_decay=1 / 32768)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def _worker(batch, size, num_classes, threads):
    """stdin: one JSON ``{"case", "steps"}`` per line; stdout: ``{"seconds"}`` per line."""
    import torch
    torch.set_num_threads(threads)
    steps_of = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["case"] not in steps_of:
            steps_of[cmd["case"]] = _make_step(batch, size, num_classes, *VARIANTS[cmd["case"]])
        step = steps_of[cmd["case"]]
        start = time.perf_counter()
        for _ in range(cmd["steps"]):
            step()
        print(json.dumps({"seconds": time.perf_counter() - start, "threads": torch.get_num_threads(),
                          "torch": torch.__version__}), flush=True)


class TorchWorker:
    """A PyTorch process that runs the measured steps of one variant on request."""

    def __init__(self, batch, size, num_classes, threads):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.torch_compare", str(batch), str(size), str(num_classes),
             str(threads)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=worker_env())
        self.facts = {}

    def run(self, case, steps) -> float:
        self.proc.stdin.write(json.dumps({"case": case, "steps": steps}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the PyTorch worker exited with code {self.proc.wait()}")
        reply = json.loads(line)
        self.facts = {"torch": reply["torch"], "torch_threads": reply["threads"]}
        return reply["seconds"]

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


class TorchCase:
    """One variant as a runner for the interleaved rounds of ``benchmarks.train.measure``;
    ``run`` returns the worker's own timing of the steps."""

    def __init__(self, worker, case, steps_scale=1.0):
        self.worker, self.case, self.steps_scale = worker, case, steps_scale

    def run(self, steps):
        return self.worker.run(self.case, steps)


def torch_available() -> bool:
    import importlib.util
    return importlib.util.find_spec("torch") is not None


if __name__ == "__main__":
    _worker(*(int(a) for a in sys.argv[1:5]))
