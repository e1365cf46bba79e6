"""Reports stored in groups (``store/report_writes.py``): reports waiting together share
one transaction and one move of ``evidence_version``; a report_id stored before, or
twice in one group, is stored once; a report whose request stopped waiting before its
group committed is not stored; a group the database refuses is stored one report at a
time, so only the report that cannot be stored fails."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from mla_switchboard.service.ids import new_id
from mla_switchboard.service.store import Store
from mla_switchboard.service.store.deadline import StoreTimeout
from mla_switchboard.service.store.measurements import PendingReport
from mla_switchboard.service.store.models import MeasurementRow
from mla_switchboard.service.store.report_writes import ReportWriter
from sqlalchemy import event, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from tests.service.test_evidence_reload import report as evidence_report


def pending(report_id: str | None = None, pod: str = "pod-1") -> PendingReport:
    report = evidence_report("prod", pod, 500.0, report_id, ("FLASHINFER", "FLASH_ATTN"))
    # no situation to check: the report counts (the stored decisions' lookup is tested
    # in tests/service/test_report_costs.py)
    return PendingReport(report, report_id or new_id(), None, "agent")


def rows(store: Store) -> list[str]:
    with Session(store.engine) as s:
        return list(s.scalars(select(MeasurementRow.report_id).order_by(MeasurementRow.id)))


def evidence_version(store: Store) -> int:
    return int(store.config.versions()["evidence_version"])


@contextmanager
def held_inserts(store: Store) -> Iterator[tuple[threading.Event, threading.Event]]:
    """The writer's inserts wait until ``release`` is set (its batch is open
    meanwhile); ``entered`` is set once one waits."""
    entered, release = threading.Event(), threading.Event()

    def hold(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO MEASUREMENTS"):
            entered.set()
            assert release.wait(60)

    event.listen(store.engine, "before_cursor_execute", hold)
    try:
        yield entered, release
    finally:
        release.set()
        event.remove(store.engine, "before_cursor_execute", hold)


@pytest.fixture
def writer(store: Store) -> Iterator[ReportWriter]:
    w = ReportWriter(store.engine)
    yield w
    w.stop()


def test_reports_waiting_together_share_one_transaction(store: Store, writer: ReportWriter) -> None:
    before = evidence_version(store)
    with held_inserts(store) as (entered, release):
        first = writer.submit(pending())
        assert entered.wait(60)  # the first batch (of one) is open
        rest = [writer.submit(pending(pod=f"pod-{i}")) for i in range(20)]
        release.set()
        answers = [t.wait(60) for t in (first, *rest)]
    assert all(a is not None and a.counted and a.results == 2 for a in answers)
    assert len(rows(store)) == 42
    assert writer.batches == 2  # the one open, then the twenty that waited for it
    assert evidence_version(store) - before == 2  # one move per batch


def test_a_report_id_is_stored_once(store: Store, writer: ReportWriter) -> None:
    rid = new_id()
    assert writer.store(pending(rid), 60) is not None
    assert writer.store(pending(rid), 60) is None  # a retry: nothing added
    other = new_id()
    with held_inserts(store) as (entered, release):
        opener = writer.submit(pending())
        assert entered.wait(60)
        twice = [writer.submit(pending(other)), writer.submit(pending(other))]
        release.set()
        opener.wait(60)
        answers = [t.wait(60) for t in twice]
    assert answers[0] is not None and answers[1] is None  # the same id twice in one batch
    assert rows(store).count(rid) == 2 and rows(store).count(other) == 2  # 2 results each


def test_a_report_given_up_before_the_commit_is_not_stored(
    store: Store, writer: ReportWriter
) -> None:
    late_id = "late-report-given-up"
    with held_inserts(store) as (entered, release):
        late = writer.submit(pending(late_id))
        assert entered.wait(60)  # its batch is open, not committing
        with pytest.raises(StoreTimeout) as raised:
            late.wait(0.2)
        assert raised.value.outcome_unknown is False  # nothing was changed
        kept = writer.submit(pending())
        release.set()
        assert kept.wait(60) is not None
    assert late_id not in rows(store)
    assert len(rows(store)) == 2


def test_a_refused_batch_is_stored_one_report_at_a_time(store: Store, writer: ReportWriter) -> None:
    """Every insert holding one report is refused: its batch fails (on the connection
    kept, then once more on a new one), then each report is tried alone: only that one
    fails, with the store's error."""
    bad = "bad-report"
    refused: list[int] = []
    armed = threading.Event()

    def refuse(_conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if not armed.is_set() or not statement.lstrip().upper().startswith("INSERT INTO MEAS"):
            return
        if bad in str(params):
            refused.append(len(params) if isinstance(params, list) else 1)
            raise OperationalError(statement, {}, Exception("refused"))

    event.listen(store.engine, "before_cursor_execute", refuse)
    try:
        with held_inserts(store) as (entered, release):
            opener = writer.submit(pending())
            assert entered.wait(60)
            tickets = [writer.submit(pending(f"good-report-{i}")) for i in range(3)]
            failing = writer.submit(pending(bad))
            armed.set()
            release.set()
            opener.wait(60)
            assert all(t.wait(60) is not None for t in tickets)
            with pytest.raises(OperationalError):
                failing.wait(60)
    finally:
        event.remove(store.engine, "before_cursor_execute", refuse)
    # the batch's rows, on the kept connection and on a new one; then the bad report's
    # alone, likewise (the good ones, alone, are stored)
    assert refused == [8, 8, 2, 2]
    assert bad not in rows(store) and len(rows(store)) == 8


def test_counted_evidence_is_applied_before_the_answer(store: Store) -> None:
    applied: list[int] = []
    w = ReportWriter(store.engine, on_stored=lambda fresh: applied.append(len(fresh)))
    try:
        p = pending()
        p.observations = ["an observation"]  # type: ignore[list-item]
        assert w.store(p, 60) is not None
        assert applied == [1]
        assert w.store(pending(p.report_id), 60) is None  # a duplicate adds nothing
        assert applied == [1]
    finally:
        w.stop()
