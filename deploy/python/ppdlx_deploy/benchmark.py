"""One predictor timed in this process (``infer.py --benchmark``): per-batch network latency (true
percentiles, warm-up excluded) with host pre/post-processing timed apart, as rows and a table.
Runtimes compared with each other run in separate processes instead (:mod:`ppdlx_deploy.workers`)."""
from __future__ import annotations

import time
from typing import Dict, List, Sequence

from .postprocess import postprocess
from .preprocess import Preprocessor
from .timing import latency_stats, synthetic_feeds, time_networks


def benchmark(predictors: Dict[str, object], meta: dict, images: Sequence[str], batch_sizes: Sequence[int],
              warmup: int, repeats: int, synthetic: bool = False) -> List[dict]:
    """Rows per (case, batch size): network throughput and latency (true percentiles, warm-up
    excluded), with host pre-processing (decode + resize + normalise) and post-processing
    (softmax + top-k, or reading detections) timed separately."""
    prep = Preprocessor(meta)
    rows = []
    for bs in batch_sizes:
        pre_times, feeds = [], None
        if synthetic or not images:
            feeds = synthetic_feeds(meta, bs)
        else:
            paths = [images[i % len(images)] for i in range(bs)]
            for _ in range(max(3, min(repeats, 20))):
                start = time.perf_counter()
                feeds = prep.feeds_from_files(paths)
                pre_times.append(time.perf_counter() - start)
        times = time_networks(predictors, feeds, warmup, repeats)
        for case, predictor in predictors.items():
            outputs = predictor.run(feeds)
            post_times = []
            for _ in range(max(3, min(repeats, 20))):
                start = time.perf_counter()
                postprocess(meta, outputs)
                post_times.append(time.perf_counter() - start)
            lat = latency_stats(times[case])
            row = {"case": case, "engine": predictor.plan.get("engine"),
                   "cpu_variant": predictor.plan.get("cpu_variant"),
                   "batch_size": int(bs), "images_per_s": bs * 1000.0 / lat["mean"],
                   "latency_ms": lat, "repeats": int(repeats), "warmup": int(warmup),
                   "host_postprocess_ms": latency_stats(post_times)}
            if pre_times:
                row["host_preprocess_ms"] = latency_stats(pre_times)
                total = lat["mean"] + row["host_preprocess_ms"]["mean"] + row["host_postprocess_ms"]["mean"]
                row["end_to_end_images_per_s"] = bs * 1000.0 / total
            rows.append(row)
    return rows


def format_rows(rows: Sequence[dict]) -> str:
    """A table like the anchor's README: BS | img/s | avg | p50 | p90 | p95 | p99 (ms) + host,
    with the case and the engine that ran it."""
    header = ["case", "engine", "BS", "img/s", "avg ms", "p50", "p90", "p95", "p99", "pre ms", "post ms"]
    lines = []
    for r in rows:
        lat = r["latency_ms"]
        pre = r.get("host_preprocess_ms", {}).get("mean")
        lines.append([r["case"], str(r.get("engine") or "-"), str(r["batch_size"]), f"{r['images_per_s']:.2f}",
                      f"{lat['mean']:.2f}", f"{lat['p50']:.2f}", f"{lat['p90']:.2f}", f"{lat['p95']:.2f}",
                      f"{lat['p99']:.2f}", "-" if pre is None else f"{pre:.2f}",
                      f"{r['host_postprocess_ms']['mean']:.3f}"])
    widths = [max(len(h), *(len(l[i]) for l in lines)) if lines else len(h) for i, h in enumerate(header)]
    out = [" | ".join(h.ljust(w) for h, w in zip(header, widths)), "-+-".join("-" * w for w in widths)]
    out += [" | ".join(c.ljust(w) for c, w in zip(l, widths)) for l in lines]
    return "\n".join(out)
