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
when it is waiting. That hand-over is a real sleep: on the 2-core VMs 60-80 us of the
thread's CPU each (the switch and the caches it leaves cold; ``bench/handover_cost.py``),
up to a fifth of a fleet read that yields every half millisecond. So it is made only
while the loop has pods to answer: the app notes each pod's call (:func:`loop_asked`:
a select or a report), and for ``ASKED_WITHIN_S`` after the latest one background
threads hand over; a replica that no pod asked meanwhile runs its reads at full speed
(the read a person asked for among them), and the switch interval alone hands the GIL
to a request that arrives then (within about two intervals).
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, TypeVar

K = TypeVar("K")
V = TypeVar("V")

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


ASKED_WITHIN_S = 1.0
"""How long after the latest pod's call :func:`let_the_loop_in` still hands the loop
the GIL: pods that boot together ask many times a second, so a storm keeps every
background step handing over, while a replica nobody asked for a second does not."""

_asked_at = -ASKED_WITHIN_S  # time.monotonic() of the latest pod's call


def loop_asked(now: float | None = None) -> None:
    """The event loop has a pod's call to answer (the app calls this per select and
    report): the background threads hand it the GIL for the next ``ASKED_WITHIN_S``."""
    global _asked_at
    _asked_at = time.monotonic() if now is None else now


def asked_lately(now: float | None = None) -> bool:
    """Whether a pod called within ``ASKED_WITHIN_S`` before ``now``."""
    return (time.monotonic() if now is None else now) - _asked_at < ASKED_WITHIN_S


def let_the_loop_in() -> None:
    """Give up the GIL for a moment while the loop has pods to answer (``asked_lately``;
    see the module docstring); else nothing, which costs a clock read."""
    if asked_lately():
        time.sleep(0)


# ---------------------------------------------------------------- gradual release

HAND_OVER_EVERY_S = 0.0005
"""How long a background thread may free memory before it lets the loop in."""

_pool = threading.local()


@contextlib.contextmanager
def releasing_gradually() -> Iterator[None]:
    """Within this block, the dicts passed to :func:`release_later` on this thread are
    emptied entry by entry when it ends, letting the loop in between.

    Dropping the last reference to a large structure frees all of it in one C-level
    call that never lets go of the GIL: a fleet read's memo of 8,453 decisions took
    25-30 ms to free on the 2-core machine, a gap in which no select was answered.
    Emptied one entry at a time from Python, the same work is cut where the switch
    interval and :func:`let_the_loop_in` can reach it."""
    outer = getattr(_pool, "held", None), getattr(_pool, "objects", None)
    held: list[dict[Any, Any]] = []
    objects: list[object] = []
    _pool.held, _pool.objects = held, objects
    try:
        yield
    finally:
        _pool.held, _pool.objects = outer
        for found in held:
            empty_gradually(found)
        while objects:
            let_go_gradually(objects.pop())


def release_later(found: dict[K, V]) -> dict[K, V]:
    """``found``, to be emptied gradually when the enclosing
    :func:`releasing_gradually` block ends (untouched outside one). Only for a dict
    its maker owns for the block: emptying it must not take anything from anyone
    else, only let go of what nobody else holds any more."""
    held = getattr(_pool, "held", None)
    if held is not None:
        held.append(found)
    return found


def let_go_later(thing: V) -> V:
    """``thing``, kept until the enclosing :func:`releasing_gradually` block ends and
    then let go of with :func:`let_go_gradually` (untouched outside one). For what a
    read builds and drops when it returns: the drop would otherwise free it all at
    once, wherever the last reference happens to go."""
    objects = getattr(_pool, "objects", None)
    if objects is not None:
        objects.append(thing)
    return thing


EXPAND_DEPTH = 2
"""How deep :func:`let_go_gradually` takes apart every object it alone holds; below
that only large containers (``EXPAND_AT`` references or more) are taken apart, and
anything smaller is freed whole (a small cascade). Walking every object costs ~1 us
each against ~0.2 us to free it: at a fleet-wide preview of 1,000 clusters these
bounds walk ~60,000 objects (~50 ms of the fleet-read thread, freeing included) and
leave no piece that holds the interpreter over a millisecond; three levels and 64
walked ~160,000 (~85 ms)."""

EXPAND_AT = 512


def let_go_gradually(thing: object) -> None:
    """Drop ``thing`` (the caller's last reference to it) a piece at a time.

    Nothing is changed: an object that only this walk still holds has what it refers
    to held first (``gc.get_referents``) and is then dropped, which frees that object
    alone; its parts are dropped the same way in turn, letting the loop in every
    ``HAND_OVER_EVERY_S``. An object anyone else still holds is simply let go of (its
    count goes down, nothing is freed), so the walk never reaches what others use."""
    stack: list[tuple[object, int]] = [(thing, 0)]
    del thing
    hand_over_at = time.monotonic() + HAND_OVER_EVERY_S
    n = 0
    while stack:
        item, depth = stack.pop()
        # the references: ``item`` and getrefcount's argument; any more are others'
        if sys.getrefcount(item) == 2:
            parts = gc.get_referents(item)
            if depth < EXPAND_DEPTH or len(parts) >= EXPAND_AT:
                stack.extend((p, depth + 1) for p in parts if not isinstance(p, type))
            del parts
        item = None  # frees it alone when only the walk held it
        n += 1
        if n % 64 == 0 and time.monotonic() >= hand_over_at:
            let_the_loop_in()
            hand_over_at = time.monotonic() + HAND_OVER_EVERY_S


def empty_gradually(found: dict[Any, Any]) -> None:
    """Empty ``found`` an entry at a time, letting the loop in every
    ``HAND_OVER_EVERY_S``."""
    hand_over_at = time.monotonic() + HAND_OVER_EVERY_S
    n = 0
    while found:
        found.popitem()
        n += 1
        if n % 32 == 0 and time.monotonic() >= hand_over_at:
            let_the_loop_in()
            hand_over_at = time.monotonic() + HAND_OVER_EVERY_S
