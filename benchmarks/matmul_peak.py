"""The float32 arithmetic rate this CPU delivers, as a yardstick for a model's speed figure.

A runtime's latency on a model says how it compares with another runtime; its GFLOP/s over the
best rate a large float32 matrix product reaches on the same cores says how much any float32
runtime could still gain. A share near 1 means the convolutions already run at the machine's
matrix-product speed: only fewer operations (another algorithm) or narrower numbers (bf16, int8)
go further. The product is timed by libraries outside the compared runtimes (numpy's BLAS, and
PyTorch where it is installed), each in its own fresh process limited to the benchmark's threads;
the fastest is the peak.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

# Large enough that packing and thread start-up are lost in a product (at 2048 the rate still
# varied with the library and the run).
DEFAULT_SIZE = 4096
LIBRARIES = ("numpy", "torch")

# Runs in a child with only the library under test imported. argv: library, size, repeats, threads.
WORKER_CODE = r"""
import json, sys, time
library, size, repeats, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
if library == "numpy":
    import numpy as np
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((size, size), dtype=np.float32) for _ in range(2))
    product = lambda: a @ b
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    detail = f"numpy {np.__version__}, {blas.get('name')} {blas.get('version')}"
else:
    import torch
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(size, size, generator=gen) for _ in range(2))
    product = lambda: torch.mm(a, b)
    detail = f"torch {torch.__version__}, mkldnn {torch.backends.mkldnn.is_available()}"
for _ in range(2):
    product()
times = []
for _ in range(repeats):
    start = time.perf_counter()
    product()
    times.append(time.perf_counter() - start)
times.sort()
median = times[len(times) // 2]
print(json.dumps({"library": library, "detail": detail, "size": size, "threads": threads,
                  "median_ms": median * 1e3, "gflop_per_s": 2.0 * size ** 3 / median / 1e9}))
"""


def time_matmul(library: str, threads: int, size: int = DEFAULT_SIZE, repeats: int = 5, timeout: float = 600) -> dict:
    """One fresh process times ``repeats`` float32 ``size`` x ``size`` products with ``library``
    on ``threads`` threads; returns its reply (``gflop_per_s`` from the median product)."""
    if library not in LIBRARIES:
        raise ValueError(f"matmul timing: library {library!r}: choose from {', '.join(LIBRARIES)}")
    child_env = dict(os.environ)
    for key in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        child_env[key] = str(threads)
    proc = subprocess.run([sys.executable, "-c", WORKER_CODE, library, str(size), str(repeats), str(threads)],
                          capture_output=True, text=True, env=child_env, timeout=timeout)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"matmul timing with {library} exited with code {proc.returncode}: {last}")
    return json.loads(proc.stdout.strip().splitlines()[-1])  # the worker's last line is its reply


def matmul_peak(threads: int, size: int = DEFAULT_SIZE, repeats: int = 5) -> dict:
    """``{"gflop_per_s": best rate, "by": library of that rate, "timings": [...]}`` over the
    :data:`LIBRARIES` installed here."""
    timings = [time_matmul(lib, threads, size, repeats) for lib in LIBRARIES if importlib.util.find_spec(lib)]
    if not timings:
        raise RuntimeError(f"no BLAS library to time a matrix product with: install one of {', '.join(LIBRARIES)}")
    best = max(timings, key=lambda t: t["gflop_per_s"])
    return {"gflop_per_s": best["gflop_per_s"], "by": best["library"], "timings": timings}


def model_gflop_per_image(model, resolution: int, data_format: str = "NCHW") -> float:
    """2 x the multiply-accumulates of the model's convolutions and linear layers, per image
    (:func:`ppdlx.models.info.model_info`'s convention), in GFLOP."""
    from ppdlx.models.info import model_info
    return 2.0 * model_info(model, resolution, data_format)["macs"] / 1e9


def achieved_gflop_per_s(gflop_per_image: float, batch_size: int, median_ms: float) -> float:
    return gflop_per_image * batch_size / (median_ms / 1000.0)
