"""Shared CLI plumbing: ``-c CFG -o k=v ...``, one-line errors, JSON reports."""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    # Appended, not inserted first: an installed ppdlx (wheel or editable) is the one imported, so a broken
    # install fails here instead of being hidden by the checkout; a checkout without any install still runs.
    sys.path.append(ROOT)

import ppdlx  # noqa: E402,F401  (sets MKL_DEBUG_CPU_TYPE before paddle loads)


class ToolParser(argparse.ArgumentParser):
    """``parse_args`` also checks that every file the tool writes at its end (``--report``) can be written, before
    any work: an evaluation or a benchmark can run for hours, and a report path under a regular file or in a
    read-only folder would lose its result then."""

    output_files = ("report",)   # destinations of options naming a file written at the end

    def parse_args(self, args=None, namespace=None):
        parsed = super().parse_args(args, namespace)
        for dest in self.output_files:
            path = getattr(parsed, dest, None)
            if path:
                check_output_file("--" + dest.replace("_", "-"), path)
        return parsed


def check_output_file(option: str, path: str) -> None:
    """``ConfigError`` (one line) when ``path`` cannot become a file: it is a directory, a regular file stands
    where one of its folders should be, or the nearest existing folder is not writable. Creates nothing."""
    from ppdlx.errors import ConfigError
    if os.path.isdir(path):
        raise ConfigError(f"{option} {path}: is a directory; give a file name, e.g. "
                          f"{os.path.join(path, 'report.json')}")
    existing = os.path.dirname(path) or "."
    while not os.path.exists(existing):  # folders write_report will create
        existing = os.path.dirname(existing) or "."
    if not os.path.isdir(existing):
        raise ConfigError(f"{option} {path}: {existing} is a file, not a directory; choose another {option} "
                          f"path")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{option} {path}: cannot write in {existing} (permission denied); choose another "
                          f"{option} path")


def config_parser(description: str, config_required: bool = True) -> ToolParser:
    parser = ToolParser(description=description)
    parser.add_argument("-c", "--config", required=config_required, help="YAML config file")
    parser.add_argument("-o", "--override", action="append", nargs="+", default=[], metavar="KEY=VALUE",
                        help="override a config value, e.g. -o train.epochs=90 data.batch_size=64")
    parser.add_argument("--report", help="write a JSON report to this file")
    return parser


def load(args):
    from ppdlx.config import flatten_overrides, load_config
    cfg = load_config(args.config, flatten_overrides(args.override))
    from ppdlx.cpu_env import apply_cpu_environment
    apply_cpu_environment(cfg)
    return cfg


def write_report(path, report: dict, option: str = "--report") -> None:
    if not path:
        return
    from ppdlx.errors import ConfigError
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
        os.replace(tmp, path)
    except OSError as err:  # checked at start (ToolParser); this is the folder changing or filling up since
        if os.path.isfile(tmp):
            os.remove(tmp)
        raise ConfigError(f"{option} {path}: cannot write it ({err.strerror}: {err.filename}); the results "
                          f"printed above were not saved: choose a writable {option} path") from None


def run(main) -> None:
    """Run ``main()``; user errors print one line and exit non-zero, no traceback."""
    from ppdlx.errors import PpdlxError
    try:
        code = main()
    except PpdlxError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code or 0)
