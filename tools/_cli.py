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


def config_parser(description: str, config_required: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
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


def write_report(path, report: dict) -> None:
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    os.replace(tmp, path)


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
