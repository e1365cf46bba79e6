"""A background thread that does one job every few seconds until the service stops.

The service's housekeeping (promoting rollout steps, taking stale pods out of the
live fleet, storing refused-select counts) all runs this way: in a daemon thread,
never on the event loop, and a round that fails (the database is away) is logged in
one line and simply tried again at the next one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from mla_switchboard.service.messages import first_line
from mla_switchboard.service.priority import lower_this_thread


class Periodic:
    def __init__(
        self, name: str, every_s: float, work: Callable[[], object], log: logging.Logger
    ) -> None:
        self._name = name
        self._every_s = every_s
        self._work = work
        self._log = log
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()
        if self._thread is not None:
            self._thread.join(5)

    def _loop(self) -> None:
        lower_this_thread()  # housekeeping waits while the event loop wants the CPU
        while not self.stopping.wait(self._every_s):
            try:
                self._work()
            except Exception as exc:  # the store may be down: try again next round
                self._log.warning("%s: %s: %s", self._name, type(exc).__name__, first_line(exc))
