"""Time-ordered identifiers, so that "newest first" is an index scan on the id."""

from __future__ import annotations

import os
import time

_last_ms = 0
_seq = 0


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
    return f"{now:012x}{_seq:04x}{os.urandom(5).hex()}"
