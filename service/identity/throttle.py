"""Wrong bearer tokens, counted per client address: past a limit in a window, 429.

A client trying tokens one after another got 401 after 401 (6,000 in a row), with
nothing to slow it or show it. This counts each wrong token (present but unknown,
revoked or malformed) against the address it came from, in fixed windows of
``window_s``: once an address has sent ``limit`` wrong tokens in its window, its further
wrong tokens are answered 429 with ``Retry-After`` (the seconds left in that window)
until the window ends.

Only failures are ever looked at: the token is checked first, and a valid token is
answered as usual whatever its address has sent (a fleet behind one NAT address, with
one misconfigured pod, keeps working). A request without a token is not counted: it
guesses nothing, and is answered 401 as before. Throttled attempts do not extend the
window, so a stuck client gets its 401 again (and its message) once the window ends.

Memory is bounded whatever the number of addresses: at most ``max_addresses`` are
kept, the one that failed least recently is dropped for a new one (an attacker with
more addresses than that can have a dropped address start a fresh window: the limit
then bounds attempts per address per window, not in total).
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from mla_switchboard.service.metrics import Metrics

WINDOW_S = 60.0
MAX_ADDRESSES = 10_000  # about 200 bytes each: a few MB at most


class FailureThrottle:
    """Per-address count of wrong tokens in fixed windows (``limit`` 0: off, every
    wrong token is answered 401 and counted as rejected)."""

    def __init__(
        self,
        limit: int,
        metrics: Metrics,
        *,
        window_s: float = WINDOW_S,
        max_addresses: int = MAX_ADDRESSES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.window_s = window_s
        self.max_addresses = max_addresses
        self._clock = clock
        # address -> [window start, wrong tokens in it]; least recently failed first
        self._windows: OrderedDict[str, list[float]] = OrderedDict()
        self._lock = threading.Lock()  # routes check tokens from threads too
        self._rejected = metrics.auth_failures.labels("rejected")
        self._throttled = metrics.auth_failures.labels("throttled")

    def wrong_token(self, address: str) -> int | None:
        """A wrong token came from ``address``: None to answer 401 (it is counted), or
        the seconds until the address's window ends, to answer 429 (not counted)."""
        if self.limit <= 0:
            self._rejected.inc()
            return None
        now = self._clock()
        with self._lock:
            window = self._windows.get(address)
            if window is None or now - window[0] >= self.window_s:
                window = [now, 0.0]
                self._windows[address] = window
                if len(self._windows) > self.max_addresses:
                    self._windows.popitem(last=False)
            self._windows.move_to_end(address)
            if window[1] >= self.limit:
                retry = max(1, math.ceil(window[0] + self.window_s - now))
                self._throttled.inc()
                return retry
            window[1] += 1
        self._rejected.inc()
        return None

    def __len__(self) -> int:
        """Addresses held (bounded by ``max_addresses``)."""
        return len(self._windows)
