"""Background threads yield the CPU to the event loop that answers pods.

A replica's first job is ``/v1/select``, answered on the event loop. Summaries,
previews, evidence upkeep and housekeeping run in threads of their own; where cores
are scarce (two, shared with the database) the kernel's scheduler would give those
threads as much CPU as the loop. Linux keeps a nice value per thread, so each
background thread raises its own at start (:func:`lower_this_thread`): it still runs
whenever a core is free, and waits while the loop wants one. Raising a nice value
needs no privilege; nothing here ever lowers one (that would).

Within the interpreter the same threads compete for the GIL, which a running thread
gives up only every switch interval (``sys.setswitchinterval``): long loops in them
call :func:`let_the_loop_in` between steps, which hands the GIL to the loop at once
when it is waiting and costs about a microsecond when it is not.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

BACKGROUND_NICE = 10
"""How much lower than the process a background thread runs (nice 0 -> 10)."""


def lower_this_thread(by: int = BACKGROUND_NICE) -> bool:
    """Raise the calling thread's nice value by ``by``; False off Linux, which alone
    keeps a nice value per thread (the thread then simply runs at the process's)."""
    # elsewhere PRIO_PROCESS with a thread id would name some other process
    if not sys.platform.startswith("linux"):
        return False
    tid = threading.get_native_id()
    with contextlib.suppress(OSError):
        current = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, current + by))
        return True
    return False


def let_the_loop_in() -> None:
    """Give up the GIL for a moment (see the module docstring)."""
    time.sleep(0)
