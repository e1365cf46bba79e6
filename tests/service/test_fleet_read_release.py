"""What a fleet read built is let go of after its answer is handed back, on the
fleet-read thread, with the collector paused until then (nothing of it frozen), also
when the replica stops before that job ran."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest
from mla_switchboard.service.collector import Collector
from mla_switchboard.service.fleet.reads import FleetReads
from mla_switchboard.service.priority import release_later

from tests.service.test_fleet_read_budget import Trusted, reads


class Freed:
    """Notes, as it is freed, whether the read's answer was out by then (waiting a
    little for it: freed before the answer, it never is) and whether collection was
    off."""

    def __init__(self, answered: threading.Event, seen: list[tuple[bool, bool]]) -> None:
        self.answered, self.seen = answered, seen

    def __del__(self) -> None:
        self.seen.append((self.answered.wait(2), gc.isenabled()))


@pytest.fixture
def fleet_reads() -> Iterator[FleetReads]:
    was = gc.isenabled()
    gc.enable()
    r = reads(Trusted(), budget_s=5)
    r.collector = Collector(freezes=False)
    yield r
    r.close()
    if not was:
        gc.disable()


def test_a_read_answers_before_what_it_built_is_let_go_of(fleet_reads: FleetReads) -> None:
    answered, seen = threading.Event(), []

    def compute() -> str:
        release_later({"memo": Freed(answered, seen)})
        return "the answer"

    assert fleet_reads._serially(compute) == "the answer"
    answered.set()
    fleet_reads._worker.submit(lambda: None).result()  # what was queued before has run
    assert seen == [(True, False)]  # after the answer, the collector still paused
    assert gc.isenabled()  # and resumed once let go of


def test_a_replica_that_stops_first_still_lets_go_and_resumes_collection(
    fleet_reads: FleetReads,
) -> None:
    answered, seen, blocked = threading.Event(), [], threading.Event()

    def compute() -> str:
        release_later({"memo": Freed(answered, seen)})
        fleet_reads._worker.submit(blocked.wait)  # runs before the letting go
        return "the answer"

    try:
        assert fleet_reads._serially(compute) == "the answer"
        answered.set()
        assert seen == []
        fleet_reads.close()  # cancels the queued letting go, which then runs here
    finally:
        blocked.set()
    assert seen == [(True, False)]
    assert gc.isenabled()
