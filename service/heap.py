"""Free memory handed back to the system after a large load, where the C library can.

A start or a full reload makes and frees hundreds of thousands of objects and tens of
MB of buffers (driver rows, decoded parts, sort pieces). glibc's malloc keeps freed
memory in its arenas for reuse and returns only the top of each heap by itself, so a
replica's RSS stays at the load's peak although nothing uses it. ``malloc_trim(0)``
returns the free pages of every arena (``madvise``), without moving anything. Elsewhere
(musl, macOS) this is a no-op: those allocators behave differently and have no such call.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform
from collections.abc import Callable

__all__ = ["trim_free_memory"]


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library is not glibc."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim  # type: ignore[no-any-return]


def trim_free_memory() -> bool:
    """Hand the C library's free pages back to the system; True when glibc says it
    released some (it does not say how much). False where there is no such call."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False
