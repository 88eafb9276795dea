"""Closed-loop load on a served model: ``concurrency`` clients, each sending one image file per request
and the next as soon as the answer is back, for a fixed number of requests. Measures what a user of
the service sees: throughput (answered images per second of wall time) and per-request latency
percentiles (``numpy.percentile``: true percentiles), over HTTP or gRPC."""
from __future__ import annotations

import threading
import time
from typing import Dict, List, Sequence

import numpy as np

from ppdlx_deploy.errors import DeployError

from .client import ServedModel

PERCENTILES = (50, 90, 95, 99)


def latency_summary(latencies_ms: Sequence[float]) -> Dict[str, float]:
    values = np.asarray(latencies_ms, np.float64)
    summary = {f"p{p}": float(np.percentile(values, p)) for p in PERCENTILES}
    summary["mean"] = float(values.mean())
    return summary


def closed_loop(url: str, protocol: str, model: str, files: Sequence[bytes], concurrency: int, requests: int,
                warmup: int = 1) -> dict:
    """``requests`` timed requests spread over ``concurrency`` clients (file ``i % len(files)`` for the
    i-th), after ``warmup`` untimed requests per client. Every answer must come back: a failed request
    is an error naming it, not a shorter measurement."""
    if concurrency < 1 or requests < concurrency:
        raise DeployError(f"closed loop: need 1 <= concurrency ({concurrency}) <= requests ({requests})")
    clients = [ServedModel(url, protocol, model) for _ in range(concurrency)]
    latencies: List[List[float]] = [[] for _ in range(concurrency)]
    errors: List[str] = []
    start_line = threading.Barrier(concurrency + 1)

    def client(index: int) -> None:
        served = clients[index]
        try:
            for i in range(warmup):
                served.infer_arrays([files[(index + i) % len(files)]])
        except Exception as err:  # noqa: BLE001  (reported below, with the others)
            errors.append(f"client {index} warm-up: {err}")
        start_line.wait()
        for i in range(index, requests, concurrency):
            begin = time.perf_counter()
            try:
                served.infer_arrays([files[i % len(files)]])
            except Exception as err:  # noqa: BLE001
                errors.append(f"request {i}: {err}")
                return
            latencies[index].append((time.perf_counter() - begin) * 1000.0)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(concurrency)]
    for t in threads:
        t.start()
    start_line.wait()
    began = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - began
    for served in clients:
        served.close()
    if errors:
        raise DeployError(f"{len(errors)} request(s) failed, first: {errors[0]}")
    flat = [v for per_client in latencies for v in per_client]
    return {"concurrency": concurrency, "requests": len(flat), "seconds": wall, "images_per_s": len(flat) / wall,
            "latency_ms": latency_summary(flat)}
