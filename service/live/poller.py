"""The in-memory copy of rules, overrides and tokens that the hot path reads.

``/v1/select`` never touches the database: it reads the current ``ConfigSnapshot``
(one attribute read, swapped atomically). A poller reloads the snapshot when another
replica bumps ``config_version``, so a write on one replica is honoured by all within
``config_poll_s`` (0.5 s by default). When the database is unreachable the last
snapshot stays in force and the service reports itself degraded, not unready. The
same read hands the evidence versions on (``on_versions``): the evidence is read and
applied by ``service/evidence/sync.py`` in a thread of its own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

from mla_switchboard.service.messages import first_line
from mla_switchboard.service.metrics import Metrics
from mla_switchboard.service.periodic import Periodic
from mla_switchboard.service.state import ConfigSnapshot
from mla_switchboard.service.store.config import ConfigStore

log = logging.getLogger("switchboard.live")

T = TypeVar("T")


class LiveConfig:
    def __init__(
        self,
        config: ConfigStore,
        metrics: Metrics,
        poll_s: float,
        on_versions: Callable[[Mapping[str, int]], None] = lambda _versions: None,
        on_snapshot: Callable[[ConfigSnapshot], None] = lambda _snap: None,
    ) -> None:
        self._config = config
        self._on_snapshot = on_snapshot
        self._on_versions = on_versions  # the evidence's versions ride on the same read
        self._metrics = metrics
        self._poller = Periodic("config-poller", poll_s, self._poll, log, housekeeping=False)
        self._lock = threading.Lock()
        self.snapshot: ConfigSnapshot | None = None
        self.checked_at: float | None = None  # monotonic: last time the store confirmed it
        self.degraded: str | None = None

    def current(self) -> ConfigSnapshot:
        """The snapshot in force (only once the first one was loaded)."""
        snap = self.snapshot
        assert snap is not None, "runtime not started"
        return snap

    def reload(self) -> ConfigSnapshot:
        """Load the snapshot now (after our own writes, and at start)."""
        with self._lock:
            snap = self._config.load_config(self.snapshot)
            self.checked_at = time.monotonic()
            if self.snapshot is None or snap.version >= self.snapshot.version:
                self.snapshot = snap
                self._on_snapshot(snap)
            self._metrics.config_version.set(self.snapshot.version)
            return self.snapshot

    def start(self) -> None:
        self.reload()
        self._poller.start()

    def stop(self) -> None:
        self._poller.stop()

    def _poll(self) -> None:
        """One round of the poller: its failures are said here (degraded), once."""
        try:
            versions = self._config.versions()
            version = versions.get("config_version", 0)
            if self.snapshot is None or version != self.snapshot.version:
                self.reload()
            else:
                self.checked_at = time.monotonic()
            # never blocks: the fleet and the evidence are read elsewhere
            self._on_versions(versions)
            if self.degraded is not None:
                log.warning("config store reachable again")
            self.degraded = None
        except Exception as exc:
            if self.degraded is None:
                log.warning("config store unreachable, serving the rules in memory: %s", exc)
            self.degraded = f"{type(exc).__name__}: {first_line(exc)}"
            self._metrics.store_errors.labels(op="config_poll").inc()


def fan_out(*listeners: Callable[[T], None]) -> Callable[[T], None]:
    """One ``on_versions`` (or ``on_snapshot``) that tells every listener what the
    poller read."""

    def tell(value: T) -> None:
        for listener in listeners:
            listener(value)

    return tell
