"""The cycle collector, kept off the event loop's back.

A CPython collection holds the GIL, so every thread waits for it, the event loop that
answers ``/v1/select`` with them. Two kinds of work made collections long:

- A fleet read or an evidence reload makes and frees hundreds of thousands of objects
  on a background thread. Each 10,000 net new ones set off a young collection over
  them, each tenth of those a collection of the generation above, over 100,000: in a
  preview of ``*`` at 1,000 clusters x 1,000 overrides (10,000 pods, on the 2-core
  machine), young ones took 5-17 ms and the others 25-88 ms, each a gap in the loop.
- What such work keeps (the per-cluster parts, an evidence index) is then traversed by
  every older collection for as long as it lives.

So a background job runs with automatic collection paused (:meth:`Collector.paused`),
and what is still alive at its end is frozen (``gc.freeze``): moved where no
collection looks. Its temporaries were freed by reference counting meanwhile (a fleet
read frees its memo gradually: ``service/priority.py``), so almost nothing waited for
the collector. In the same preview the longest gap fell to 9.6 ms, with no collection
over 5 ms.

What a freeze costs is cyclic garbage: a cycle unreachable at the freeze, or one that
was alive then and is dropped later, is never collected while frozen. It is bounded:
when the objects frozen since the last thaw may number ``thaw_growth`` of those frozen
then (an upper bound, counted without walking them), and ``thaw_every_s`` has passed
since, the end of a job unfreezes them and runs one full collection before freezing
again: a pause of the whole heap (about 200 ms at 280,000 objects on the 2-core
machine, counted in ``switchboard_gc_pause_seconds``), at most once per ten minutes.
What leaks is what cycles a replica drops in that time (about 150 objects per fleet
read, measured in-process at 1,000 clusters).
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

YOUNG_GC_THRESHOLD = 10_000
"""Net new tracked objects before a young collection (CPython's default is 700)."""

THAW_GROWTH = 0.5
"""How much the frozen objects may grow past the last thaw before the next one."""

THAW_AT_MOST_EVERY_S = 600.0
"""The least time between two thaws (each is a pause of the whole heap)."""


class Collector:
    """The process's collector settings and the background jobs' pauses of it.

    One per process (the collector is the process's): the runtime makes it and hands
    it to the fleet reads and the evidence sync."""

    def __init__(
        self,
        thaw_growth: float = THAW_GROWTH,
        thaw_every_s: float = THAW_AT_MOST_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        *,
        freezes: bool = True,
    ) -> None:
        """``freezes``: freeze what a job leaves alive. Only a process that is a
        server does (``switchboard serve``): an app built in a test or another
        program leaves the process's collector as it found it."""
        self.freezes = freezes
        self._lock = threading.Lock()
        self._active = 0
        self._was_enabled = True
        self._thaw_growth = thaw_growth
        self._thaw_every_s = thaw_every_s
        self._clock = clock
        self._thawed_at = clock()
        self._frozen_after_thaw = 0  # counted at start and after a thaw: O(objects)
        self._grown = 0  # net new objects frozen since, as CPython counts them
        self.thaws = 0

    def settle_at_start(self) -> None:
        """After start-up: freeze what was loaded (modules, schemas, the snapshot:
        alive as long as the process; without this every full collection under load
        walked ~120,000 start-up objects on the event loop's thread, tens of ms each
        on the 2-core machine), and raise the young threshold. CPython collects the
        young generation whenever tracked objects outnumber freed ones by 700; the
        loop's own work (a select, a report) makes and frees them in small numbers,
        so at 10,000 what it makes is freed by reference counting first, and cyclic
        garbage waits for at most 10,000 net new objects, a few MB."""
        gc.freeze()
        self._frozen_after_thaw = gc.get_freeze_count()
        gc.set_threshold(YOUNG_GC_THRESHOLD, *gc.get_threshold()[1:])

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Automatic collection off for the block (and for any block of another
        thread that overlaps it); at the end of the last one, what is alive is frozen
        (module docstring) and collection resumes as it was."""
        with self._lock:
            if self._active == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._active += 1
        try:
            yield
        finally:
            with self._lock:
                self._active -= 1
                if self._active == 0:
                    self._freeze()
                    if self._was_enabled:
                        gc.enable()

    def _freeze(self) -> None:
        if not self.freezes:
            return
        # The young generation's count is the net of objects made and freed since the
        # last collection or freeze, so the sum over freezes is an upper bound of what
        # freezing grew by (frees between two pauses are lost to collections that
        # reset the count); ``gc.get_freeze_count`` would walk every frozen object
        # (about 30 ms at 280,000), which is left to the thaw's own pause.
        self._grown += gc.get_count()[0]
        gc.freeze()
        grown = self._grown > self._frozen_after_thaw * self._thaw_growth
        if grown and self._clock() - self._thawed_at >= self._thaw_every_s:
            self.thaw()

    def thaw(self) -> None:
        """Unfreeze, collect everything once (the only full collection: a pause of
        the whole heap), and freeze what is left."""
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self.thaws += 1
        self._thawed_at = self._clock()
        self._frozen_after_thaw = gc.get_freeze_count()
        self._grown = 0


def paused(collector: Collector | None) -> AbstractContextManager[None]:
    """``collector.paused()``, or nothing for a caller made without a collector."""
    return contextlib.nullcontext() if collector is None else collector.paused()
