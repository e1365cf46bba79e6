"""Background threads yield the CPU to the event loop that answers pods.

A replica's first job is ``/v1/select``, answered on the event loop. Summaries,
previews, evidence upkeep and housekeeping run in threads of their own; where cores
are scarce (two, shared with the database) the kernel's scheduler would give those
threads as much CPU as the loop. Linux keeps a nice value per thread, so each
background thread raises its own at start (:func:`lower_this_thread`): it still runs
whenever a core is free, and waits while the loop wants one. Raising a nice value
needs no privilege; nothing here ever lowers one (that would).

Within the interpreter the same threads compete for the GIL, which a running thread
gives up only every switch interval (``sys.setswitchinterval``; a loop that wakes
beside a busy thread waits about two intervals, 2.2 ms at 1 ms): long loops in them
call :func:`let_the_loop_in` between steps, which hands the GIL to the loop at once.
That hand-over is a real sleep of the kernel's timer slack (about 75 us of wall time
on the 2-core VMs, 15-20 us of the thread's CPU), a sixth of the wall time of a read
that yields every half millisecond. A shorter one ends before the loop's thread has
woken and hands nothing over: with the slack at 1 ns the loop waited 1.9-2.3 ms
(median) for the GIL, as with no yield at all (``bench/handover_cost.py``,
``bench/results/handover_cost_slack.json``). So it is made only while pods
call: while the loop answers a pod's call (a select or a report, counted by the app:
:func:`answering_a_pod`) and for ``ASKED_WITHIN_S`` after. A read nobody waits on, the
one a person asked for among them, runs at full speed, and a pod's call that arrives
then waits for the switch interval.

Whether the loop waits for the GIL cannot be seen from another thread: under uvloop
a request's bytes are read in C before the loop's Python code asks for the GIL, so by
then even the loop's epoll descriptor is no longer readable. Yielding only while it
was readable or a call was being answered let a select arriving between two wait for
the switch interval: select p99 while fleet reads ran was 5.67 ms against 4.17 ms
with a window after each call (``bench/results/fleet_change_p99_fd_watch.json``).
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


ASKED_WITHIN_S = 0.1
"""How long after a pod's call was answered :func:`let_the_loop_in` still hands the
loop the GIL. Pods that boot together call many times a second (at 10 calls a second
or more the hand-over stays on), and the next call is let in at the next step rather
than after two switch intervals; a replica that pods call now and then (a fleet of
100,000 boots a few a second) does not pay the hand-over for a second after each."""

_pod_calls = 0  # pods' calls the loop is answering now (changed on the loop's thread)
_answered_at = -ASKED_WITHIN_S  # time.monotonic() when the latest one was answered


class _Answering:
    """The context of :func:`answering_a_pod`: a class, not a generator, since it wraps
    every select (a generator-based one costs 1.0 us a call here, this 0.2 us)."""

    __slots__ = ()

    def __enter__(self) -> None:
        global _pod_calls
        _pod_calls += 1

    def __exit__(self, *exc: object) -> None:
        global _pod_calls, _answered_at
        _pod_calls -= 1
        _answered_at = time.monotonic()


_ANSWERING = _Answering()


def answering_a_pod() -> contextlib.AbstractContextManager[None]:
    """Around the event loop's answer to a pod's call (a select, a report): while any is
    in progress, and for ``ASKED_WITHIN_S`` after, background threads hand the loop
    the GIL at every step."""
    return _ANSWERING


def pod_calls_in_flight() -> int:
    """How many pods' calls the event loop is answering now."""
    return _pod_calls


def loop_waiting(now: float | None = None) -> bool:
    """Whether the event loop may want the GIL back soon: a pod's call is being
    answered, or one was within ``ASKED_WITHIN_S`` before ``now``."""
    if _pod_calls:
        return True
    return (time.monotonic() if now is None else now) - _answered_at < ASKED_WITHIN_S


def let_the_loop_in() -> None:
    """Give up the GIL for a moment while the loop may want it (:func:`loop_waiting`);
    else nothing, which costs a clock read."""
    if loop_waiting():
        time.sleep(0)


# ---------------------------------------------------------------- gradual release

HAND_OVER_EVERY_S = 0.0005
"""How long a background thread may free memory before it lets the loop in."""

_pool = threading.local()


class Releases:
    """What the dicts passed to :func:`release_later` and the objects passed to
    :func:`let_go_later` on one thread, within :meth:`collecting`, hand over; emptied
    and let go of a piece at a time by :meth:`release`, whenever and by whichever
    thread the owner calls it (a fleet read answers first and frees after)."""

    def __init__(self) -> None:
        self.held: list[dict[Any, Any]] = []
        self.objects: list[object] = []

    @contextlib.contextmanager
    def collecting(self) -> Iterator[None]:
        outer = getattr(_pool, "held", None), getattr(_pool, "objects", None)
        _pool.held, _pool.objects = self.held, self.objects
        try:
            yield
        finally:
            _pool.held, _pool.objects = outer

    def release(self) -> None:
        for found in self.held:
            empty_gradually(found)
        self.held.clear()
        while self.objects:
            let_go_gradually(self.objects.pop())


@contextlib.contextmanager
def releasing_gradually() -> Iterator[None]:
    """Within this block, the dicts passed to :func:`release_later` on this thread are
    emptied entry by entry when it ends, letting the loop in between.

    Dropping the last reference to a large structure frees all of it in one C-level
    call that never lets go of the GIL: a fleet read's memo of 8,453 decisions took
    25-30 ms to free on the 2-core machine, a gap in which no select was answered.
    Emptied one entry at a time from Python, the same work is cut where the switch
    interval and :func:`let_the_loop_in` can reach it."""
    releases = Releases()
    try:
        with releases.collecting():
            yield
    finally:
        releases.release()


def release_later(found: dict[K, V]) -> dict[K, V]:
    """``found``, to be emptied gradually when the enclosing
    :func:`releasing_gradually` block ends, or the enclosing :class:`Releases` is
    released (untouched outside one). Only for a dict
    its maker owns for the block: emptying it must not take anything from anyone
    else, only let go of what nobody else holds any more."""
    held = getattr(_pool, "held", None)
    if held is not None:
        held.append(found)
    return found


def let_go_later(thing: V) -> V:
    """``thing``, kept until the enclosing :func:`releasing_gradually` block ends (or
    the enclosing :class:`Releases` is released) and then let go of with
    :func:`let_go_gradually` (untouched outside one). For what a
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
