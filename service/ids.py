"""Time-ordered identifiers, so that "newest first" is an index scan on the id."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

_last_ms = 0
_seq = 0

# Random parts are read from the OS in batches: one system call per id cost about as
# much as the rest of new_id. next() on a list iterator is atomic under the GIL, so
# threads never share a part; a forked child starts a batch of its own.
_BATCH = 256
_parts: Iterator[str] = iter(())


def _refill() -> None:
    global _parts
    pool = os.urandom(5 * _BATCH).hex()
    _parts = iter([pool[i : i + 10] for i in range(0, len(pool), 10)])


os.register_at_fork(after_in_child=_refill)


def _random_part() -> str:
    part = next(_parts, None)
    while part is None:
        _refill()
        part = next(_parts, None)
    return part


def new_id() -> str:
    """A 26-char id: 12 hex chars of Unix milliseconds, 4 of sequence, 10 random.

    Ids made in one process sort by creation; across replicas they sort by
    millisecond, which is all the listing needs (ties break on the random part).
    """
    global _last_ms, _seq
    now = int(time.time() * 1000)
    if now == _last_ms:
        _seq = (_seq + 1) & 0xFFFF
    else:
        _last_ms, _seq = now, 0
    return f"{now:012x}{_seq:04x}{_random_part()}"
