"""Benchmarks: ``python tools/benchmark.py {train,loader,infer,profile,serve} -c CFG ... [--report FILE]``.

Prints a table and writes ``{"machine": {...}, "rows": [{"case", "images_per_s", ...}]}``; ``machine``
records the CPU (model, vendor, the flags that select kernels, cores), library versions and the
thread settings of every kind (``benchmarks.machine_facts``).
"""
import importlib
import warnings

from _cli import ToolParser, run, write_report

# The smallest value of each count that still measures something, by kind (infer checks its own counts with its
# batch sizes; loader's --steps 0 is meaningful: only its end-to-end cases run).
LEAST = {"train": {"steps": 1, "rounds": 1, "warmup": 0},
         "profile": {"steps": 1, "warmup": 0, "top": 1}}


def check_counts(kind: str, args) -> None:
    """A count that would time nothing (``--steps 0``) is one line before any model is built."""
    from ppdlx.errors import ConfigError
    for dest, least in LEAST.get(kind, {}).items():
        value = getattr(args, dest, None)
        if value is not None and value < least:
            raise ConfigError(f"benchmark {kind} --{dest} {value}: must be {least} or more")


def main():
    # paddle's import (some kinds load it with their module) warns about a missing compiler cache
    # for custom C++ ops: noise here, and it would break the one-line error contract.
    warnings.filterwarnings("ignore", message="No ccache found")
    from benchmarks import KINDS, format_table, machine_facts
    parser = ToolParser(description=__doc__)
    sub = parser.add_subparsers(dest="kind", required=True)
    modules = {}
    for kind, module_name in KINDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name != module_name:
                raise
            continue
        modules[kind] = module
        p = sub.add_parser(kind, help=(module.__doc__ or "").strip().splitlines()[0])
        p.add_argument("--report", help="write the JSON report here")
        module.add_arguments(p)
    args = parser.parse_args()
    check_counts(args.kind, args)
    result = modules[args.kind].run(args)
    report = {"machine": machine_facts(), **result}
    threads = report.pop("threads", None)
    if threads is not None:
        report["machine"]["threads"]["benchmark"] = threads
    print(format_table(report["rows"]))
    for line in report.get("notes", []):
        print(line)
    write_report(args.report, report)


if __name__ == "__main__":
    run(main)
