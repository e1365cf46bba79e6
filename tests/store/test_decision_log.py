"""The decision log and its drainer in process: what is on disk, what the mark says,
what a restart stores again, and what it says is missing."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from mla_switchboard.service.metrics import Metrics
from mla_switchboard.service.reads.health import Health
from mla_switchboard.service.store.recorder import DecisionRecorder, DecisionsNotStored
from mla_switchboard.service.store.recording.segments import (
    Encoder,
    Reader,
    read_mark,
    scan,
    segment_name,
    segment_paths,
)

from tests.reliability.conftest import FlakyStore, counter, recorder, row, wait_until


def _submit(rec: DecisionRecorder, n: int) -> None:
    """``n`` decisions, 20 at a time, each 20 on disk before the next (so that small
    segments roll over between batches)."""
    assert rec.log is not None
    for i in range(rec.head, rec.head + n):
        assert rec.submit(row(i))
        if (i + 1) % 20 == 0 or i == n - 1:
            wait_until(lambda: rec.log.durable == rec.head, 5, what="logged")  # type: ignore[union-attr]


def _logged(store: FlakyStore, log_dir: Path, n: int, **options: object) -> None:
    """``n`` decisions submitted and on disk, none stored (the store refuses), stopped:
    what a crash during an outage leaves."""
    rec = recorder(store, log_dir, Metrics(), **options)
    rec.open()
    rec.start()
    _submit(rec, n)
    rec.stop()


def _restarted(store: FlakyStore, log_dir: Path) -> tuple[object, Metrics, int]:
    metrics = Metrics()
    rec = recorder(store, log_dir, metrics)
    stored = rec.open()
    return rec, metrics, stored


def test_every_decision_is_logged_stored_and_its_segment_removed_past_the_mark(
    tmp_path: Path,
) -> None:
    store = FlakyStore()
    store.up = True
    store.answering.clear()  # a database that hangs: nothing is stored meanwhile
    log_dir = tmp_path / "log"
    rec = recorder(store, log_dir, Metrics(), segment_bytes=4096)
    rec.open()
    rec.start()
    _submit(rec, 300)
    assert rec.mark == 0 and rec.pending == 300
    assert len(segment_paths(log_dir)) > 1  # rolled over at 4 KB
    store.answering.set()
    assert rec.flush(10)
    assert rec.mark == 300 and rec.pending == 0 and len(store.rows) == 300
    rec.stop()
    assert read_mark(log_dir) == 300
    assert len(segment_paths(log_dir)) == 1  # the one taking records is kept
    assert scan(log_dir).losses == []


def test_a_restart_stores_what_the_log_holds_past_the_mark(tmp_path: Path) -> None:
    store = FlakyStore()  # down: nothing stored before the stop
    log_dir = tmp_path / "log"
    _logged(store, log_dir, 250, segment_bytes=4096)
    assert store.rows == {}
    store.up = True
    rec, _, stored = _restarted(store, log_dir)
    assert stored == 250
    assert sorted(store.rows) == [f"id{i:05d}" for i in range(250)]
    restored = store.rows["id00007"]
    assert restored.shape_json == '{"device":{}}' and restored.answer_json is not None
    assert rec.submit(row(999))  # positions go on after the log's
    assert rec.head == 251  # type: ignore[attr-defined]


def test_an_emptied_and_a_deleted_segment_are_reported_with_the_count_lost(
    tmp_path: Path,
) -> None:
    store = FlakyStore()
    log_dir = tmp_path / "log"
    _logged(store, log_dir, 400, segment_bytes=2048)
    segs = segment_paths(log_dir)
    assert len(segs) >= 5
    (first_a, emptied), (first_b, _), (first_c, deleted), (first_d, _) = segs[1:5]
    emptied.write_bytes(b"")
    deleted.unlink()
    lost = (first_b - first_a) + (first_d - first_c)

    store.up = True
    rec, metrics, stored = _restarted(store, log_dir)
    assert stored == 400 - lost and len(store.rows) == 400 - lost
    assert counter(metrics, "switchboard_decisions_lost_total") == lost
    quiet = SimpleNamespace(degraded=None, snapshot=None, checked_at=None)
    health = Health(quiet, rec, quiet, metrics, None)  # type: ignore[arg-type]
    damage = health.readiness()[1]["log_damage"]
    assert damage.startswith(f"{lost} decisions lost from the log"), damage
    assert "emptied" in damage and "in no segment" in damage


def test_the_newest_segment_emptied_is_reported_with_an_unknown_count(tmp_path: Path) -> None:
    store = FlakyStore()
    log_dir = tmp_path / "log"
    _logged(store, log_dir, 50)
    [(_, only)] = segment_paths(log_dir)
    only.write_bytes(b"")
    store.up = True
    rec, _, stored = _restarted(store, log_dir)
    assert stored == 0
    assert rec.log_damage.startswith("an unknown number of decisions lost")  # type: ignore[attr-defined]


def test_a_torn_last_write_is_no_loss(tmp_path: Path) -> None:
    """A crash in the middle of a batch's write leaves part of it: that batch was never
    on disk, so never acknowledged as kept; everything before it is stored."""
    store = FlakyStore()
    log_dir = tmp_path / "log"
    _logged(store, log_dir, 30)
    [(_, only)] = segment_paths(log_dir)
    with only.open("ab") as f:
        f.write(b"\x40\x00\x00\x00garbage")
    store.up = True
    rec, _, stored = _restarted(store, log_dir)
    assert stored == 30 and rec.log_damage is None  # type: ignore[attr-defined]


def test_a_damaged_record_mid_log_loses_the_rest_of_its_segment_only(tmp_path: Path) -> None:
    store = FlakyStore()
    log_dir = tmp_path / "log"
    _logged(store, log_dir, 200, segment_bytes=2048)
    (_, first), (second_first, _) = segment_paths(log_dir)[:2]
    data = bytearray(first.read_bytes())
    data[-10] ^= 0xFF  # one flipped byte in its last batch: that batch's checksum fails
    first.write_bytes(bytes(data))
    store.up = True
    rec, metrics, stored = _restarted(store, log_dir)
    lost = counter(metrics, "switchboard_decisions_lost_total")
    assert 0 < lost < second_first - 1
    assert stored == 200 - lost
    assert "cut short" in rec.log_damage  # type: ignore[attr-defined]


def test_memory_past_its_budget_keeps_what_is_on_disk_in_the_log_only(tmp_path: Path) -> None:
    store = FlakyStore()
    store.up = True
    store.answering.clear()
    rec = recorder(store, tmp_path / "log", Metrics(), limit=100)
    rec.open()
    rec.start()
    assert rec.log is not None
    kept = 0
    for i in range(1000):
        kept += rec.submit(row(i))
        if i % 50 == 0:
            wait_until(lambda: rec.log.durable == rec.head, 5, what="logged")  # type: ignore[union-attr]
    assert kept == 1000  # memory let go of those already on disk
    assert rec.buffered_bytes <= 150 * 700
    store.answering.set()
    assert rec.flush(10)
    assert len(store.rows) == 1000
    rec.stop()


def test_without_a_log_memory_past_its_budget_refuses_new_decisions(tmp_path: Path) -> None:
    store = FlakyStore()  # down
    metrics = Metrics()
    rec = recorder(store, None, metrics, limit=100)
    rec.open()
    rec.start()
    kept = sum(rec.submit(row(i)) for i in range(150))
    assert kept == 100
    assert counter(metrics, "switchboard_decisions_dropped_total") == 50
    assert rec.log_error is not None and rec.log_error.startswith("off")
    rec.stop()


def test_a_read_on_a_stalled_store_answers_503_at_its_deadline_a_report_waits_on(
    tmp_path: Path,
) -> None:
    """A read never answers without the decisions acknowledged before it: on a store
    that hangs it waits its deadline and refuses (``DecisionsNotStored``, a 503);
    a report's wait for its own position goes on and ends once the store answers."""
    store = FlakyStore()
    store.up = True
    store.answering.clear()  # hangs
    rec = recorder(store, tmp_path / "log", Metrics(), stall_s=0.05, read_wait_s=0.2)
    rec.open()
    rec.start()
    assert rec.submit(row(1, pod="p"))
    wait_until(lambda: rec.degraded is not None, 5, what="stalled")
    with pytest.raises(DecisionsNotStored) as refused:
        rec.settle_for_read()
    assert refused.value.waiting == 1 and "StoreStalled" in refused.value.message
    position = rec.position_of("c", "p")
    assert position == 1
    store.answering.set()
    assert rec.wait_stored(position, 10)
    rec.settle_for_read()  # stored: nothing to wait for
    assert rec.position_of("c", "p") is None  # stored: nothing waits for it any more
    rec.stop()


