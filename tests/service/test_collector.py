"""Background work keeps the cycle collector off the event loop's back
(``service/collector.py``) and frees what it made a piece at a time
(``service/priority.py``): the collector is paused while a job runs and resumed as it
was, what survives is frozen, a thaw bounds what freezing leaks, and a read's memo is
emptied entry by entry after it."""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Iterator

import pytest
from mla_switchboard.service import priority
from mla_switchboard.service.collector import Collector, paused
from mla_switchboard.service.priority import (
    empty_gradually,
    release_later,
    releasing_gradually,
)


@pytest.fixture(autouse=True)
def collector_as_found() -> Iterator[None]:
    enabled = gc.isenabled()
    yield
    if enabled:
        gc.enable()
    else:
        gc.disable()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Cycle:
    """Garbage only the cycle collector frees."""

    def __init__(self) -> None:
        self.me = self


def test_a_paused_block_stops_automatic_collection_and_resumes_it() -> None:
    gc.enable()
    collector = Collector()
    with collector.paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_left_disabled_stays_disabled() -> None:
    gc.disable()
    with Collector().paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_overlapping_blocks_of_two_threads_resume_only_when_both_end() -> None:
    gc.enable()
    collector = Collector()
    inside, leave = threading.Event(), threading.Event()

    def other() -> None:
        with collector.paused():
            inside.set()
            leave.wait(5)

    thread = threading.Thread(target=other)
    with collector.paused():
        thread.start()
        assert inside.wait(5)
    assert not gc.isenabled(), "the other thread's job still runs"
    leave.set()
    thread.join(5)
    assert gc.isenabled()


def test_what_survives_a_job_is_frozen() -> None:
    collector = Collector(thaw_every_s=1e9)
    before = gc.get_freeze_count()
    # No other thread of this process (a test runner's, an app's) may run between the
    # freeze and the count: with a long switch interval this thread keeps the GIL, as
    # it does no I/O in between.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(60.0)
    try:
        with collector.paused():
            kept = [[i] for i in range(1000)]  # lists are always tracked
        young = gc.get_count()[0]
    finally:
        sys.setswitchinterval(interval)
    assert gc.get_freeze_count() >= before + 1000
    assert young < 100  # nothing young left for the next collection
    del kept


def test_a_thaw_collects_frozen_cycles_once_grown_and_due() -> None:
    clock = Clock()
    collector = Collector(thaw_growth=0.0, thaw_every_s=600, clock=clock)
    with collector.paused():
        cycles = [Cycle() for _ in range(200)]
    del cycles  # unreachable, but frozen: leaked until a thaw
    assert collector.thaws == 0
    clock.now = 599
    with collector.paused():
        pass
    assert collector.thaws == 0, "not before thaw_every_s"
    clock.now = 600
    with collector.paused():
        pass
    assert collector.thaws == 1
    gc.unfreeze()
    assert gc.collect() < 200, "the thaw collected the frozen cycles"
    gc.freeze()


def test_no_thaw_while_little_was_frozen() -> None:
    clock = Clock()
    collector = Collector(thaw_growth=0.5, thaw_every_s=0, clock=clock)
    threshold = gc.get_threshold()
    collector.settle_at_start()  # counts what is frozen: growth is measured against it
    gc.set_threshold(*threshold)
    clock.now = 1e6
    with collector.paused():
        kept = [[i] for i in range(100)]
    assert collector.thaws == 0
    del kept


def test_without_a_collector_nothing_is_paused() -> None:
    gc.enable()
    with paused(None):
        assert gc.isenabled()


# ------------------------------------------------------------- gradual release


def test_dicts_released_later_are_emptied_when_the_block_ends() -> None:
    with releasing_gradually():
        memo = release_later({i: [i] for i in range(100)})
        assert len(memo) == 100
    assert memo == {}


def test_outside_a_block_nothing_is_emptied() -> None:
    memo = release_later({1: 2})
    with releasing_gradually():
        pass
    assert memo == {1: 2}


def test_a_nested_block_empties_its_own_and_leaves_the_outer_ones() -> None:
    with releasing_gradually():
        outer = release_later({1: 1})
        with releasing_gradually():
            inner = release_later({2: 2})
        assert inner == {} and outer == {1: 1}
    assert outer == {}


def test_what_others_still_hold_survives_the_release() -> None:
    shared = ["kept"]
    with releasing_gradually():
        release_later({"a": shared})
    assert shared == ["kept"]


def test_a_large_release_lets_the_loop_in(monkeypatch: pytest.MonkeyPatch) -> None:
    let_in = [0]
    monkeypatch.setattr(priority, "let_the_loop_in", lambda: let_in.__setitem__(0, let_in[0] + 1))
    monkeypatch.setattr(priority, "HAND_OVER_EVERY_S", 0.0)
    empty_gradually({i: [i] for i in range(10_000)})
    assert let_in[0] >= 10_000 // 32 - 1
