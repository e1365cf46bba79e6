"""The store writer alone: its states (up, down, stalled) and its retry policy, against
a fake store; no server, no database."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from mla_switchboard.service.metrics import Metrics
from mla_switchboard.service.store.recording.spill_log import SpillLog
from mla_switchboard.service.store.recording.writer import (
    MAX_BACKOFF_S,
    RetryPolicy,
    StoreState,
    StoreWriter,
)
from mla_switchboard.service.store.spill import SpillFile
from sqlalchemy.exc import DataError

from tests.reliability.conftest import counter, row


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


def writer(
    store: FakeStore, metrics: Metrics, spill: Path | None = None, **policy: Any
) -> StoreWriter:
    file = SpillFile(spill, 1 << 20) if spill else None
    log = SpillLog(file, metrics, threading.Condition())
    policy.setdefault("stall_s", 5.0)  # no stall from a loaded machine, unless tested
    return StoreWriter(store, metrics, RetryPolicy(0.01, **policy), log)  # type: ignore[arg-type]


# ------------------------------------------------------------ the retry policy


def test_backoff_doubles_from_100_ms_to_2_s_and_resets_once_the_store_answers() -> None:
    policy = RetryPolicy(0.01)
    seen = []
    for _ in range(8):
        policy.failed()
        seen.append(policy.backoff_s)
    assert seen == [0.1, 0.2, 0.4, 0.8, 1.6, MAX_BACKOFF_S, MAX_BACKOFF_S, MAX_BACKOFF_S]
    assert not policy.retry_due()
    policy.recovered()
    assert policy.backoff_s == 0.01


def test_the_stall_bound_follows_the_slowest_recent_write_within_floor_and_ceiling() -> None:
    policy = RetryPolicy(0.01)
    assert policy.stall_floor == 0.2 and policy.stall_bound() == 0.2  # at least 200 ms
    policy.took(0.1)
    assert policy.stall_bound() == pytest.approx(0.3)  # three times the slowest
    policy.took(5.0)
    assert policy.stall_bound() == policy.stall_ceiling == 2.0  # never past the ceiling
    assert RetryPolicy(1.0).stall_floor == 4.0  # four intervals
    assert RetryPolicy(1.0, stall_s=0.5).stall_floor == 0.5
    assert RetryPolicy(0.01, stall_s=3.0).stall_ceiling == 3.0


# ------------------------------------------------------------ the writer's states


def test_a_failing_store_is_down_until_a_write_goes_through(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = Metrics()
    store = FakeStore()
    w = writer(store, metrics)
    assert w.state is StoreState.UP and w.write([row(0)]) == 1
    store.error = ConnectionError("connection refused")
    assert w.write([row(1)]) is None
    assert w.state is StoreState.DOWN and not w.up
    assert w.degraded == "ConnectionError: connection refused"
    assert not w.retry_due()  # the backoff
    assert counter(metrics, "switchboard_store_errors_total", op="record_decisions") == 1
    store.error = None
    assert w.write([row(1)]) == 1
    assert w.state is StoreState.UP and w.degraded is None and w.attempts == 3
    assert store.rows == ["id00000", "id00001"]
    assert "decision store unavailable" in caplog.text and "decision store back" in caplog.text
    assert counter(metrics, "switchboard_decision_writer_cpu_seconds_total") > 0


def test_a_hung_write_is_stalled_until_its_outcome_is_collected() -> None:
    metrics = Metrics()
    store = FakeStore()
    w = writer(store, metrics, stall_s=0.05)
    store.answering.clear()
    assert w.write([row(0)]) is None
    assert w.state is StoreState.STALLED and w.degraded is not None
    assert w.degraded.startswith("StoreStalled: a write has not answered for 0.05 s")
    assert counter(metrics, "switchboard_decision_store_stalls_total") == 1
    assert w.write([row(1)]) is None and not w.retry_due()  # one call at a time
    w.collect_stalled()
    assert w.state is StoreState.STALLED  # still in flight
    store.answering.set()
    for _ in range(100):
        w.collect_stalled()
        if w.up:
            break
        threading.Event().wait(0.01)
    assert w.up and store.rows == ["id00000"]


def test_a_hung_write_that_then_fails_leaves_the_store_down() -> None:
    store = FakeStore()
    w = writer(store, Metrics(), stall_s=0.05)
    store.answering.clear()
    store.error = ConnectionError("reset")
    assert w.write([row(0)]) is None
    store.answering.set()
    for _ in range(100):
        w.collect_stalled()
        if w.state is not StoreState.STALLED:
            break
        threading.Event().wait(0.01)
    assert w.state is StoreState.DOWN and w.degraded == "ConnectionError: reset"


def test_a_batch_refused_for_its_content_is_written_row_by_row(tmp_path: Path) -> None:
    metrics = Metrics()
    store = FakeStore()
    spill = tmp_path / "spill.jsonl"
    w = writer(store, metrics, spill)
    store.refuse = {"id00002"}
    assert w.write([row(i) for i in range(5)]) == 4
    assert w.up and store.rows == ["id00000", "id00001", "id00003", "id00004"]
    assert counter(metrics, "switchboard_decisions_rejected_total", reason="store_refused") == 1
    lines = (tmp_path / "spill.jsonl.rejected").read_text().splitlines()
    aside = [json.loads(line) for line in lines]
    assert [json.loads(a["line"])[0] for a in aside] == ["id00002"]
    assert aside[0]["reason"].startswith("the store refused it")


def test_a_refused_probe_only_says_the_store_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = FakeStore()
    w = writer(store, Metrics())
    store.error = ConnectionError("down")
    w.write([row(0)])
    store.error = None
    store.refuse = {"id00000"}
    calls = []
    monkeypatch.setattr(w, "_write_one_by_one", lambda *a: calls.append(a))
    assert w.write([row(0)], probe=True) == 0
    assert w.state is StoreState.UP and not calls  # not written row by row
