"""Every counted TFLOP/s of a tally, kept sorted (``SortedHalves``: two
``sortedcontainers.SortedList``): an insertion or removal is a binary search and a
short move within one of their sublists, and the median the ends of the two halves,
whatever the samples.

A bulk load sorts instead of inserting one by one, in pieces, so that it never holds
the interpreter for one sort of everything (200,000 values took 80 ms on one slow
core), then hands the sorted values to the list at once."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterator, Sequence

from sortedcontainers import SortedList

__all__ = ["PIECE", "SPLITTER_EVERY", "SortedHalves", "median", "sorted_in_pieces"]

PIECE = 8192
"""Values :func:`sorted_in_pieces` sorts in one call (a millisecond or two)."""
SPLITTER_EVERY = 256
"""One value in this many cuts the sorted pieces into bins (about this many values
each)."""


class SortedHalves:
    """Values kept sorted as two halves: every value of ``low`` is at most every value
    of ``high``, and ``low`` holds as many as ``high`` or one more, so the median is
    the last of ``low`` (and the first of ``high``).

    Why not one ``SortedList``: its median is a value in the middle, which past two
    sublists (about 2,000 values) it reaches through a positional index that it then
    keeps up to date on every insertion and builds again after every split. Ten
    situations of 1,000 pods never needed it and one of 10,000 did, so a report into a
    big situation cost more than one into a small one (five times the pods grew the
    tally's work 1.16x more than five times the situations did; 1.01-1.03x with the
    halves). The ends of a ``SortedList`` are read, popped and added to without that
    index; the price is a rebalance (a pop and an add at the halves' ends) on about
    every other insertion."""

    __slots__ = ("high", "low")

    def __init__(self, ordered: Sequence[float] = ()) -> None:
        """``ordered``: values already in ascending order (a bulk load's)."""
        mid = (len(ordered) + 1) // 2
        self.low: SortedList = SortedList(ordered[:mid])
        self.high: SortedList = SortedList(ordered[mid:])

    def __len__(self) -> int:
        return len(self.low) + len(self.high)

    def __iter__(self) -> Iterator[float]:
        return itertools.chain(self.low, self.high)

    def add(self, value: float) -> None:
        low = self.low
        if low and value > low[-1]:
            self.high.add(value)
        else:
            low.add(value)
        self._balance()

    def remove(self, value: float) -> None:
        """Remove one ``value`` (ValueError when none is held, as ``SortedList``)."""
        high = self.high
        if high and value >= high[0]:
            high.remove(value)
        else:
            self.low.remove(value)
        self._balance()

    def _balance(self) -> None:
        low, high = self.low, self.high
        if len(low) > len(high) + 1:
            high.add(low.pop())
        elif len(high) > len(low):
            low.add(high.pop(0))

    def median(self) -> float | None:
        """The median (None when there is no value)."""
        low = self.low
        if not low:
            return None
        if (len(low) + len(self.high)) % 2:
            return low[-1]  # type: ignore[no-any-return]
        return (low[-1] + self.high[0]) / 2  # type: ignore[no-any-return]

    def copy(self) -> SortedHalves:
        copied = SortedHalves()
        copied.low, copied.high = self.low.copy(), self.high.copy()
        return copied

    def _check(self) -> None:
        """Both halves' own invariants, their order and their sizes (for tests)."""
        self.low._check()
        self.high._check()
        assert not self.low or not self.high or self.low[-1] <= self.high[0]
        assert len(self.high) <= len(self.low) <= len(self.high) + 1


def median(values: SortedHalves) -> float | None:
    """The median of ``values`` (None when there is none)."""
    return values.median()


def sorted_in_pieces(
    values: Sequence[float],
    pause: Callable[[], None] = lambda: None,
    *,
    piece: int = PIECE,
    splitter_every: int = SPLITTER_EVERY,
) -> SortedHalves:
    """``values`` (in any order) as ``SortedHalves``, sorted in steps of at most
    ``piece`` values with ``pause`` between them.

    Every ``splitter_every``-th value is a splitter; each piece is sorted and cut at
    the splitters into bins, which hold about ``splitter_every`` values each, in order;
    each bin (runs already sorted) is then merged, and the bins laid end to end are the
    whole sorted: what the halves are given, so their own sort is one pass over sorted
    values."""
    if not values:
        return SortedHalves()
    splitters = sorted(values[::splitter_every])[1:]
    bins: list[list[float]] = [[] for _ in range(len(splitters) + 1)]
    for start in range(0, len(values), piece):
        part = sorted(values[start : start + piece])
        lo = 0
        for b, splitter in enumerate(splitters):
            hi = bisect.bisect_left(part, splitter, lo)
            if hi > lo:
                bins[b] += part[lo:hi]
                lo = hi
        bins[-1] += part[lo:]
        pause()
    ordered: list[float] = []
    done = 0
    for found in bins:
        found.sort()
        ordered += found
        done += len(found)
        if done >= piece:
            done = 0
            pause()
    return SortedHalves(ordered)
