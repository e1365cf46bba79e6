"""The memory queue alone: its byte and count bounds, what it drops, and the count of
every decision's fate that a flush waits on."""

from __future__ import annotations

import logging
import threading

import pytest
from mla_switchboard.service.metrics import Metrics
from mla_switchboard.service.store.recording import memory_queue
from mla_switchboard.service.store.recording.memory_queue import MemoryQueue, row_bytes

from tests.reliability.conftest import counter, row

DROPPED = "switchboard_decisions_dropped_total"


def queue(metrics: Metrics, budget: int = 1 << 30, limit: int | None = None) -> MemoryQueue:
    return MemoryQueue(metrics, threading.Condition(), budget_bytes=budget, limit=limit)


def test_rows_are_counted_in_bytes_and_shared_texts_once() -> None:
    q = queue(Metrics())
    for i in range(10):
        q.submit(row(i))
    shared = q.buffered_bytes - sum(row_bytes(row(i)) for i in range(10))
    assert 0 < shared < 600  # one shape and one answer, not ten
    q.submit(row(10, shape="shape2"))
    assert q.buffered_bytes - shared - sum(row_bytes(row(i)) for i in range(11)) > 0
    assert q.pending == q.queued == 11 and q.submitted == 11


def test_past_the_byte_budget_new_decisions_are_refused_and_counted() -> None:
    """Before: the oldest were dropped, decisions whose ids pods already held. Now the
    new one is refused and its answer says so; every acknowledged one is kept."""
    metrics = Metrics()
    per_row = row_bytes(row(0))
    q = queue(metrics, budget=100 * per_row)
    taken = [q.submit(row(i)) for i in range(300)]
    assert q.buffered_bytes <= 100 * per_row
    kept = q.pending
    assert taken == [True] * kept + [False] * (300 - kept)
    assert kept + counter(metrics, DROPPED) == 300
    assert q.submitted == kept and q.settled() == 0  # refused ones were never queued
    assert q.take_batch(1)[0][0] == "id00000"  # the oldest kept
    assert q.settled_prefix() == 0  # the batch in flight has not settled


def test_the_count_limit_refuses_new_decisions_as_well() -> None:
    metrics = Metrics()
    q = queue(metrics, limit=50)
    for i in range(80):
        q.submit(row(i))
    assert q.pending == 50 and counter(metrics, DROPPED) == 30
    assert q.take_batch(1)[0][0] == "id00000"


def test_a_batch_put_back_is_first_in_line_in_its_order() -> None:
    q = queue(Metrics())
    for i in range(10):
        q.submit(row(i))
    batch = q.take_batch(4)
    assert [r[0] for r in batch] == [f"id{i:05d}" for i in range(4)]
    assert q.pending == 10 and q.queued == 6  # in flight counts as pending
    q.put_back(batch[2:])
    assert q.pending == 8
    assert [r[0] for r in q.take_batch(3)] == ["id00002", "id00003", "id00004"]


def test_settled_rows_leave_memory_and_wake_a_waiter() -> None:
    metrics = Metrics()
    progress = threading.Condition()
    q = MemoryQueue(metrics, progress, budget_bytes=1 << 30)
    for i in range(10):
        q.submit(row(i))
    woken = threading.Event()

    def wait() -> None:
        with progress:
            progress.wait_for(lambda: q.settled() == 10, timeout=5)
        woken.set()

    waiter = threading.Thread(target=wait)
    waiter.start()
    first = q.take_batch(6)
    q.settle(first, written=5, refused=1)
    assert q.buffered_bytes > 0 and not woken.is_set()
    rest = q.take_batch(10)
    q.settle(rest, spilled=4)
    waiter.join(5)
    assert woken.is_set() and q.buffered_bytes == 0 and q.pending == 0
    assert counter(metrics, "switchboard_decisions_written_total") == 5


def test_take_all_and_drop_at_stop(caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics()
    q = queue(metrics)
    for i in range(5):
        q.submit(row(i))
    q.take_batch(2)
    assert [r[0] for r in q.take_all()] == [f"id{i:05d}" for i in range(5)]
    q.drop(5, "no spill path")
    q.forget_all()
    assert q.pending == 0 and q.buffered_bytes == 0 and q.settled() == 5
    assert counter(metrics, DROPPED) == 5
    assert "dropped 5 decisions at shutdown: the store could not take them and no spill path" in (
        caplog.text
    )
    caplog.clear()
    q.log_drops(None, force=True)
    assert "dropped" not in caplog.text  # already said


def test_drops_are_logged_as_one_line_at_most_every_few_seconds(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.ERROR, "switchboard.recorder")
    now = [1000.0]
    monkeypatch.setattr(memory_queue.time, "monotonic", lambda: now[0])
    q = queue(Metrics(), limit=1)
    for i in range(4):
        q.submit(row(i))
    q.log_drops("full: SWITCHBOARD_SPILL_LIMIT_MB (1) reached")
    q.submit(row(4))
    now[0] += 1.0
    q.log_drops(None)  # too soon
    assert len(caplog.records) == 1
    assert "dropped 3 decisions" in caplog.text and "full: SWITCHBOARD_SPILL_LIMIT_MB" in (
        caplog.text
    )
    now[0] += memory_queue.DROP_LOG_S
    q.log_drops(None)
    assert len(caplog.records) == 2
    assert "dropped 1 decisions" in caplog.records[1].getMessage()
    assert "(the writer fell behind); 4 dropped since start" in caplog.records[1].getMessage()
