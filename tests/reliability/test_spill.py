"""The spill file and the memory budget, in process: the recorder against a store that
fails on demand (``FlakyStore``), a real spill file in a temporary directory.

The same behaviour with real processes and a real PostgreSQL is in
``test_durability.py``; these cover the cases one by one and run in seconds.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from mla_switchboard.service.config import Settings
from mla_switchboard.service.metrics import Metrics
from mla_switchboard.service.runtime import Runtime
from mla_switchboard.service.store import Store
from mla_switchboard.service.store import spill as spill_module
from mla_switchboard.service.store.db import make_engine, migrate
from mla_switchboard.service.store.recorder import DecisionRecorder
from mla_switchboard.service.store.recording.memory_queue import row_bytes
from mla_switchboard.service.store.spill import LineEncoder, parse_line

from tests.reliability.conftest import FlakyStore, counter, recorder, row, wait_until


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True) if path.exists() else []


def crash(rec: DecisionRecorder) -> None:
    """What kill -9 leaves: the writer stops where it is, nothing is flushed or spilled."""
    rec._stopping.set()
    rec._wake.set()
    assert rec._thread is not None
    rec._thread.join(5)


# ------------------------------------------------------------ a local log


def test_outage_spills_continuously_and_a_crash_keeps_all_but_the_last_interval(
    tmp_path: Path,
) -> None:
    """Before: nothing reached the spill file until a clean shutdown, so a crash during
    an outage lost every buffered decision (1,515 of 1,515 after a 5 s outage)."""
    spill = tmp_path / "spill.jsonl"
    store, metrics = FlakyStore(), Metrics()
    rec = recorder(store, spill, metrics)
    rec.start()
    for i in range(300):
        rec.submit(row(i))
    wait_until(lambda: len(lines_of(spill)) == 300 and not rec.pending, 5, what="300 spilled")
    assert rec.buffered_bytes == 0  # spilled decisions leave memory, shared texts too
    crash(rec)

    store.up = True
    again = recorder(store, spill, Metrics())
    assert again.replay_spill() == 300
    assert sorted(store.rows) == [f"id{i:05d}" for i in range(300)]
    assert counter(metrics, "switchboard_decisions_spilled_total") == 300
    assert not spill.exists()


def test_the_running_writer_drains_its_spill_file_once_the_store_is_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: spilled decisions waited for the next start, invisible until then."""
    spill = tmp_path / "spill.jsonl"
    store, metrics = FlakyStore(), Metrics()
    rec = recorder(store, spill, metrics)
    rec.start()
    for i in range(500):
        rec.submit(row(i))
    wait_until(lambda: len(lines_of(spill)) == 500, 5, what="spilled")
    assert rec.flush(0.2) is False  # not in the store yet
    store.up = True
    assert rec.flush(5) is True  # the retry (backoff) finds the store and drains the file
    assert len(store.rows) == 500
    assert not spill.exists() and not list(tmp_path.glob("spill.jsonl.replay-*"))
    assert counter(metrics, "switchboard_decisions_replayed_total") == 500
    rec.submit(row(1000))
    rec.stop()
    assert len(store.rows) == 501
    assert "replayed 500 spilled decisions" in caplog.text
    assert "the next start" not in caplog.text  # nothing left for a restart


