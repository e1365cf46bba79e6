"""The drainer alone: its states (up, failing, stalled), its backoff and what it does
with a batch the database refuses for its content, against a fake store."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from mla_switchboard.service.metrics import Metrics
from mla_switchboard.service.store.recording.drainer import MAX_BACKOFF_S, Drainer
from sqlalchemy.exc import DataError

from tests.reliability.conftest import counter, row, wait_until


class FakeStore:
    """Fails while ``error`` is set, refuses rows whose id is in ``refuse``, waits while
    ``answering`` is clear."""

    def __init__(self) -> None:
        self.rows: list[str] = []
        self.error: Exception | None = None
        self.refuse: set[str] = set()
        self.answering = threading.Event()
        self.answering.set()

    def record_rows(self, rows: Sequence[tuple[Any, ...]]) -> None:
        self.answering.wait()
        if self.error is not None:
            raise self.error
        if any(r[0] in self.refuse for r in rows):
            raise DataError("INSERT", {}, ValueError("value too long for type varchar(26)"))
        self.rows.extend(r[0] for r in rows)


def drainer(store: FakeStore, metrics: Metrics, stall_s: float = 5.0) -> Drainer:
    return Drainer(store, metrics, 0.01, stall_s)  # type: ignore[arg-type]


def test_backoff_doubles_from_100_ms_to_2_s_and_resets_once_the_store_answers() -> None:
    store, metrics = FakeStore(), Metrics()
    d = drainer(store, metrics)
    store.error = ConnectionError("connection refused")
    seen = []
    for _ in range(7):
        assert not d.write([row(1)])
        seen.append(d.backoff_s)
    assert seen == [0.1, 0.2, 0.4, 0.8, 1.6, MAX_BACKOFF_S, MAX_BACKOFF_S]
    assert d.degraded == "ConnectionError: connection refused"
    assert counter(metrics, "switchboard_store_errors_total", op="record_decisions") == 7
    store.error = None
    assert d.write([row(1)])
    assert d.degraded is None and d.backoff_s == 0.0
    assert counter(metrics, "switchboard_decisions_written_total") == 1


def test_the_stall_bound_follows_the_slowest_recent_write_within_floor_and_ceiling() -> None:
    d = drainer(FakeStore(), Metrics(), stall_s=0.2)
    assert d.stall_bound() == 0.2
    d._recent.append(0.3)
    assert abs(d.stall_bound() - 0.9) < 1e-9  # three times the slowest
    d._recent.append(5.0)
    assert d.stall_bound() == 2.0  # never past the ceiling


def test_a_hung_write_is_stalled_while_in_flight_and_up_once_it_ends() -> None:
    store, metrics = FakeStore(), Metrics()
    d = drainer(store, metrics, stall_s=0.05)
    store.answering.clear()
    done = threading.Event()
    thread = threading.Thread(target=lambda: (d.write([row(1)]), done.set()))
    thread.start()
    wait_until(lambda: d.degraded is not None, 5, what="stalled")
    assert d.degraded is not None and d.degraded.startswith("StoreStalled")
    store.answering.set()
    assert done.wait(5)
    thread.join()
    assert d.degraded is None and store.rows == ["id00001"]


def test_a_batch_refused_for_its_content_is_written_row_by_row() -> None:
    store, metrics = FakeStore(), Metrics()
    store.refuse = {"id00002"}
    d = drainer(store, metrics)
    assert d.write([row(1), row(2), row(3)])  # the batch is done: one row refused
    assert store.rows == ["id00001", "id00003"]
    assert counter(metrics, "switchboard_decisions_rejected_total") == 1
    assert d.degraded is None
