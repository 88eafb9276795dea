"""OpenVINO's CPU plugin replaces the thread's alternate signal stack when it compiles a model and
unmaps it later; a process with Python signal handlers then died of SIGSEGV, without a traceback, at
the next signal (the full suite did, at a SIGCHLD after the OpenVINO tests). The deploy predictors give
the thread its stack back after every call into the plugin."""
import faulthandler
import importlib
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from benchmarks.infer import load_deploy_module

D = load_deploy_module()
STACKS = importlib.import_module(D.__name__ + ".signal_stack")
needs_sigaltstack = pytest.mark.skipif(STACKS.current_signal_stack() is None,
                                       reason="sigaltstack is not available from this C library")


@needs_sigaltstack
def test_the_guard_gives_back_the_stack_a_call_replaced():
    stacks = STACKS
    faulthandler.enable()  # installs an alternate stack on this thread
    before = stacks.current_signal_stack()
    assert before[1] & 2 == 0, "faulthandler's stack should be enabled"
    with stacks.signal_stack_kept():
        disabled = stacks._SignalStack(None, 2, 0)  # what a library switching it off would do
        stacks._SIGALTSTACK(disabled, None)
        assert stacks.current_signal_stack()[1] & 2 == 2
    assert stacks.current_signal_stack() == before


@needs_sigaltstack
def test_openvino_leaves_the_thread_its_signal_stack(exports):
    pytest.importorskip("openvino")
    stacks = STACKS
    faulthandler.enable()
    before = stacks.current_signal_stack()
    predictor = D.create_predictor(exports["program"], "openvino", threads=1)
    feeds = D.synthetic_feeds(predictor.meta, 2)
    outputs = predictor.run(feeds)
    assert np.isfinite(outputs[0]).all()
    assert stacks.current_signal_stack() == before
    # and the process survives the signals a Python handler takes on that stack
    received = []
    previous = signal.signal(signal.SIGCHLD, lambda *_: received.append(1))
    try:
        for _ in range(3):
            assert subprocess.run([sys.executable, "-c", "pass"]).returncode == 0
        del predictor
        os.kill(os.getpid(), signal.SIGCHLD)
    finally:
        signal.signal(signal.SIGCHLD, previous)
    assert len(received) >= 1
