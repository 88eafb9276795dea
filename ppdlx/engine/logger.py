"""Progress lines on stdout, the same records as JSON lines, VisualDL when installed."""
from __future__ import annotations

import json
import logging
import os
import sys
import time


def setup_logging(rank: int = 0) -> None:
    """Plain message lines on stdout for the ``ppdlx`` loggers (warnings only on ranks > 0)."""
    logger = logging.getLogger("ppdlx")
    logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    if not any(getattr(h, "_ppdlx", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler._ppdlx = True
        logger.addHandler(handler)
    # paddle.distributed installs its own root handler; propagating would print every line twice
    logger.propagate = False


class MetricLogger:
    """Writes ``<output_dir>/metrics.jsonl`` on rank 0 and mirrors scalars to VisualDL."""

    def __init__(self, output_dir: str, rank: int = 0):
        self.rank = rank
        self.path = os.path.join(output_dir, "metrics.jsonl")
        self.log = logging.getLogger("ppdlx")
        self._vdl = None
        if rank == 0:
            os.makedirs(output_dir, exist_ok=True)
            try:
                from visualdl import LogWriter  # optional: VisualDL scalars only when it is installed
                self._vdl = LogWriter(logdir=os.path.join(output_dir, "vdl"))
            except ImportError:
                pass

    def record(self, kind: str, line: str, step: int, **values) -> None:
        if self.rank != 0:
            return
        self.log.info(line)
        entry = {"kind": kind, "time": round(time.time(), 3), "step": step, **values}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")
        if self._vdl is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)):
                    self._vdl.add_scalar(f"{kind}/{key}", value, step)

    def close(self):
        if self._vdl is not None:
            self._vdl.close()


def format_eta(seconds: float) -> str:
    seconds = int(max(0, seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h:d}:{m:02d}:{s:02d}"
