"""Results kept per key and computed once, however many callers ask at the same time.

Fleet reads (the summary, previews) are keyed by every version they depend on (the
configuration, the evidence, the fleet's counts, the caller's scope): a kept result
is right until one of those moves, so a dashboard polling a quiet fleet costs a
lookup, and ten admins opening the same preview at once cost one computation.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class _Flight(Generic[T]):
    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: T | None = None
        self.error: BaseException | None = None


class Computed(Generic[T]):
    """An LRU of results by key, with single-flight computation of misses."""

    def __init__(self, size: int = 256) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._kept: OrderedDict[Hashable, T] = OrderedDict()
        self._flights: dict[Hashable, _Flight[T]] = {}
        self.computations = 0  # how many misses were computed (tests count them)

    def peek(self, key: Hashable) -> T | None:
        """The kept result, without computing (cheap enough for the event loop)."""
        with self._lock:
            return self._kept.get(key)

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        with self._lock:
            if key in self._kept:
                self._kept.move_to_end(key)
                return self._kept[key]
            flight = self._flights.get(key)
            leader = flight is None
            if flight is None:
                flight = self._flights[key] = _Flight()
        if not leader:
            flight.done.wait()
            if flight.error is not None:
                raise flight.error
            return flight.value  # type: ignore[return-value]
        try:
            value = compute()
        except BaseException as exc:
            flight.error = exc
            with self._lock:
                del self._flights[key]
            flight.done.set()
            raise
        flight.value = value
        with self._lock:
            self.computations += 1
            self._kept[key] = value
            while len(self._kept) > self._size:
                self._kept.popitem(last=False)
            del self._flights[key]
        flight.done.set()
        return value
