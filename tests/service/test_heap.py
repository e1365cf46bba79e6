"""Free memory handed back after a large load: glibc's malloc_trim where there is one,
nothing elsewhere."""

from __future__ import annotations

import platform

import pytest
from mla_switchboard.service import heap


def test_memory_freed_by_a_large_load_is_handed_back_on_glibc() -> None:
    if platform.libc_ver()[0] != "glibc":
        pytest.skip("malloc_trim is glibc's")
    # every second block freed: holes that the heap's top cannot give back by itself
    blocks = [bytearray(64 * 1024) for _ in range(2000)]
    kept = blocks[1::2]
    del blocks
    assert heap.trim_free_memory() is True
    assert len(kept) == 1000


def test_elsewhere_it_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    heap._malloc_trim.cache_clear()
    monkeypatch.setattr(platform, "libc_ver", lambda: ("musl", ""))
    try:
        assert heap._malloc_trim() is None
        assert heap.trim_free_memory() is False
    finally:
        heap._malloc_trim.cache_clear()
