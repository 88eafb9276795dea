"""The fault battery: bad inputs and faults tried against the real tools, each judged GOOD / WEAK / SILENT /
DATA-LOSS by explicit checks, written to docs/reliability.md and docs/reliability.json.

    python tools/fault_battery.py                  # every case, 2 at a time
    python tools/fault_battery.py -k deploy_ -k kill_during_save --out /tmp/r.md   # a subset
    python tools/fault_battery.py --list

The cases live in tools/reliability/cases_*.py; each builds its fault in its own directory under --work
(default: a temporary directory, removed at the end unless --keep). Shared inputs (a small digits tree, a
2-epoch training run, its exports, a small COCO set) are made once, when a case first needs them.
Exits 0 whatever the verdicts (the report is the result); non-zero only when the battery itself fails.
"""
import argparse
import os
import shutil
import sys
import tempfile
import time

from _cli import ROOT


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-k", action="append", default=[], metavar="TEXT",
                        help="only cases whose name contains TEXT (repeatable)")
    parser.add_argument("--jobs", type=int, default=2, help="cases run at once (default 2)")
    parser.add_argument("--out", help="Markdown report (default: docs/reliability.md for the full battery, "
                                      "none for a subset); the JSON goes next to it")
    parser.add_argument("--work", help="working directory (default: a new temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: give 1 or more")

    from reliability import all_cases
    from reliability.battery import counts, run_battery, VERDICTS
    from reliability.report import write_reports
    from reliability.workspace import Fixtures, case_context_factory
    cases = [c for c in all_cases() if not args.k or any(k in c.name for k in args.k)]
    if args.list:
        for case in cases:
            print(f"{case.name:40s} {case.area:14s} {case.tool}")
        return 0
    if not cases:
        parser.error(f"no case name contains {' or '.join(args.k)} (--list shows them)")
    out = args.out or (None if args.k else os.path.join(ROOT, "docs", "reliability.md"))
    work = args.work or tempfile.mkdtemp(prefix="ppdlx_faults_")
    started = time.time()
    try:
        fixtures = Fixtures(os.path.join(work, "base"), ROOT)
        outcomes = run_battery(cases, case_context_factory(fixtures, os.path.join(work, "cases")), jobs=args.jobs)
    finally:
        if not args.keep and not args.work:
            shutil.rmtree(work, ignore_errors=True)
    total = counts(outcomes)
    print(f"{len(outcomes)} cases in {(time.time() - started) / 60:.1f} min: "
          + ", ".join(f"{v} {total[v]}" for v in VERDICTS + ("SETUP",)))
    if out:
        json_path = write_reports(outcomes, out, time.time() - started, args.jobs, work=work)
        print(f"report: {out}, {json_path}")
    if args.keep or args.work:
        print(f"work: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
