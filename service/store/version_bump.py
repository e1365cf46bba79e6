"""A version row bumped once for many concurrent writes (a group bump).

Every stored report moves ``evidence_version``, the row other replicas poll to learn
that there is evidence to read. Bumped inside each report's own transaction, that one
row is locked from the update to the commit (its disk flush included), so reports
commit one at a time whatever the concurrency. Here each write commits its rows
first, then asks for a bump: one caller at a time runs it, in a transaction of its
own, for every write that asked before it began, while later ones wait for the next.
A write returns once a bump begun after its commit is stored, so whoever learns of
the write from its answer finds the version moved, as before.
"""

from __future__ import annotations

import logging
import threading
import time

from mla_switchboard.service.messages import first_line
from mla_switchboard.service.store.base import bump_statement
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

log = logging.getLogger("switchboard.store")

RETRY_S = (0.05, 0.25)
"""The pauses before a refused bump is tried again: a write's answer waits for them, so
they stay short."""


class GroupBump:
    """Bumps ``key`` of the ``meta`` table once for all the writes waiting."""

    def __init__(self, engine: Engine, key: str) -> None:
        self._engine = engine
        self._key = key
        # built once: building it per bump cost more CPU than the database took
        self._stmt = bump_statement(key)
        self._cond = threading.Condition()
        self._asked = 0  # tickets given
        self._done = 0  # every ticket up to this one is covered by a stored bump
        self._running = False
        self.bumps = 0  # bumps stored (the tests count them against the writes)

    def after_commit(self) -> None:
        """Wait until a bump begun after this call is stored. A bump the database
        refuses is tried again twice, after ``RETRY_S`` (a dropped connection, a lock
        timeout); past that it is logged and the write returns: its rows are stored,
        and the next write's bump tells other replicas of them too."""
        with self._cond:
            self._asked += 1
            ticket = self._asked
            while self._done < ticket:
                if self._running:
                    self._cond.wait()
                    continue
                self._running = True
                covers = self._asked
                self._cond.release()
                try:
                    self._bump()
                finally:
                    self._cond.acquire()
                    self._running = False
                    self._done = max(self._done, covers)
                    self._cond.notify_all()

    def _bump(self) -> None:
        for pause in (*RETRY_S, None):
            try:
                with self._engine.begin() as conn:
                    conn.execute(self._stmt)
                self.bumps += 1
                return
            except SQLAlchemyError as exc:
                if pause is None:
                    log.warning(
                        "%s not bumped (%s): the next write bumps it", self._key, first_line(exc)
                    )
                    return
                time.sleep(pause)
