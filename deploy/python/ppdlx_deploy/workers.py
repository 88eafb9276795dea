"""Runtimes compared in separate worker processes, one fresh process per runtime and round, one
process at a time, alternated round by round (:func:`run_rounds`). This is the parent's side: it
starts ``python -c WORKER_CODE`` with a spec on stdin and reads one reply line; the child's side
(building the predictor, timing it) is :mod:`ppdlx_deploy.worker`, named here only in that code
string, so this module imports no runtime at all.

Why separate, fresh processes: after a run, the worker threads of OpenMP (Paddle's libiomp5
keeps spinning for KMP_BLOCKTIME), of onnxruntime (allow_spinning) and of OpenVINO's TBB
busy-wait for a while; a second runtime in the same process, or an idle persistent worker next to
it, loses cores to them. A process that has exited spins no more, and one runtime per process
measures what a service running that runtime alone gets. See docs/cpu_speed.md."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Callable, Dict, Optional

from .errors import DeployError
from .timing import alternating_order

WORKER_CODE = "from ppdlx_deploy.worker import main; main()"
REPLY_PREFIX = "PPDLX_DEPLOY_WORKER_REPLY "
# When set, every worker appends one JSON line (pid, label, backend) to this file: the record of
# which measurements ran (a cached decision starts none).
WORKER_LOG_ENV = "PPDLX_DEPLOY_WORKER_LOG"


class WorkerError(DeployError):
    """A worker exited without a reply: ``returncode`` is its exit code, ``line`` its last stderr line."""

    def __init__(self, message: str, returncode: int, line: str):
        super().__init__(message)
        self.returncode, self.line = returncode, line


def run_in_worker(spec: dict, env: Optional[Dict[str, Optional[str]]] = None, timeout: float = 3600) -> dict:
    """Run ``spec`` in a fresh Python process (this package on its path, no ppdlx needed) with
    ``env`` changed (a None value removes the variable) and return its reply."""
    child_env = dict(os.environ)
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    child_env["PYTHONPATH"] = os.pathsep.join([package_parent] + [p for p in [child_env.get("PYTHONPATH")] if p])
    for key, value in (env or {}).items():
        if value is None:
            child_env.pop(key, None)
        else:
            child_env[key] = str(value)
    try:
        proc = subprocess.run([sys.executable, "-c", WORKER_CODE], input=json.dumps(spec), capture_output=True,
                              text=True, env=child_env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise DeployError(f"benchmark worker {spec.get('label', spec['backend'])} ran longer than {timeout:.0f} s "
                          f"and was stopped") from None
    replies = [line for line in proc.stdout.splitlines() if line.startswith(REPLY_PREFIX)]
    if proc.returncode != 0 or not replies:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        last = lines[-1] if lines else "no output"
        raise WorkerError(f"benchmark worker {spec.get('label', spec['backend'])} exited with code {proc.returncode}: "
                          f"{last}", proc.returncode, last)
    return json.loads(replies[-1][len(REPLY_PREFIX):])


def run_rounds(specs: Dict[str, dict], rounds: int, env: Optional[Dict[str, dict]] = None,
               progress: Optional[Callable[[str], None]] = None) -> dict:
    """Each runtime of ``specs`` (name -> worker spec) once per round, each run in its own fresh
    process, one process at a time, in :func:`ppdlx_deploy.timing.alternating_order`. Returns
    ``{"order": [{"round", "position", "runtime", "pid", "wall_s"}], "replies": {name: [reply of
    round 0, 1, ...]}}``."""
    order, replies = [], {name: [] for name in specs}
    for r, names in enumerate(alternating_order(list(specs), rounds)):
        for position, name in enumerate(names):
            start = time.perf_counter()
            reply = run_in_worker(dict(specs[name], label=name), (env or {}).get(name))
            wall = time.perf_counter() - start
            replies[name].append(reply)
            order.append({"round": r, "position": position, "runtime": name, "pid": reply["pid"], "wall_s": wall})
            if progress:
                progress(f"round {r + 1}/{rounds}: {name} (pid {reply['pid']}, {wall:.0f} s)")
    return {"order": order, "replies": replies}
