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
    """``parse_args`` also checks, before any work, that every file and folder the tool writes at its end
    (``--report``, and what :meth:`add_output_file` / :meth:`add_output_dir` declare) can be written, and that
    the counts :meth:`add_count` declares are in range: an evaluation or a benchmark can run for hours, and a
    path under a regular file or in a read-only folder would lose its result then."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # dest -> (option, example file name); "report" for the tools that add --report themselves
        self.output_files = {"report": ("--report", "report.json")}
        self.output_dirs = {}   # dest -> option
        self.minimums = {}      # dest -> (option, smallest value)

    def add_output_file(self, *flags, example: str, **kwargs):
        """An option naming a file written at the end; ``example`` is the file name suggested for a directory."""
        action = self.add_argument(*flags, **kwargs)
        self.output_files[action.dest] = (action.option_strings[-1], example)
        return action

    def add_output_dir(self, *flags, **kwargs):
        """An option naming a directory written into at the end (created if missing)."""
        action = self.add_argument(*flags, **kwargs)
        self.output_dirs[action.dest] = action.option_strings[-1]
        return action

    def add_count(self, *flags, minimum: int, **kwargs):
        """An integer option refused below ``minimum``."""
        action = self.add_argument(*flags, type=int, **kwargs)
        self.minimums[action.dest] = (action.option_strings[-1], minimum)
        return action

    def parse_args(self, args=None, namespace=None):
        parsed = super().parse_args(args, namespace)
        from ppdlx.errors import ConfigError
        for dest, (option, minimum) in self.minimums.items():
            value = getattr(parsed, dest, None)
            if value is not None and value < minimum:
                raise ConfigError(f"{option} {value}: must be {minimum} or more")
        for dest, (option, example) in self.output_files.items():
            path = getattr(parsed, dest, None)
            if path:
                check_output_file(option, path, example)
        for dest, option in self.output_dirs.items():
            path = getattr(parsed, dest, None)
            if path:
                check_output_dir(option, path)
        return parsed


def check_output_file(option: str, path: str, example: str = "report.json") -> None:
    """``ConfigError`` (one line) when ``path`` cannot become a file: it is a directory, a regular file stands
    where one of its folders should be, or the nearest existing folder is not writable. Creates nothing."""
    from ppdlx.errors import ConfigError
    if os.path.isdir(path):
        raise ConfigError(f"{option} {path}: is a directory; give a file name, e.g. {os.path.join(path, example)}")
    _check_nearest_folder(option, path, os.path.dirname(path))


def check_output_dir(option: str, path: str) -> None:
    """``ConfigError`` (one line) when ``path`` cannot become a directory: it is a regular file, a regular file
    stands where one of its parents should be, or the nearest existing folder is not writable. Creates
    nothing."""
    from ppdlx.errors import ConfigError
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"{option} {path}: is a file, not a directory; choose a directory that can be written")
    _check_nearest_folder(option, path, path)


def _check_nearest_folder(option: str, path: str, folder: str) -> None:
    """The nearest existing one of ``folder`` and its parents (the tool creates the rest) must be a writable
    directory."""
    from ppdlx.errors import ConfigError
    existing = folder or "."
    while not os.path.exists(existing):
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
    parser.add_output_file("--report", example="report.json", help="write a JSON report to this file")
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


def home_cache_problem(err: OSError):
    """The line for an ``OSError`` on the user's cache folder ($HOME/.cache, which ``import paddle`` creates for its
    data sets, and where ppdlx caches its compiled ops), else None: with HOME a regular file or read-only, every
    tool died in the import with a traceback."""
    home = os.path.expanduser("~")
    cache = os.path.join(home, ".cache")
    if not isinstance(err.filename, str) or not (err.filename == home or err.filename.startswith(cache)):
        return None
    if os.path.exists(home) and not os.path.isdir(home):
        why = f"HOME={home} is a file, not a directory"
    else:
        why = f"cannot create {err.filename} ({err.strerror})"
    return (f"{why}; Paddle (imported by every tool) and ppdlx keep their caches in $HOME/.cache: set HOME to a "
            f"writable directory")


def run(main) -> None:
    """Run ``main()``; user errors print one line and exit non-zero, no traceback."""
    from ppdlx.errors import PpdlxError
    try:
        code = main()
    except PpdlxError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
    except OSError as err:
        line = home_cache_problem(err)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code or 0)
