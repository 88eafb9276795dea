"""Timing and its statistics, shared by the in-process benchmark (:mod:`.benchmark`), the runtime
comparisons in worker processes (:mod:`.workers`) and the measured choices (:mod:`.tuning`):
per-batch network times, TRUE percentiles (``numpy.percentile``, not trimmed means), the order of
alternated rounds, and per-round ratios summarised by their median and spread. numpy only."""
from __future__ import annotations

import time
from typing import Dict, List, Sequence

import numpy as np

from .errors import DeployError

def latency_stats(seconds: Sequence[float]) -> dict:
    """mean and TRUE percentiles (numpy.percentile, linear) of per-batch times, in ms."""
    ms = np.asarray(seconds, np.float64) * 1000.0
    p50, p90, p95, p99 = np.percentile(ms, [50, 90, 95, 99])
    return {"mean": float(ms.mean()), "p50": float(p50), "p90": float(p90), "p95": float(p95), "p99": float(p99)}


def time_networks(predictors: Dict[str, object], feeds: Dict[str, np.ndarray], warmup: int, repeats: int) -> dict:
    """Per-batch network times (host->device copy, run, device->host copy) for each predictor.
    With several predictors the repeats are interleaved (A, B, A, B, ...) so that load from other
    processes hits every case alike; warm-up runs are not timed."""
    for predictor in predictors.values():
        for _ in range(warmup):
            predictor.run(feeds)
    times = {case: [] for case in predictors}
    for _ in range(repeats):
        for case, predictor in predictors.items():
            start = time.perf_counter()
            predictor.run(feeds)
            times[case].append(time.perf_counter() - start)
    return times


def synthetic_feeds(meta: dict, batch_size: int) -> Dict[str, np.ndarray]:
    """Random network inputs of ``batch_size`` (a fixed seed per batch size: every runtime and
    every worker process gets the same batch)."""
    rng = np.random.default_rng(batch_size)
    feeds = {}
    for spec in meta["inputs"]:
        shape = [batch_size] + list(spec["shape"][1:])
        feeds[spec["name"]] = (np.ones(shape, np.float32) if spec.get("role") == "scale"
                               else rng.standard_normal(shape).astype(np.float32))
    return feeds


def alternating_order(names: Sequence[str], rounds: int) -> List[List[str]]:
    """The order of the runtimes in each round: as given in even rounds, reversed in odd ones, so
    that no runtime always runs first or always follows the same one."""
    return [list(names) if r % 2 == 0 else list(reversed(names)) for r in range(rounds)]


def spread(values: Sequence[float]) -> dict:
    """median, quartiles (numpy.percentile, linear) and range of ``values``."""
    v = np.asarray(values, np.float64)
    q1, median, q3 = np.percentile(v, [25, 50, 75])
    return {"median": float(median), "q1": float(q1), "q3": float(q3), "min": float(v.min()), "max": float(v.max()),
            "n": int(v.size)}


def round_medians_ms(replies: Sequence[dict], batch_size: int) -> List[float]:
    """The median batch latency (ms) of each round's worker at ``batch_size``."""
    return [float(np.median(reply["times_s"][str(batch_size)])) * 1000.0 for reply in replies]


def ratio_stats(numerator_ms: Sequence[float], denominator_ms: Sequence[float]) -> dict:
    """Per-round latency ratios (round r of one runtime over round r of the other) and their
    :func:`spread`: ratios within a round share that round's machine state."""
    if len(numerator_ms) != len(denominator_ms) or not numerator_ms:
        raise DeployError("ratio_stats: the two runtimes need the same, non-zero number of rounds")
    per_round = [a / b for a, b in zip(numerator_ms, denominator_ms)]
    return {"per_round": per_round, **spread(per_round)}


def summarize_rounds(replies: Dict[str, List[dict]], batch_sizes: Sequence[int],
                     pairs: Sequence[tuple]) -> dict:
    """Per runtime and batch size: the median latency over all timed batches of all rounds and
    the per-round medians; per ``(runtime, reference)`` pair and batch size: :func:`ratio_stats`
    of the per-round medians; and the largest difference of each runtime's first output from
    the reference's (round 0)."""
    runtimes, ratios = {}, []
    for name, rounds in replies.items():
        for bs in batch_sizes:
            pooled = np.concatenate([np.asarray(r["times_s"][str(bs)], np.float64) for r in rounds]) * 1000.0
            runtimes[(name, bs)] = {"median_ms": float(np.median(pooled)), "batches": int(pooled.size),
                                    "round_median_ms": spread(round_medians_ms(rounds, bs))}
    for name, reference in pairs:
        for bs in batch_sizes:
            stats = ratio_stats(round_medians_ms(replies[name], bs), round_medians_ms(replies[reference], bs))
            a = np.asarray(replies[name][0]["outputs"][str(bs)])
            b = np.asarray(replies[reference][0]["outputs"][str(bs)])
            ratios.append({"runtime": name, "reference": reference, "batch_size": int(bs), **stats,
                           "output_max_abs_diff": float(np.abs(a - b).max()) if a.shape == b.shape else None})
    return {"runtimes": runtimes, "ratios": ratios}
