"""Loaded by a replica started with ``PYTHONPATH`` here and ``SB_GIL_STEPS=<file>``
(bench/gil_steps.py): the thread CPU of every step between two profile events of the
fleet-read and worker threads, where a step over a millisecond is kept with its place.

Between two events a thread runs one C call or frees what a return or a rebinding
dropped; neither lets go of the GIL, so such a step is a gap in which the event loop
cannot answer. Thread CPU time, not wall time: the machine's other load does not
lengthen it. The profile slows the Python code around the steps, not the steps."""

from __future__ import annotations

import json
import os
import sys
import threading
import time

_OUT = os.environ.get("SB_GIL_STEPS")
if _OUT:
    _steps: list[tuple[float, str]] = []
    _lock = threading.Lock()

    def _hook(name: str):  # type: ignore[no-untyped-def]
        clock = time.thread_time
        last = [clock(), ""]

        def profile(frame, event, arg):  # type: ignore[no-untyped-def]
            d = clock() - last[0]
            if d > 0.001:
                what = arg.__qualname__ if event.startswith("c_") else frame.f_code.co_name
                place = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
                with _lock:
                    _steps.append((d, f"{name} {event} {what} at {place} after {last[1]}"))
            last[1] = f"{event} {frame.f_code.co_name}"
            last[0] = clock()

        return profile

    def _start(frame, event, arg):  # type: ignore[no-untyped-def]
        name = threading.current_thread().name
        watched = name.startswith(("fleet-read", "AnyIO"))
        sys.setprofile(_hook(name.split("_")[0]) if watched else None)

    threading.setprofile(_start)

    def _dump() -> None:
        while True:
            time.sleep(1)
            with _lock:
                steps = sorted(_steps, reverse=True)
            with open(_OUT, "w") as f:
                json.dump([[round(d * 1000, 2), w] for d, w in steps], f)

    threading.Thread(target=_dump, daemon=True, name="gil-steps-dump").start()
