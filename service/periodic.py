"""A background thread that does one job every few seconds until the service stops.

The service's housekeeping (promoting rollout steps, taking stale pods out of the
live fleet, storing refused-select counts) all runs this way: in a daemon thread,
never on the event loop, and a round that fails (the database is away) is logged in
one line and simply tried again at the next one. So does the config poller
(``service/live/poller.py``), at the event loop's priority: replicas must see a write within
its interval.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from mla_switchboard.service.messages import first_line
from mla_switchboard.service.priority import lower_this_thread


@dataclass(eq=False)
class Periodic:
    """``work`` every ``every_s`` seconds, in a daemon thread called ``name``, from
    ``start`` until ``stop``; a ``housekeeping`` thread yields to the event loop."""

    name: str
    every_s: float
    work: Callable[[], object]
    log: logging.Logger
    housekeeping: bool = field(default=True, kw_only=True)
    stopping: threading.Event = field(default_factory=threading.Event, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()
        if self._thread is not None:
            self._thread.join(5)

    def _loop(self) -> None:
        if self.housekeeping:
            lower_this_thread()  # housekeeping waits while the event loop wants the CPU
        while not self.stopping.wait(self.every_s):
            try:
                self.work()
            except Exception as exc:  # the store may be down: try again next round
                self.log.warning("%s: %s: %s", self.name, type(exc).__name__, first_line(exc))
