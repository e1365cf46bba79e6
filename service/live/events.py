"""The change stream behind ``GET /v1/events``: what changed, to every open console.

One hub per replica. It is fed by what the replica already does: each configuration
snapshot it takes into force (its own writes at once, other replicas' through the
config poller) and each round of the poller's version read (every
``SWITCHBOARD_CONFIG_POLL_S``: the fleet's counts, the evidence, and the clock for
overrides that expire). So a change made on any replica reaches every stream on every
replica within a poll interval, and an open stream costs no database read of its own.

Changes are kept in a bounded ring, numbered ``<boot>-<seq>``: a page that reconnects
with ``Last-Event-ID`` gets what it missed, or ``resync`` when the ring no longer holds
it (or the id is another process's): it then reads everything again, as after a load.
The number of open streams is bounded per replica; past it the route answers 503 and
the page polls instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import threading
import weakref
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from mla_switchboard.service.live.changes import Change, config_changes, expired_since
from mla_switchboard.service.state import ConfigSnapshot

# The store's versions whose moves the console answers by reading again.
RECHECK_S = 3.0
"""How often an open stream asks whether its caller may still read: a sign-out, a
revoked session or token closes it within this."""
ENDED = "signed out, or the session or token was revoked: sign in again"

_VERSIONED = {"fleet_version": "counts", "evidence_version": "evidence"}


@dataclass(frozen=True)
class Event:
    seq: int
    id: str
    change: Change


class Subscription:
    """One open stream: woken (from any thread) when the ring grows."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.ready = asyncio.Event()

    def wake(self) -> None:
        with contextlib.suppress(RuntimeError):  # its loop closed: the stream is gone
            self._loop.call_soon_threadsafe(self.ready.set)


