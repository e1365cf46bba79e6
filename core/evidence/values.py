"""Every counted TFLOP/s of a tally, kept sorted (``sortedcontainers.SortedList``):
an insertion or removal is a binary search and a short move within one of its
sublists, and the median a positional lookup in its index, whatever the samples.

A bulk load sorts instead of inserting one by one, in pieces, so that it never holds
the interpreter for one sort of everything (200,000 values took 80 ms on one slow
core), then hands the sorted values to the list at once."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

from sortedcontainers import SortedList

__all__ = ["PIECE", "SPLITTER_EVERY", "median", "sorted_in_pieces"]

PIECE = 8192
"""Values :func:`sorted_in_pieces` sorts in one call (a millisecond or two)."""
SPLITTER_EVERY = 256
"""One value in this many cuts the sorted pieces into bins (about this many values
each)."""


def median(values: SortedList) -> float | None:
    """The median of sorted ``values`` (None when there is none)."""
    n = len(values)
    if n == 0:
        return None
    mid = n // 2
    return values[mid] if n % 2 else (values[mid - 1] + values[mid]) / 2  # type: ignore[no-any-return]


def sorted_in_pieces(
    values: Sequence[float],
    pause: Callable[[], None] = lambda: None,
    *,
    piece: int = PIECE,
    splitter_every: int = SPLITTER_EVERY,
) -> SortedList:
    """``values`` (in any order) as a ``SortedList``, sorted in steps of at most
    ``piece`` values with ``pause`` between them.

    Every ``splitter_every``-th value is a splitter; each piece is sorted and cut at
    the splitters into bins, which hold about ``splitter_every`` values each, in order;
    each bin (runs already sorted) is then merged, and the bins laid end to end are the
    whole sorted: what the list is given, so its own sort is one pass over sorted
    values."""
    if not values:
        return SortedList()
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
    return SortedList(ordered)