def test_a_store_that_hangs_is_spilled_around_and_a_crash_keeps_all_but_the_last_interval(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A database that stops answering without refusing: before, the writer waited in
    the store call with no limit and spilled nothing meanwhile, so a crash lost every
    decision since the hang began. Now the call runs on its own thread; once it has been
    in flight ``stall_s``, the writer spills what is in memory (the batch in flight
    included) and goes on spilling every interval."""
    spill = tmp_path / "spill.jsonl"
    store, metrics = FlakyStore(), Metrics()
    store.up = True
    rec = recorder(store, spill, metrics, stall_s=0.1)
    rec.start()
    for i in range(100):
        rec.submit(row(i))
    assert rec.flush(5) and len(store.rows) == 100
    store.answering.clear()  # the database hangs
    for i in range(100, 400):
        rec.submit(row(i))
        if i % 20 == 0:
            time.sleep(0.005)
    wait_until(lambda: len(lines_of(spill)) == 300 and not rec.pending, 5, what="spilled")
    assert rec.degraded is not None and rec.degraded.startswith("StoreStalled")
    assert counter(metrics, "switchboard_decision_store_stalls_total") >= 1
    assert "has not answered for 0.10 s" in caplog.text
    crash(rec)
    store.answering.set()  # the hang ends after the crash (the in-flight batch commits)

    again = recorder(store, spill, Metrics())
    assert again.replay_spill() == 300
    assert sorted(store.rows) == [f"id{i:05d}" for i in range(400)]
    assert not spill.exists()


def test_a_hang_that_ends_stores_everything_without_a_restart(tmp_path: Path) -> None:
    spill = tmp_path / "spill.jsonl"
    store, metrics = FlakyStore(), Metrics()
    store.up = True
    rec = recorder(store, spill, metrics, stall_s=0.1)
    rec.start()
    store.answering.clear()
    for i in range(300):
        rec.submit(row(i))
    wait_until(lambda: len(lines_of(spill)) == 300, 5, what="spilled while hung")
    assert rec.flush(0.2) is False
    store.answering.set()
    assert rec.flush(5) is True  # the hung call ends; the spill file is drained
    assert rec.degraded is None and len(store.rows) == 300
    # the batch in flight was committed by the hung call and again from the file: each
    # decision is counted once, as replayed (stored from the file), none as written
    assert counter(metrics, "switchboard_decisions_spilled_total") == 300
    assert counter(metrics, "switchboard_decisions_replayed_total") == 300
    assert counter(metrics, "switchboard_decisions_written_total") == 0
    rec.submit(row(1000))
    rec.stop()
    assert len(store.rows) == 301 and not spill.exists()


def test_the_call_thread_outlives_its_wait_and_hands_the_outcome_over_once() -> None:
    from mla_switchboard.service.store.call_thread import CallThread

    calls = CallThread("test-calls")
    assert calls.run(lambda: None, 1.0).done.is_set() and not calls.busy
    failing = calls.run(lambda: int("x"), 1.0)
    assert isinstance(failing.error, ValueError) and not calls.busy
    gate = threading.Event()
    slow = calls.run(gate.wait, 0.05)
    assert not slow.done.is_set() and calls.busy
    with pytest.raises(RuntimeError):
        calls.run(lambda: None, 0.05)  # never two calls at once
    assert calls.collect() is None  # still running
    gate.set()
    wait_until(slow.done.is_set, 2, what="the slow call ends")
    assert calls.collect() is slow and slow.error is None
    assert not calls.busy and calls.collect() is None


def test_replicas_sharing_a_spill_path_each_line_is_drained_once(tmp_path: Path) -> None:
    spill = tmp_path / "spill.jsonl"
    store = FlakyStore()
    metrics = [Metrics(), Metrics()]
    recs = [recorder(store, spill, m) for m in metrics]
    for r in recs:
        r.start()

    def feed(r: DecisionRecorder, base: int) -> None:
        for i in range(base, base + 2000):
            r.submit(row(i))
            if i % 100 == 0:
                time.sleep(0.002)

    feeders = [threading.Thread(target=feed, args=(r, k * 10_000)) for k, r in enumerate(recs)]
    for t in feeders:
        t.start()
    for t in feeders:
        t.join()
    store.up = True
    for r in recs:
        assert r.flush(10)
        r.stop()
    assert len(store.rows) == 4000
    spilled = sum(counter(m, "switchboard_decisions_spilled_total") for m in metrics)
    replayed = sum(counter(m, "switchboard_decisions_replayed_total") for m in metrics)
    assert spilled == replayed == 4000  # every line drained by one replica, once
    assert not list(tmp_path.iterdir())


@pytest.mark.serial
def test_a_start_replays_for_a_bounded_time_and_the_writer_does_the_rest(
    tmp_path: Path,
) -> None:
    """A spill file of the size limit (512 MB) takes about a minute to store: a start
    that waited for all of it would keep a replica out of service that long."""
    spill = tmp_path / "spill.jsonl"
    spill.write_bytes(b"".join(good_lines(3000)))
    store, metrics = FlakyStore(), Metrics()
    store.up, store.delay_s = True, 0.02  # 100 rows a batch: 0.6 s in all
    rec = recorder(store, spill, metrics)
    first = rec.replay_spill(budget_s=0.1)
    assert 0 < first < 3000
    rec.start()
    rec.submit(row(5000))
    assert rec.flush(5)  # a new decision does not wait for the rest of the file
    assert "id05000" in store.rows and len(store.rows) < 3001
    wait_until(lambda: len(store.rows) == 3001, 10, what="the rest, in the background")
    rec.stop()
    assert counter(metrics, "switchboard_decisions_replayed_total") == 3000
    assert not spill.exists() and not list(tmp_path.glob("spill.jsonl.replay-*"))


def test_a_spill_file_that_cannot_be_read_is_left_and_logged_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    spill = tmp_path / "spill.jsonl"
    spill.write_bytes(b"".join(good_lines(10)))
    store = FlakyStore()
    store.up = True

    def unreadable(self: spill_module.SpillFile) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(spill_module.SpillFile, "claim", unreadable)
    rec = recorder(store, spill, Metrics())
    assert rec.replay_spill() == 0
    rec.start()
    for i in range(100, 150):
        rec.submit(row(i))
    assert rec.flush(2)  # new decisions are written all the same
    rec._drain._next_check = rec._drain._blocked_until = 0.0
    rec.flush(0.2)
    rec.stop()
    assert len(store.rows) == 50 and spill.exists()
    assert caplog.text.count("cannot drain the spill file") == 1


# ------------------------------------------------------------ bad lines


def good_lines(n: int, start: int = 0) -> list[bytes]:
    enc = LineEncoder()
    return [enc.line(row(i)) for i in range(start, start + n)]


def test_a_corrupt_spill_file_keeps_every_good_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: one 0xFF byte lost all 1,000 lines, at every start again (the UTF-8 error
    escaped the per-line handling); a 2-field line lost the whole file ("tuple index out
    of range"); a partial last line was counted as dropped a second time."""
    spill = tmp_path / "spill.jsonl"
    lines = good_lines(1000)
    lines[10] = lines[10][:20] + b"\xff" + lines[10][21:]
    old = json.dumps(
        ["old00001", "2026-01-01T00:00:00+00:00", "c", "n", "p-old", "FLASH_ATTN", "priority", 1,
         json.dumps({"cluster": "c", "pod": "p-old", "dtype": "bfloat16"}), "a1", "{}"]
    ).encode() + b"\n"  # fmt: skip
    too_long_id = json.loads(good_lines(1, 5000)[0])
    too_long_id[0] = "x" * 27
    nul = json.loads(good_lines(1, 5001)[0])
    nul[4] = "p\x00"
    bad = [
        b'["id1", "2026-01-01"]\n',  # valid JSON, 2 fields
        b"not json at all\n",
        b'{"id": "x"}\n',
        json.dumps(too_long_id).encode() + b"\n",
        json.dumps(nul).encode() + b"\n",
    ]
    partial = good_lines(1, 6000)[0][:-30]  # a write cut short: no newline
    spill.write_bytes(b"".join(lines[:500] + bad + [old] + lines[500:]) + partial)

    store, metrics = FlakyStore(), Metrics()
    store.up = True
    rec = recorder(store, spill, metrics)
    assert rec.replay_spill() == 999 + 1  # every good line, and the old-format one

    assert len(store.rows) == 1000 and "id00010" not in store.rows
    assert store.rows["old00001"].pod == "p-old" and len(store.rows["old00001"]) == 14
    rejected = [json.loads(x) for x in (tmp_path / "spill.jsonl.rejected").read_text().splitlines()]
    reasons = [r["reason"] for r in rejected]
    assert len(rejected) == 7, reasons
    assert reasons[0].startswith("not UTF-8")
    assert "2 fields, expected 14" in reasons[1]
    assert reasons[2].startswith("not JSON")
    assert "not an array" in reasons[3]
    assert "field 0 (id): 27 characters" in reasons[4]
    assert "NUL" in reasons[5]
    assert reasons[6].startswith("partial last line")
    assert rejected[6]["line"] == partial.decode()
    assert all(r["file"].startswith("spill.jsonl.replay-") for r in rejected)
    assert counter(metrics, "switchboard_decisions_replayed_total") == 1000
    assert counter(metrics, "switchboard_decisions_rejected_total", reason="not_utf8") == 1
    assert counter(metrics, "switchboard_decisions_rejected_total", reason="bad_fields") == 4
    assert counter(metrics, "switchboard_decisions_rejected_total", reason="not_json") == 1
    assert counter(metrics, "switchboard_decisions_rejected_total", reason="partial") == 1
    assert counter(metrics, "switchboard_decisions_dropped_total") == 0
    assert "replayed 1000 spilled decisions" in caplog.text
    assert "7 lines could not be replayed (1 of them a partial last line)" in caplog.text
    assert not spill.exists()
    assert rec.replay_spill() == 0  # and the next start has nothing left to fail on


def test_a_row_the_store_refuses_is_set_aside_and_every_count_is_exact(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A row the store refuses for its content is set aside, not retried forever, and
    counted once: as rejected. Before: its batch was still counted in full (250
    replayed with 249 stored; from memory, 100 written with 99 stored), so the refused
    row was counted both as stored and as rejected."""
    spill = tmp_path / "spill.jsonl"
    spill.write_bytes(b"".join(good_lines(250)))
    store, metrics = FlakyStore(), Metrics()
    store.up = True
    store.refuse = {"id00042", "id00342"}
    rec = recorder(store, spill, metrics)
    assert rec.replay_spill() == 249  # the batch was stored row by row
    assert len(store.rows) == 249 and "id00042" not in store.rows
    (entry,) = [json.loads(x) for x in (tmp_path / "spill.jsonl.rejected").read_text().splitlines()]
    assert entry["reason"].startswith("the store refused it: ")
    assert json.loads(entry["line"])[0] == "id00042"
    assert counter(metrics, "switchboard_decisions_replayed_total") == 249
    assert counter(metrics, "switchboard_decisions_rejected_total", reason="store_refused") == 1
    assert "replayed 249 spilled decisions" in caplog.text
    assert (
        "1 lines could not be replayed (0 of them a partial last line, 1 refused by the store)"
        in caplog.text
    )

    rec.start()  # the same from memory: written counts what the store took
    for i in range(300, 400):
        rec.submit(row(i))
    assert rec.flush(5)
    rec.stop()
    assert len(store.rows) == 249 + 99 and "id00342" not in store.rows
    assert counter(metrics, "switchboard_decisions_written_total") == 99
    assert counter(metrics, "switchboard_decisions_rejected_total", reason="store_refused") == 2
    assert (
        "the store took 99 of the batch's 100 decisions; the 1 it refused are set aside"
        in caplog.text
    )
    assert len((tmp_path / "spill.jsonl.rejected").read_text().splitlines()) == 2


@pytest.mark.postgres
def test_postgres_refusing_a_row_is_a_refusal_not_an_outage(
    tmp_path: Path, pg_url_factory: Callable[[], str]
) -> None:
    """PostgreSQL's batch goes to psycopg directly (``COPY``), whose errors arrive
    unwrapped: before, a row it refused (a value too long for its column) looked like
    an outage, and its batch was retried, and spilled, for ever."""
    url = pg_url_factory()
    engine = make_engine(url)
    migrate(engine)
    store = Store(engine)
    store.config.ensure_seeded()
    metrics = Metrics()
    rec = recorder(store.decisions, tmp_path / "spill.jsonl", metrics)  # type: ignore[arg-type]
    rec.start()
    try:
        for i in range(10):
            r = row(i)
            rec.submit(r._replace(cluster="c" * 80) if i == 4 else r)
        assert rec.flush(10)
    finally:
        rec.stop()
        stored = store.decisions.count_decisions()
        engine.dispose()
    assert stored == 9 and rec.degraded is None
    assert counter(metrics, "switchboard_decisions_written_total") == 9
    assert counter(metrics, "switchboard_decisions_rejected_total", reason="store_refused") == 1
    assert counter(metrics, "switchboard_decisions_spilled_total") == 0


def hostile_lines() -> list[tuple[bytes, str, str]]:
    """Lines no check of the old code foresaw, each with the kind and the start of the
    reason it must be set aside with."""
    good = json.loads(good_lines(1, 7000)[0])

    def with_field(i: int, value: object) -> bytes:
        v = list(good)
        v[i] = value
        return json.dumps(v).encode() + b"\n"

    deep = "[" * 100_000 + "]" * 100_000
    old = ["old00002", "2026-01-01T00:00:00+00:00", "c", "n", "p-old", "FLASH_ATTN",
           "priority", 1, deep, "a1", "{}"]  # fmt: skip
    return [
        (b"[" * 1000 + b"]" * 1000 + b"\n", "not_json", "not JSON that can be read: nested"),
        (b"[" * 200_000 + b"\n", "not_json", "not JSON that can be read: nested"),
        (with_field(10, "not json"), "bad_fields", "field 10 (shape_json): not JSON"),
        (with_field(10, deep), "bad_fields", "field 10 (shape_json): JSON nested too deep"),
        (with_field(10, '["a list"]'), "bad_fields", "field 10 (shape_json): a JSON list"),
        (with_field(11, "{"), "bad_fields", "field 11 (answer_json): not JSON"),
        (with_field(11, "7"), "bad_fields", "field 11 (answer_json): a JSON int"),
        (
            with_field(10, json.dumps({"x": "y" * 1_100_000})),
            "bad_fields",
            "field 10 (shape_json): 1100009 characters, over 1 MiB",
        ),
        (json.dumps(old).encode() + b"\n", "bad_fields", "field 8 (request_json): JSON nested"),
    ]


def test_hostile_lines_are_set_aside_and_never_stop_a_start(tmp_path: Path) -> None:
    """Before: a line nested 1,000 deep made ``json.loads`` raise RecursionError, which
    escaped the per-line handling, ``replay_spill`` and ``Runtime.start``: the replica
    failed at every start. Shape and answer texts that were not JSON objects were stored
    as they read, and broke the listings that parse them later."""
    hostile = hostile_lines()
    lines = good_lines(200)
    spill = tmp_path / "spill.jsonl"
    spill.write_bytes(b"".join(lines[:100] + [h[0] for h in hostile] + lines[100:]))
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'sb.db'}", spill_path=str(spill))
    runtime = Runtime(settings)
    runtime.start()  # before: RecursionError
    try:
        registry = runtime.metrics.registry
        replayed = registry.get_sample_value("switchboard_decisions_replayed_total")
        stored = {d.id for d in runtime.store.decisions.list_decisions(
            cluster="c", backend=None, limit=1000, before_id=None
        )}  # fmt: skip
        kinds = {
            k: registry.get_sample_value("switchboard_decisions_rejected_total", {"reason": k})
            for k in ("not_json", "bad_fields")
        }
    finally:
        runtime.stop()
    assert replayed == 200 and stored == {f"id{i:05d}" for i in range(200)}
    assert kinds == {"not_json": 2, "bad_fields": 7}
    rejected = [json.loads(x) for x in (tmp_path / "spill.jsonl.rejected").read_text().splitlines()]
    assert [r["reason"][: len(h[2])] for r, h in zip(rejected, hostile, strict=True)] == [
        h[2] for h in hostile
    ]
    assert not spill.exists()


def test_parse_line_raises_only_badline_whatever_the_line_holds() -> None:
    for raw, kind, reason in hostile_lines():
        with pytest.raises(spill_module.BadLine) as caught:
            parse_line(raw)
        assert (caught.value.kind, caught.value.reason[: len(reason)]) == (kind, reason)


def test_the_rejected_file_is_bounded_and_what_it_cannot_take_is_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spill = tmp_path / "spill.jsonl"
    garbage = [f"garbage line {i} ".encode() * 20 + b"\n" for i in range(2000)]
    spill.write_bytes(b"".join(good_lines(50) + garbage + good_lines(50, 50)))
    store, metrics = FlakyStore(), Metrics()
    store.up = True
    limit = 64 * 1024
    rec = recorder(store, spill, metrics, rejected_limit_bytes=limit)
    assert rec.replay_spill() == 100
    rejected = tmp_path / "spill.jsonl.rejected"
    kept = len(rejected.read_text().splitlines())
    assert rejected.stat().st_size <= limit and 0 < kept < 2000
    assert counter(metrics, "switchboard_decisions_rejected_total", reason="not_json") == 2000
    unkept = 2000 - kept
    assert f"{unkept} bad spill lines were counted" in caplog.text
    assert "it is at its size limit (0.0625 MiB)" in caplog.text
    assert "2000 lines could not be replayed (0 of them a partial last line) and are in" in (
        caplog.text
    )
    assert f"({unkept} of them only counted: the file is at its size limit)" in caplog.text
    assert not spill.exists()


def test_parse_line_checks_each_field() -> None:
    line = good_lines(1)[0]
    assert parse_line(line).id == "id00000"
    v = json.loads(line)
    for i, value, says in [
        (7, True, "rules_revision"),
        (7, 2**40, "rules_revision"),
        (1, "yesterday", "is not a time"),
        (1, "2026-01-01T00:00:00", "no time zone"),
        (2, "", "cluster): 0 characters"),
        (3, 5, "node): int"),
        (11, ["x"], "answer_json): list"),
    ]:
        broken = list(v)
        broken[i] = value
        with pytest.raises(spill_module.BadLine, match=re.escape(says)):
            parse_line(json.dumps(broken).encode())
    none_node = list(v)
    none_node[3] = None
    assert parse_line(json.dumps(none_node).encode()).node is None


# ------------------------------------------------------------ a disk that refuses


def test_a_disk_that_fills_mid_append_keeps_exact_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: with the disk full after 960 of 1,000 lines the log said 1,000 dropped,
    and the partial line was counted as dropped again at replay. Now the file is cut
    back to its last whole line, what did not fit stays in memory, and the counts add up."""
    spill = tmp_path / "spill.jsonl"
    lines = good_lines(1000)
    room = sum(len(x) for x in lines[:960]) + 25  # 960 lines and part of the 961st
    real = spill_module._write_all

    def full_disk(fd: int, data: bytes) -> tuple[int, OSError | None]:
        left = room - spill.stat().st_size
        done, error = real(fd, data[: max(0, left)])
        if error is None and left < len(data):
            return done, OSError(28, "No space left on device")
        return done, error

    monkeypatch.setattr(spill_module, "_write_all", full_disk)
    store, metrics = FlakyStore(), Metrics()
    rec = recorder(store, spill, metrics, shutdown_flush_s=0.5)
    rec.start()
    for i in range(1000):
        rec.submit(row(i))
    wait_until(lambda: rec.spill_error is not None, 5, what="the disk refuses")
    assert rec.spill_error == "OSError: No space left on device"
    assert rec.pending == 40  # kept in memory, not dropped
    rec.stop()
    assert counter(metrics, "switchboard_decisions_spilled_total") == 960
    assert counter(metrics, "switchboard_decisions_dropped_total") == 40
    assert "dropped 40 decisions at shutdown" in caplog.text
    assert spill.read_bytes().endswith(b"\n") and len(lines_of(spill)) == 960

    store.up = True
    m2 = Metrics()
    assert recorder(store, spill, m2).replay_spill() == 960
    assert counter(m2, "switchboard_decisions_rejected_total", reason="partial") == 0
    assert len(store.rows) == 960


def test_past_the_spill_limit_decisions_stay_in_memory_then_drop_with_one_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spill = tmp_path / "spill.jsonl"
    room = sum(len(x) for x in good_lines(100)) + 10  # 100 lines, not 101
    store, metrics = FlakyStore(), Metrics()
    per_row = row_bytes(row(0))
    rec = recorder(store, spill, metrics, spill_limit_bytes=room, budget_bytes=200 * per_row)
    rec.start()
    for i in range(500):
        rec.submit(row(i))
        if i % 50 == 0:
            time.sleep(0.02)
    wait_until(lambda: rec.spill_error is not None and rec.pending, 5, what="spill full")
    assert rec.spill_error.startswith("full: SWITCHBOARD_SPILL_LIMIT_MB")
    assert len(lines_of(spill)) == 100
    assert rec.buffered_bytes <= 200 * per_row + 1000  # the shape and answer, once
    held = rec.pending
    dropped = counter(metrics, "switchboard_decisions_dropped_total")
    assert dropped == 500 - 100 - held > 0
    rec.stop()
    drops = [r for r in caplog.records if "dropped" in r.getMessage()]
    assert 1 <= len(drops) <= 3, [r.getMessage() for r in drops]  # counts, not one per decision
    total = counter(metrics, "switchboard_decisions_dropped_total")
    assert f"{total:.0f} dropped since start" in drops[-1].getMessage() or any(
        f"dropped {held}" in r.getMessage() for r in drops
    )


# ------------------------------------------------------------ memory in bytes


def test_the_budget_counts_bytes_and_shared_texts_once(tmp_path: Path) -> None:
    store, metrics = FlakyStore(), Metrics()
    per_row = row_bytes(row(0))
    assert 300 < per_row < 600, per_row
    rec = recorder(store, None, metrics, budget_bytes=1000 * per_row)
    for i in range(900):
        rec.submit(row(i))
    shared = rec.buffered_bytes - sum(row_bytes(row(i)) for i in range(900))
    assert 0 < shared < 500  # one shape, one answer: counted once, not 900 times
    for i in range(900, 1500):
        rec.submit(row(i))
    assert rec.buffered_bytes <= 1000 * per_row
    assert rec.pending + counter(metrics, "switchboard_decisions_dropped_total") == 1500
    assert rec.pending > 990  # refused only past the budget, the newest
    assert next(iter(rec._memory._queue)).id == "id00000"


def test_an_unwritable_spill_path_is_reported_at_start_without_the_path(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    rec = recorder(FlakyStore(), blocker / "secret-name" / "spill.jsonl", Metrics())
    reason = rec.check_spill()
    assert reason is not None and reason.startswith(("FileExistsError", "NotADirectoryError"))
    assert "secret-name" not in reason and str(tmp_path) not in reason
    ok = recorder(FlakyStore(), tmp_path / "new" / "spill.jsonl", Metrics())
    assert ok.check_spill() is None
    assert not list((tmp_path / "new").iterdir())  # the probe leaves nothing behind


def test_the_old_count_limit_still_applies_and_says_it_is_deprecated(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'sb.db'}", buffer_limit=5000)
    runtime = Runtime(settings)
    runtime.start()
    try:
        assert runtime.recorder._memory.limit == 5000
        assert runtime.recorder._memory.budget == 128 * 2**20
    finally:
        runtime.stop()
    assert "SWITCHBOARD_BUFFER_LIMIT is deprecated" in caplog.text
    assert "SWITCHBOARD_BUFFER_LIMIT_MB (128)" in caplog.text
