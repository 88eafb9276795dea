"""Puts ppdlx_triton (next to this file) and ppdlx_deploy (deploy/python) on sys.path for the command
lines here, from any working directory."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
for path in (os.path.join(os.path.dirname(HERE), "python"), HERE):
    if path not in sys.path:
        sys.path.insert(0, path)
