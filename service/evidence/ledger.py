"""Which reports this replica has counted, so that none is counted twice.

A report reaches a replica's indexes by two roads: its own route applies it at once
(``EvidenceSync.apply_local``), and a later store read returns its rows. The ledger
remembers the reports applied here until a read meets them (``LOCAL_TTL_S`` at most),
and the reports a read returned for ``RECENT_S``, in case the route that stored one
applies it late. Keys are ``core.evidence.report_key`` of an observation's source; an
observation without a source (a bench's, a test's) is never deduplicated.

Not thread-safe by itself: ``EvidenceSync`` calls it under its apply lock, the same
lock under which it changes the indexes, so "applied" and "counted" move together.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta

from mla_switchboard.core.evidence import Observation, report_key

RECENT_S = 120.0
"""How long a report read from the store is remembered, for the route that stored it."""
LOCAL_TTL_S = 3600.0
"""How long a report applied here waits for the store read to meet it."""


class ReportLedger:
    """Report keys applied here (key -> monotonic time applied) and read from the
    store recently (key -> monotonic time read)."""

    def __init__(self, clock: Callable[[], datetime]) -> None:
        self._clock = clock
        self._local: dict[str, float] = {}
        self._recent: dict[str, float] = {}

    def apply_here(self, observations: Iterable[Observation]) -> list[Observation]:
        """Of this replica's own new observations, those no recent read returned;
        remembered as applied here."""
        now = time.monotonic()
        fresh = [o for o in observations if not o.source or key_of(o) not in self._recent]
        for o in fresh:
            if o.source:
                self._local[key_of(o)] = now
        return fresh

    def not_applied_here(self, read: Iterable[Observation]) -> list[Observation]:
        """Of observations a store read returned, those this replica has not applied."""
        return [o for o in read if not o.source or key_of(o) not in self._local]

    def local_report_ids(self) -> set[str]:
        """The measurement reports applied here that no read has met yet."""
        return {k[2:] for k in self._local if k.startswith("m:")}

    def met(self, keys: Mapping[str, datetime | None]) -> None:
        """Reports a store read returned (report key -> stored at): no longer waiting
        to be met, and the recent ones remembered for a while in case this replica's
        route applies one late."""
        now = time.monotonic()
        for key in [k for k in self._local if k in keys]:
            del self._local[key]
        recent = self._clock() - timedelta(seconds=RECENT_S)
        for key, at in keys.items():
            if at is None or at >= recent:
                self._recent[key] = now
        for table, ttl in ((self._recent, RECENT_S), (self._local, LOCAL_TTL_S)):
            stale = [k for k, at in table.items() if now - at > ttl]
            for k in stale:
                del table[k]


def key_of(o: Observation) -> str:
    """The ledger's key of an observation with a source."""
    return report_key(o.source)
