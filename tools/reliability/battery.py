"""The machinery of the fault battery: a case creates one fault or bad input in its own directory,
runs a real CLI on it in a subprocess with a time limit, and is judged by explicit checks.

Verdicts (:func:`judge`), in this order:

* ``DATA-LOSS``: a file the case protected (a good checkpoint, a good export) changed or vanished;
* ``SILENT``: exit 0 while the case's own check of the outputs says the result is wrong (or, for a
  case that must be refused, exit 0 at all, unless its check accepts a named warning);
* ``WEAK``: non-zero exit with a traceback, no line naming what the case says it must name (the
  file, key or value), no fix in that line, a time-out, a kill by a signal, or a refusal where the
  case expects success;
* ``GOOD``: everything else: a refusal in one line naming the culprit and a fix, or a success whose
  outputs the case checked.

A case whose fault could not be set up (e.g. a fixture failed) is ``SETUP`` and counted apart.
"""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

GOOD, WEAK, SILENT, DATA_LOSS, SETUP = "GOOD", "WEAK", "SILENT", "DATA-LOSS", "SETUP"
VERDICTS = (GOOD, WEAK, SILENT, DATA_LOSS)

# Lines that are never the message: library warnings, glog lines, the warnings module's echo.
_NOISE = re.compile(r"(UserWarning|DeprecationWarning|FutureWarning|RuntimeWarning|warnings\.warn\(|No ccache found|"
                    r"^[WIE]\d{4} \d\d:\d\d|^\s*$|^\s+\^+\s*$)")
# A line that tells the user what to do about it.
FIX_HINT = re.compile(r"\b(use|set|give|run|re-?export|re-?run|re-?train|re-?create|delete|remove|rename|pass|add|"
                      r"start|export|lower|free|choose|fix|try|make|move|convert|replace|install|keep|point|put|"
                      r"write|copy|restore|check|resume|did you mean|expected|must|should|needs?|only)\b", re.I)
TRACEBACK = "Traceback (most recent call last)"


class SetupError(Exception):
    """The case could not create its fault (not a verdict on ppdlx)."""


@dataclass
class Run:
    """What a case's ``prepare`` returns: the command and what the outcome is judged by."""
    argv: List[str]
    mentions: Sequence[str] = ()          # substrings the error line must contain (case-insensitive)
    protect: Sequence[str] = ()           # files that must come out unchanged
    description: str = ""                 # what was done, when it depends on the set-up (else Case.what)
    facts: dict = field(default_factory=dict)
    env: Optional[Dict[str, str]] = None
    preexec: Optional[Callable[[], None]] = None


@dataclass
class Result:
    code: Optional[int]
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False
    note: str = ""                        # what a custom runner did (kill point, second process)

    @property
    def output(self) -> str:
        return self.stdout + "\n" + self.stderr


@dataclass
class Case:
    name: str
    area: str                             # the part of ppdlx whose behaviour this is
    tool: str                             # the CLI run, as shown in the table
    what: str                             # the fault, in one sentence
    prepare: Callable                     # (ctx) -> Run
    expect: str = "error"                 # "error": refused in one line; "ok": succeeds and check() agrees
    check: Optional[Callable] = None      # (ctx, run, result) -> (ok, why) on exit 0
    after: Optional[Callable] = None      # (ctx, run, result) -> problem or None, on any exit
    runner: Optional[Callable] = None     # (ctx, run, timeout) -> Result, for kills and concurrent runs
    needs_fix: bool = True                # the error line must also say what to do
    timeout: int = 300


@dataclass
class Outcome:
    case: Case
    verdict: str
    reason: str
    code: Optional[int]
    message: str
    seconds: float
    description: str

    def to_dict(self) -> dict:
        return {"name": self.case.name, "area": self.case.area, "tool": self.case.tool, "what": self.description,
                "exit_code": self.code, "message": self.message, "verdict": self.verdict, "reason": self.reason,
                "seconds": round(self.seconds, 1)}


def sha256(path: str) -> Optional[str]:
    if not os.path.isfile(path):
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def meaningful_lines(text: str) -> List[str]:
    return [line.rstrip() for line in text.splitlines() if not _NOISE.search(line)]


def message_of(result: Result) -> str:
    """The line a user reads: the last ``error:`` line of stderr, else its last meaningful line."""
    lines = meaningful_lines(result.stderr)
    errors = [line for line in lines if re.match(r"^(\S+: )?error: ", line.strip())]
    if errors:
        return errors[-1].strip()
    if lines:
        return lines[-1].strip()
    lines = meaningful_lines(result.stdout)
    return lines[-1].strip() if lines else ""