class EventHub:
    def __init__(
        self,
        ring_size: int,
        max_streams: int,
        heartbeat_s: float = 5.0,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.boot = secrets.token_hex(4)  # ids of another process mean nothing here
        self.max_streams = max_streams
        self.heartbeat_s = heartbeat_s
        self._now = now
        self._lock = threading.Lock()
        self._ring: deque[Event] = deque(maxlen=ring_size)
        self._seq = 0
        # weak: a stream whose response never started (the caller left at once) never
        # runs its generator's ``finally``; its subscription goes with the generator
        self._subs: weakref.WeakSet[Subscription] = weakref.WeakSet()
        self._snapshot: ConfigSnapshot | None = None
        self._versions: dict[str, int] | None = None
        self._expired: set[tuple[str, int]] = set()

    # ------------------------------------------------------------ fed by live.py

    def config_changed(self, snapshot: ConfigSnapshot) -> None:
        """A snapshot taken into force (``LiveConfig``'s ``on_snapshot``)."""
        with self._lock:
            before, self._snapshot = self._snapshot, snapshot
            if before is None:  # what had expired at the start is nobody's news
                self._expired = {
                    (o.cluster, o.revision)
                    for o in snapshot.overrides
                    if o.expires_at is not None and o.expires_at <= self._now()
                }
            self._publish(config_changes(before, snapshot))

    def versions_read(self, versions: Mapping[str, int]) -> None:
        """One round of the config poller (``LiveConfig``'s ``on_versions``)."""
        with self._lock:
            changes: list[Change] = []
            if self._versions is not None:
                for key, kind in _VERSIONED.items():
                    if versions.get(key, 0) != self._versions.get(key, 0):
                        changes.append(Change(kind, None, {"version": versions.get(key, 0)}))
            self._versions = dict(versions)
            if self._snapshot is not None:
                changes += expired_since(self._snapshot, self._expired, self._now())
            self._publish(changes)

    def _publish(self, changes: list[Change]) -> None:
        if not changes:
            return
        for change in changes:
            self._seq += 1
            self._ring.append(Event(self._seq, f"{self.boot}-{self._seq}", change))
        for sub in list(self._subs):
            sub.wake()

    # ------------------------------------------------------------ read by streams

    def subscribe(self) -> Subscription | None:
        """A new stream's subscription, or None when this replica has its fill."""
        with self._lock:
            if len(self._subs) >= self.max_streams:
                return None
            sub = Subscription(asyncio.get_running_loop())
            self._subs.add(sub)
            return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            self._subs.discard(sub)

    @property
    def open_streams(self) -> int:
        return len(self._subs)

    def resume_point(self, last_id: str | None) -> int | None:
        """The sequence number to send the events after: now's when ``last_id`` is
        None, ``last_id``'s when the ring still holds everything after it, else None
        (read everything again): the id is another process's, malformed, or older
        than the ring holds."""
        with self._lock:
            if last_id is None:
                return self._seq
            boot, _, seq_text = last_id.partition("-")
            # ASCII digits only: str.isdigit() also takes "²", which int() refuses
            digits = seq_text.isascii() and seq_text.isdigit()
            if boot != self.boot or not digits or int(seq_text) > self._seq:
                return None
            seq = int(seq_text)
            oldest = self._ring[0].seq if self._ring else self._seq + 1
            return None if seq < oldest - 1 else seq

    def _after(self, seq: int) -> list[Event]:
        with self._lock:
            return [e for e in self._ring if e.seq > seq]

    async def stream(
        self,
        sub: Subscription,
        may_see: Callable[[str], bool],
        last_id: str | None,
        lifetime_s: float = 600.0,
        render: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        still_valid: Callable[[], Awaitable[bool]] | None = None,
        recheck_s: float = RECHECK_S,
    ) -> AsyncIterator[dict[str, str]]:
        """What one stream sends, as sse-starlette's dicts: a ``hello`` first (its id
        the point the stream resumes from), ``resync`` when what was missed is not
        kept, then every event after that point this caller may see. Ends when the
        caller goes (the response stops iterating) or after ``lifetime_s``: the
        caller then comes back with ``Last-Event-ID`` and is authenticated again, so a
        revoked token or an ended session hears no more than that. ``render``: an
        event's data as this caller may read it (a rollout's halt told in its words:
        the route hands ``reads/scope``'s rendering in, so that live updates never
        depend on the reads). ``still_valid`` asks every
        ``recheck_s`` whether the caller may still read (a session signed out or
        revoked, a token revoked): when not, an ``ended`` event closes the stream.
        ``sub`` is let go here."""
        loop = asyncio.get_running_loop()
        ends = loop.time() + lifetime_s
        check_at = loop.time() + recheck_s
        try:
            seq = self.resume_point(last_id)
            resync = seq is None
            if seq is None:
                seq = self.resume_point(None) or 0
            hello = {"boot": self.boot, "resync": resync, "heartbeat_s": self.heartbeat_s}
            yield {"event": "hello", "id": f"{self.boot}-{seq}", "data": json.dumps(hello)}
            if resync:
                yield {"event": "resync", "data": json.dumps({"reason": "missed events not kept"})}
            while True:
                sub.ready.clear()  # before reading: a wake after this read is kept
                events = self._after(seq)
                for event in events:
                    seq = event.seq
                    if event.change.cluster is None or may_see(event.change.cluster):
                        yield _wire(event, render)
                if still_valid is not None and loop.time() >= check_at:
                    check_at = loop.time() + recheck_s
                    if not await still_valid():
                        yield {"event": "ended", "data": json.dumps({"reason": ENDED})}
                        return
                if not events:
                    wake = ends if still_valid is None else min(ends, check_at)
                    try:
                        await asyncio.wait_for(sub.ready.wait(), wake - loop.time())
                    except TimeoutError:
                        if loop.time() >= ends:
                            return
        finally:
            self.unsubscribe(sub)


def _wire(
    event: Event, render: Callable[[dict[str, Any]], dict[str, Any]] | None = None
) -> dict[str, str]:
    data = dict(event.change.data)
    if render is not None:
        data = render(data)
    if event.change.cluster is not None:
        data.setdefault("cluster", event.change.cluster)
    return {"event": event.change.kind, "id": event.id, "data": json.dumps(data)}
