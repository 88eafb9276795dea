"""The fault battery (``tools/fault_battery.py``): bad inputs and faults tried against the real CLIs,
each judged GOOD / WEAK / SILENT / DATA-LOSS by explicit checks (:mod:`.battery`),
written to ``docs/reliability.md`` and a JSON next to it (:mod:`.report`). A harness of the tool, not of the
library: it runs the checkout's tools in subprocesses (imported as ``reliability`` by the tool, ``tools.reliability``
by the tests)."""
from __future__ import annotations


def all_cases() -> list:
    """Every case, in the order of the report."""
    from . import (cases_checkpoint, cases_coco, cases_data, cases_export, cases_large_images, cases_outputs,
                   cases_tools)
    cases = []
    for module in (cases_checkpoint, cases_outputs, cases_export, cases_data, cases_coco, cases_large_images,
                   cases_tools):
        cases += module.cases()
    names = [c.name for c in cases]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"duplicate case names: {duplicates}")
    return cases
