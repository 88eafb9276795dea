"""PyTorch ResNet50 v1.5 training next to ppdlx (``tools/benchmark.py train --compare-torch``).

PyTorch is an optional, benchmark-only dependency (``pip install torch==2.13.0`` gives the
CPU build). The network is written here, layer for layer like ``ppdlx.models.resnet``
(stride on the 3x3 conv), so no torchvision is needed. Same batch, same threads, fp32 and
bf16 autocast (channels-last where asked).
"""
from __future__ import annotations

import time


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


def _measure_torch(batch, size, num_classes, steps, warmup, threads, dtype, channels_last):
    import torch
    torch.set_num_threads(threads)
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

    for _ in range(warmup):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return steps * batch / (time.perf_counter() - start)


def torch_rows(cfg, steps, warmup):
    try:
        import torch  # noqa: F401
    except ImportError:
        return [{"case": "torch", "images_per_s": float("nan"), "note": "pip install torch==2.13.0 to compare"}]
    import os
    threads = cfg.global_.cpu_threads or os.cpu_count()
    batch, size = cfg.data.batch_size, cfg.data.transforms.crop_size
    rows = []
    for dtype, channels_last in (("float32", False), ("float32", True), ("bfloat16", True)):
        ips = _measure_torch(batch, size, cfg.model.num_classes, steps, warmup, threads, dtype, channels_last)
        rows.append({"case": f"torch eager {dtype}{' channels_last' if channels_last else ''}",
                     "images_per_s": ips, "batch_size": batch, "steps": steps})
    return rows
