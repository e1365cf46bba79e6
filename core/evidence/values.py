"""Every counted TFLOP/s of a tally, kept sorted (``sortedcontainers.SortedList``):
an insertion or removal is a binary search and a short move within one of its
sublists, and the median a walk over its sublists' lengths (:func:`median`).

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
    """The median of sorted ``values`` (None when there is none), read off its
    sublists rather than through ``values[mid]``.

    Why: past two sublists (about 2,000 values) ``values[mid]`` reaches the middle
    through the list's positional index, which the list then keeps up to date on every
    insertion and builds again after every split. Ten situations of 1,000 pods never
    needed it and one of 10,000 did, so a report into a big situation cost more than
    one into a small one (five times the pods grew the tally's work 1.16x more than
    five times the situations did). Walking the sublists' lengths from the nearer end
    builds nothing: a few hundred nanoseconds per sublist passed, half of them at
    most (about 100 at 200,000 values). ``_lists`` is the list's own storage
    (sortedcontainers 2, pinned in .ci/constraints.txt)."""
    n = len(values)
    if n == 0:
        return None
    mid = n // 2
    upper = _at(values._lists, n, mid)
    return upper if n % 2 else (_at(values._lists, n, mid - 1) + upper) / 2


def _at(lists: list[list[float]], n: int, i: int) -> float:
    """The ``i``-th of the ``n`` values held in ``lists`` (sorted sublists, in order),
    walked from whichever end is nearer."""
    if i < n - i:
        for sub in lists:
            if i < len(sub):
                return sub[i]
            i -= len(sub)
    else:
        j = n - 1 - i
        for sub in reversed(lists):
            if j < len(sub):
                return sub[len(sub) - 1 - j]
            j -= len(sub)
    raise IndexError(i)


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