def test_a_read_on_a_slow_but_answering_store_waits_for_its_decisions(
    tmp_path: Path,
) -> None:
    """A write slower than the stall bound (a busy machine) is waited for: the read
    then holds the decision, rather than answering without it."""
    store = FlakyStore()
    store.up = True
    store.answering.clear()
    rec = recorder(store, tmp_path / "log", Metrics(), stall_s=0.05, read_wait_s=30)
    rec.open()
    rec.start()
    assert rec.submit(row(1, pod="p"))
    wait_until(lambda: rec.degraded is not None, 5, what="stalled")
    threading.Timer(0.3, store.answering.set).start()
    rec.settle_for_read()
    assert rec.mark == 1 and len(store.rows) == 1
    rec.stop()


def test_every_field_survives_the_log_whatever_it_holds(tmp_path: Path) -> None:
    """The fast encoding joins fields by a separator; a field holding one (or a NUL)
    is written as JSON instead, and None stays None."""
    rows = [
        row(1)._replace(node=None, principal=None, verified=True),
        row(2)._replace(pod=None, answer_id="a2", answer_json=None),
        row(3)._replace(principal="a\x1fb", node="\x00"),
        row(4)._replace(cluster="ü-cluster", principal="workload:uid-4"),
    ]
    encoder = Encoder()
    data = encoder.new_segment(1) + b"".join(encoder.decision(i + 1, r) for i, r in enumerate(rows))
    (tmp_path / segment_name(1)).write_bytes(data)
    assert [r for _, r in Reader(tmp_path).read(1, 4, 10)] == rows


