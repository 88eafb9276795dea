"""Whether a process still runs: leftovers named after their writer's pid (a lock, a staging folder) are another
process's only while it lives."""
from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """True while a process of that id exists (one of another user counts too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