def message_problems(result: Result, message: str, mentions: Sequence[str], needs_fix: bool) -> List[str]:
    problems = []
    if TRACEBACK in result.stderr or TRACEBACK in result.stdout:
        problems.append("traceback")
    if result.code is not None and result.code < 0:
        problems.append(f"killed by signal {-result.code}")
    lowered = message.lower()
    missing = [m for m in mentions if m.lower() not in lowered]
    if missing:
        problems.append("the message does not name " + ", ".join(repr(m) for m in missing))
    if needs_fix and not FIX_HINT.search(message):
        problems.append("the message says no fix")
    return problems


def judge(case: Case, ctx, run: Run, result: Result, before: Dict[str, Optional[str]]) -> Tuple[str, str]:
    """The verdict and its reason (see the module docstring)."""
    changed = [p for p, digest in before.items() if sha256(p) != digest]
    if changed:
        gone = "removed" if sha256(changed[0]) is None else "overwritten"
        return DATA_LOSS, f"{os.path.relpath(changed[0], ctx.dir)} {gone} ({len(changed)} protected file(s))"
    after = case.after(ctx, run, result) if case.after else None
    if result.timed_out:
        return WEAK, f"no answer within {case.timeout} s"
    message = message_of(result)
    if result.code == 0:
        if case.check is None:
            return SILENT, "exit 0: the fault went unreported"
        ok, why = case.check(ctx, run, result)
        if ok and after:
            return WEAK, after
        return (GOOD if ok else SILENT), why
    if case.expect == "ok":
        return WEAK, f"refused (exit {result.code}) where it should succeed"
    problems = message_problems(result, message, run.mentions, case.needs_fix)
    if after:
        problems.append(after)
    if problems:
        return WEAK, "; ".join(problems)
    return GOOD, "one line naming " + (", ".join(run.mentions) if run.mentions else "the problem")


def run_subprocess(ctx, run: Run, timeout: int) -> Result:
    started = time.time()
    env = dict(os.environ, **(run.env or {}))
    try:
        proc = subprocess.run(run.argv, cwd=ctx.root, env=env, capture_output=True, text=True, timeout=timeout,
                              preexec_fn=run.preexec)
        return Result(proc.returncode, proc.stdout, proc.stderr, time.time() - started)
    except subprocess.TimeoutExpired as err:
        out = err.stdout.decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
        errs = err.stderr.decode() if isinstance(err.stderr, bytes) else (err.stderr or "")
        return Result(None, out, errs, time.time() - started, timed_out=True)


def run_case(case: Case, make_ctx: Callable) -> Outcome:
    ctx = make_ctx(case)
    started = time.time()
    try:
        run = case.prepare(ctx)
    except SetupError as err:
        return Outcome(case, SETUP, str(err), None, "", time.time() - started, case.what)
    except Exception as err:  # a broken case is reported, the battery goes on
        return Outcome(case, SETUP, f"prepare failed: {err!r} {traceback.format_exc(limit=2)}", None, "",
                       time.time() - started, case.what)
    before = {p: sha256(p) for p in run.protect}
    try:
        result = (case.runner or run_subprocess)(ctx, run, case.timeout)
    except SetupError as err:
        return Outcome(case, SETUP, str(err), None, "", time.time() - started, run.description or case.what)
    try:
        verdict, reason = judge(case, ctx, run, result, before)
    except SetupError as err:
        verdict, reason = SETUP, str(err)
    description = run.description or case.what
    if result.note:
        description = f"{description} ({result.note})"
    return Outcome(case, verdict, reason, result.code, message_of(result), result.seconds, description)


def run_battery(cases: Sequence[Case], make_ctx: Callable, jobs: int = 2,
                progress: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)
                ) -> List[Outcome]:
    """Every case, ``jobs`` at a time; outcomes in the order of ``cases``."""
    def one(case):
        outcome = run_case(case, make_ctx)
        progress(f"{outcome.verdict:9s} {case.name} ({outcome.seconds:.0f} s): {outcome.reason}")
        return outcome

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, cases))


def counts(outcomes: Sequence[Outcome]) -> Dict[str, int]:
    out = {v: 0 for v in VERDICTS + (SETUP,)}
    for o in outcomes:
        out[o.verdict] += 1
    return out
