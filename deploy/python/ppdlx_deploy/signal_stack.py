"""The calling thread's alternate signal stack, kept across a call into a library that replaces it.

OpenVINO's CPU plugin installs an alternate signal stack of its own on the thread that compiles a model
and unmaps it later, without giving the thread back the one it had (Python's ``faulthandler`` installs
one, and pytest enables it). Python installs every handler it sets with ``SA_ONSTACK``, so the next
signal the thread receives with a Python handler (SIGINT; SIGCHLD once Paddle's DataLoader has set its
child watcher) makes the kernel build the signal frame on unmapped memory: the process dies of SIGSEGV
with no traceback. Putting the previous stack back when the call returns leaves the plugin's own stack
unused (it is only ever entered through a signal) and the process safe.

``sigaltstack`` is POSIX; where the C library does not offer it (Windows) the guard does nothing.
"""
from __future__ import annotations

import contextlib
import ctypes
import sys
from typing import Iterator, Optional


class _SignalStack(ctypes.Structure):
    """``stack_t`` of ``<signal.h>`` (Linux and the BSDs agree on the order of the fields)."""
    _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int), ("ss_size", ctypes.c_size_t)]


def _libc_sigaltstack():
    if sys.platform == "win32":
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).sigaltstack
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.POINTER(_SignalStack), ctypes.POINTER(_SignalStack)]
    function.restype = ctypes.c_int
    return function


_SIGALTSTACK = _libc_sigaltstack()
SS_ONSTACK = 1


def current_signal_stack() -> Optional[tuple]:
    """``(address, flags, size)`` of this thread's alternate signal stack, or None where it cannot be read."""
    if _SIGALTSTACK is None:
        return None
    stack = _SignalStack()
    if _SIGALTSTACK(None, ctypes.byref(stack)) != 0:
        return None
    return stack.ss_sp or 0, stack.ss_flags, stack.ss_size


@contextlib.contextmanager
def signal_stack_kept() -> Iterator[None]:
    """Run the body, then give this thread back the alternate signal stack it had before."""
    before = current_signal_stack()
    try:
        yield
    finally:
        if before is not None and current_signal_stack() != before:
            address, flags, size = before
            # SS_ONSTACK is a state the kernel reports, not a flag sigaltstack accepts
            _SIGALTSTACK(ctypes.byref(_SignalStack(address or None, flags & ~SS_ONSTACK, size)), None)
