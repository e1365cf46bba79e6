"""The spill log and its drain alone: appends, the reasons a spill file cannot take
decisions, and spilled decisions back into a store (a callable here)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from mla_switchboard.service.metrics import Metrics
from mla_switchboard.service.store.recording.spill_drain import SpillDrain
from mla_switchboard.service.store.recording.spill_log import SpillLog
from mla_switchboard.service.store.spill import LineEncoder, SpillFile

from tests.reliability.conftest import counter, row


def spill_log(metrics: Metrics, path: Path | None, limit: int = 1 << 20) -> SpillLog:
    file = SpillFile(path, limit) if path else None
    return SpillLog(file, metrics, threading.Condition())


class Sink:
    """The store's side of a drain: takes batches while ``up``."""

    def __init__(self) -> None:
        self.up = True
        self.ids: list[str] = []
        self.between = 0

    def write(self, rows: Sequence[tuple[Any, ...]]) -> int | None:
        if not self.up:
            return None
        self.ids.extend(r[0] for r in rows)
        return len(rows)

    def drain(self, drain: SpillDrain, **options: Any) -> None:
        drain.drain(self.write, self.count_between, going=lambda: True, **options)

    def count_between(self) -> None:
        self.between += 1


# ------------------------------------------------------------ the spill log


def test_without_a_path_nothing_is_spilled_and_readyz_says_why() -> None:
    log = spill_log(Metrics(), None)
    assert log.error == "off: no spill path" and log.check() == "off: no spill path"
    assert not log.can_take() and log.append([row(0)]) == 0 and log.size() == 0
    assert log.set_aside([(row(0), "refused")]) == "lost (no spill path)"


def test_a_zero_limit_turns_spilling_off(tmp_path: Path) -> None:
    log = spill_log(Metrics(), tmp_path / "spill.jsonl", limit=0)
    assert log.check() == "off: SWITCHBOARD_SPILL_LIMIT_MB is 0"
    assert not log.can_take() and log.append([row(0)], retry_now=True) == 0


def test_appends_are_counted_and_pending_until_drained(tmp_path: Path) -> None:
    metrics = Metrics()
    log = spill_log(metrics, tmp_path / "spill.jsonl")
    assert log.check() is None and log.can_take() and not log.pending
    assert log.append([row(i) for i in range(3)]) == 3
    assert log.pending and log.undrained == 3 and log.size() > 0
    assert counter(metrics, "switchboard_decisions_spilled_total") == 3
    log.mark_drained(log.gen)
    assert not log.pending and log.undrained == 0


def test_a_full_spill_file_says_so_and_waits_before_it_is_tried_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    line = len(LineEncoder().line(row(0)))
    log = spill_log(Metrics(), tmp_path / "spill.jsonl", limit=2 * line + 10)
    assert log.append([row(i) for i in range(5)]) == 2
    assert log.error is not None and log.error.startswith("full: SWITCHBOARD_SPILL_LIMIT_MB")
    assert not log.can_take()
    assert log.append([row(9)]) == 0  # not even tried before the retry time
    assert caplog.text.count("took 2 of 5 decisions") == 1


# ------------------------------------------------------------ the drain


def test_a_drain_writes_every_line_once_with_new_decisions_between_batches(
    tmp_path: Path,
) -> None:
    metrics = Metrics()
    log = spill_log(metrics, tmp_path / "spill.jsonl")
    log.append([row(i) for i in range(25)])
    drain = SpillDrain(log, metrics, batch=10)
    sink = Sink()
    sink.drain(drain)
    assert sink.ids == [f"id{i:05d}" for i in range(25)] and sink.between == 3
    assert drain.replayed == 25 and counter(metrics, "switchboard_decisions_replayed_total") == 25
    assert not log.pending and drain.unfinished is None
    assert not list(tmp_path.iterdir())  # the claimed file is gone
    sink.drain(drain)  # nothing left, and no file looked for before the next check
    assert len(sink.ids) == 25


def test_a_batch_the_store_did_not_take_is_read_again_once_it_is_back(tmp_path: Path) -> None:
    metrics = Metrics()
    log = spill_log(metrics, tmp_path / "spill.jsonl")
    log.append([row(i) for i in range(5)])
    drain = SpillDrain(log, metrics, batch=10)
    sink = Sink()
    sink.up = False
    sink.drain(drain)
    assert drain.unfinished is not None and log.pending and drain.replayed == 0
    sink.up = True
    sink.drain(drain)
    assert sink.ids == [f"id{i:05d}" for i in range(5)] and not log.pending


def test_bad_lines_are_counted_by_reason_and_a_probe_takes_files_with_nothing_good(
    tmp_path: Path,
) -> None:
    metrics = Metrics()
    path = tmp_path / "spill.jsonl"
    path.write_bytes(b"not json\n[1,2]\n")
    drain = SpillDrain(spill_log(metrics, path), metrics, batch=10)
    sink = Sink()
    sink.up = False  # a probe runs while the store is failing
    sink.drain(drain, probe=True)
    assert not path.exists() and sink.between == 0
    rejected = "switchboard_decisions_rejected_total"
    assert counter(metrics, rejected, reason="not_json") == 1
    assert counter(metrics, rejected, reason="bad_fields") == 1
    assert len((tmp_path / "spill.jsonl.rejected").read_text().splitlines()) == 2


def test_a_file_that_cannot_be_claimed_is_retried_later_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.ERROR, "switchboard.recorder")
    metrics = Metrics()
    log = spill_log(metrics, tmp_path / "spill.jsonl")
    log.append([row(0)])
    file = log.file
    assert file is not None

    def unreadable() -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(file, "claim", unreadable)
    drain = SpillDrain(log, metrics, batch=10)
    sink = Sink()
    sink.drain(drain)
    assert not drain.work_due()  # blocked for SPILL_CHECK_S
    drain._blocked_until = 0.0
    sink.drain(drain)
    assert caplog.text.count("cannot drain the spill file") == 1 and not sink.ids
    monkeypatch.undo()
    drain._blocked_until = 0.0
    sink.drain(drain)
    assert sink.ids == ["id00000"] and not log.pending
