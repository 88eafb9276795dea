#!/usr/bin/env python3
"""Run an exported ppdlx model without ppdlx: the command line of the ppdlx_deploy package next to
this file (``--help`` for the options; the code is in ppdlx_deploy/cli.py)."""
import os
import sys

# ppdlx_deploy sits next to this file: found from any cwd, also when this file is run by path.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from ppdlx_deploy.cli import run  # noqa: E402

if __name__ == "__main__":
    sys.exit(run())
