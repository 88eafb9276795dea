"""Pieces of ``deploy/python/infer.py`` kept in their own modules (still without ppdlx): the
error types and the record of one ``paddle.inference.Config`` call, shared by ``infer.py`` and
:mod:`ppdlx_deploy.trt` (the Paddle-TRT routes)."""
from __future__ import annotations


class DeployError(Exception):
    """A user/input error: printed as one line, exit code 2."""

    exit_code = 2


class UnsupportedError(DeployError):
    """This build/machine cannot do what was asked (e.g. TRT on a CPU-only Paddle): exit code 3."""

    exit_code = 3


def plan_call(name, *args, **kwargs) -> dict:
    """One ``Config`` method call as data: ``{"call", "args", "kwargs"}``."""
    return {"call": name, "args": list(args), "kwargs": dict(kwargs)}
