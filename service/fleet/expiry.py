"""Pods not seen for a while leave the live fleet (their decisions stay in the log).

A pod that was deleted, rescheduled under another name or scaled away never says so;
without this, the fleet's counts, the summary, previews and the fleet table would
count it for ever. A pod is *seen* when it asks for a decision; one not seen for
``SWITCHBOARD_POD_TTL_DAYS`` (7 by default) is taken out, in small batches, by a
background thread of every replica (the store's fleet lock makes them take turns).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from mla_switchboard.service.periodic import Periodic
from mla_switchboard.service.store.decisions import DecisionStore

log = logging.getLogger("switchboard.fleet")

SWEEP_EVERY_S = 300.0


@dataclass(eq=False)
class PodExpiry:
    decisions: DecisionStore
    ttl: timedelta
    every_s: float = SWEEP_EVERY_S
    _thread: Periodic = field(init=False)

    def __post_init__(self) -> None:
        self._thread = Periodic("pod-expiry", self.every_s, self.sweep, log)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()

    def sweep(self, now: datetime | None = None) -> int:
        """Take every pod not seen within the TTL out of the live fleet; how many."""
        cutoff = (now or datetime.now(UTC)) - self.ttl
        total = 0
        while not self._thread.stopping.is_set():
            n = self.decisions.expire_pods(cutoff)
            total += n
            if n < 5000:
                break
        if total:
            log.info("%d pods not seen for %s left the live fleet", total, self.ttl)
        return total
