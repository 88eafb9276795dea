"""Benchmarks behind ``tools/benchmark.py <kind>``.

Each kind is a module here exposing ``add_arguments(parser)`` and
``run(args) -> {"rows": [...], ...}``; the CLI adds ``machine`` facts, prints a
table and writes the JSON report. Ratios are measured within one run because
this kind of machine is noisy.
"""
from __future__ import annotations

import os
import platform

KINDS = {
    "train": "ppdlx.benchmarks.train",
    "loader": "ppdlx.benchmarks.loader",
    "infer": "ppdlx.benchmarks.infer",
    "profile": "ppdlx.benchmarks.profile",
}


def machine_facts() -> dict:
    import paddle
    facts = {"platform": platform.platform(), "python": platform.python_version(), "cpu_count": os.cpu_count(),
             "paddle": paddle.__version__, "cuda": paddle.is_compiled_with_cuda(),
             "MKL_DEBUG_CPU_TYPE": os.environ.get("MKL_DEBUG_CPU_TYPE")}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    facts["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return facts


def format_table(rows) -> str:
    if not rows:
        return "(no rows)"
    keys = []
    for row in rows:
        for k in row:
            if k not in keys and not isinstance(row[k], (dict, list)):
                keys.append(k)
    cells = [[_fmt(row.get(k, "")) for k in keys] for row in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    lines = ["  ".join(k.ljust(w) for k, w in zip(keys, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(cell, widths)) for cell in cells]
    return "\n".join(lines)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}"
    return str(v)
