"""The in-memory copy of rules, overrides and tokens that the hot path reads.

``/v1/select`` never touches the database: it reads the current ``ConfigSnapshot``
(one attribute read, swapped atomically). A poller reloads the snapshot when another
replica bumps ``config_version``, so a write on one replica is honoured by all within
``config_poll_s`` (0.5 s by default). When the database is unreachable the last
snapshot stays in force and the service reports itself degraded, not unready.
"""

from __future__ import annotations

import logging
import threading

from service.metrics import Metrics
from service.store.repo import ConfigSnapshot, Store

log = logging.getLogger("switchboard.live")


class LiveConfig:
    def __init__(self, store: Store, metrics: Metrics, poll_s: float) -> None:
        self._store = store
        self._metrics = metrics
        self._poll_s = poll_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.snapshot: ConfigSnapshot | None = None
        self.degraded: str | None = None

    def reload(self) -> ConfigSnapshot:
        """Load the snapshot now (after our own writes, and at start)."""
        with self._lock:
            snap = self._store.load_config()
            if self.snapshot is None or snap.version >= self.snapshot.version:
                self.snapshot = snap
            self._metrics.config_version.set(self.snapshot.version)
            return self.snapshot

    def start(self) -> None:
        self.reload()
        self._thread = threading.Thread(target=self._poll, name="config-poller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _poll(self) -> None:
        while not self._stop.wait(self._poll_s):
            try:
                version = self._store.config_version()
                if self.snapshot is None or version != self.snapshot.version:
                    self.reload()
                if self.degraded is not None:
                    log.warning("config store reachable again")
                self.degraded = None
            except Exception as exc:
                if self.degraded is None:
                    log.warning("config store unreachable, serving the rules in memory: %s", exc)
                self.degraded = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                self._metrics.store_errors.labels(op="config_poll").inc()
