"""The two errors the command line prints as one line (``error: ...``) with their exit codes."""
from __future__ import annotations


class DeployError(Exception):
    """A user/input error: printed as one line, exit code 2."""

    exit_code = 2


class UnsupportedError(DeployError):
    """This build/machine cannot do what was asked (e.g. TRT on a CPU-only Paddle): exit code 3."""

    exit_code = 3
