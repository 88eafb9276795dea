"""Runners for cases that need more than one plain subprocess: a training killed with SIGKILL the
moment a checkpoint's temporary file appears (then resumed), and a second training started on the
output directory of one still running."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time

from .battery import SetupError, run_subprocess
from .faults import temporary_entries

# A checkpoint's temporary entries (not those of config.yaml or the figures written after the last save).
CHECKPOINT_ENTRY = re.compile(r"^(latest|best|epoch_\d+)\b")


class _Process:
    """A subprocess whose merged output is collected by a thread (so the caller can poll it)."""

    def __init__(self, argv, cwd):
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.lines = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    def saw(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))

    def finish(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._reader.join(timeout=10)
        return code


def kill_during_save(nth: int, arm_on: str = "epoch 2/"):
    """Run ``run.facts["first_argv"]``; once its output shows ``arm_on`` (the last epoch started, so the
    next save is the last one), SIGKILL it when the ``nth`` new temporary entry of a checkpoint appears in
    ``run.facts["out"]`` (entries are polled: one written faster than a poll is not counted, so ``nth``
    is a position among the entries seen); then run ``run.argv`` (the resume). ``run.facts["killed_while"]``
    records the entries seen."""
    def runner(ctx, run, timeout):
        out = run.facts["out"]
        started = time.time()
        first = _Process(run.facts["first_argv"], ctx.root)
        seen, armed = [], False
        while first.proc.poll() is None and time.time() - started < timeout:
            if not armed:
                armed = first.saw(arm_on)
                if armed:
                    before = set(temporary_entries(out))
            else:
                for name in temporary_entries(out):
                    if name not in before and name not in seen and CHECKPOINT_ENTRY.match(name):
                        seen.append(name)
                if len(seen) >= nth:
                    os.kill(first.proc.pid, signal.SIGKILL)
                    break
            time.sleep(0.0005)
        code = first.finish(max(1.0, timeout - (time.time() - started)))
        if code != -signal.SIGKILL:
            raise SetupError(f"the training ended (exit {code}) before its save's temporary entry #{nth} was seen "
                             f"(saw {seen}); the kill point was missed")
        run.facts["killed_while"] = seen
        left = sorted(n for n in os.listdir(out) if CHECKPOINT_ENTRY.match(n))
        result = run_subprocess(ctx, run, timeout)
        result.seconds = time.time() - started
        result.note = f"SIGKILL when {seen[-1]} appeared; the directory then held {', '.join(left)}; resumed"
        return result
    return runner


def second_training(ctx, run, timeout):
    """Start ``run.facts["first_argv"]``, and once it trains run ``run.argv`` on the same output directory;
    the first run's exit code goes to ``run.facts["first_code"]``."""
    started = time.time()
    first = _Process(run.facts["first_argv"], ctx.root)
    while first.proc.poll() is None and not first.saw("epoch 1/") and time.time() - started < timeout:
        time.sleep(0.05)
    if first.proc.poll() is not None:
        raise SetupError(f"the first training ended (exit {first.proc.returncode}) before it trained: "
                         f"{''.join(first.lines[-3:]).strip()}")
    result = run_subprocess(ctx, run, timeout)
    run.facts["first_code"] = first.finish(timeout)
    run.facts["first_tail"] = "".join(first.lines[-2:]).strip()
    result.note = f"the first training exited {run.facts['first_code']}"
    return result