def test_a_batch_the_log_could_not_write_stays_in_memory_until_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Memory past its budget lets go only of what is on disk: never of a batch whose
    write failed, even once later batches are on disk again."""
    import errno
    import os

    from mla_switchboard.service.store.recording import log as log_module

    store = FlakyStore()  # down: nothing is stored meanwhile
    rec = recorder(store, tmp_path / "log", Metrics(), limit=100)
    rec.open()
    rec.start()
    real = os.fdatasync

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(log_module.os, "fdatasync", full)
    for i in range(20):
        assert rec.submit(row(i))
    wait_until(lambda: rec.log_error is not None, 5, what="failing")
    monkeypatch.setattr(log_module.os, "fdatasync", real)
    kept = 0
    for i in range(20, 400):
        kept += rec.submit(row(i))
        if i % 20 == 0:
            wait_until(lambda: rec.log.durable == rec.head, 5, what="on disk")  # type: ignore[union-attr]
    store.up = True
    assert rec.flush(20)
    assert {f"id{i:05d}" for i in range(20)} <= set(store.rows)  # the unwritten batch too
    assert len(store.rows) == 20 + kept
    rec.stop()


def test_replicas_sharing_a_path_each_take_a_log_and_a_start_takes_over_a_dead_ones(
    tmp_path: Path,
) -> None:
    store = FlakyStore()  # down while the first two run
    log_dir = tmp_path / "log"
    a, b = recorder(store, log_dir, Metrics()), recorder(store, log_dir, Metrics())
    a.open()
    b.open()
    assert a.log is not None and b.log is not None
    assert a.log.dir == log_dir and b.log.dir == tmp_path / "log.1"
    assert a.log_error is None and b.log_error is None
    for rec, start in ((a, 0), (b, 1000)):
        rec.start()
        for i in range(start, start + 30):
            assert rec.submit(row(i))
        rec.stop()
    store.up = True
    c = recorder(store, log_dir, Metrics())
    assert c.open() == 30  # the first free: a's
    d = recorder(store, log_dir, Metrics())
    assert d.open() == 30  # c holds the first: b's
    assert len(store.rows) == 60
    for rec in (c, d):
        rec.start()
        rec.stop()
