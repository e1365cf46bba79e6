"""With real parts: nothing acknowledged is lost
silently, a writer faster than the service, backoff that holds, bounded staleness.

The fault tests start their own PostgreSQL (``PrivatePostgres``), never the shared
one; every load is bounded in time and on loopback.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from mla_switchboard.service.config import Settings
from mla_switchboard.service.metrics import Metrics

from tests.conftest import ADMIN, ServiceProcess, start_together
from tests.reliability.conftest import (
    FlakyStore,
    PrivatePostgres,
    SelectLoad,
    counter,
    metric,
    readyz,
    recorder,
    row,
    select_body,
    stored_decision_ids,
    wait_until,
)

# ------------------------------------------------------- the decision log, in process


def test_stop_with_store_down_keeps_the_log_and_next_start_stores_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log_dir = tmp_path / "spill.jsonl.log"
    store, m1 = FlakyStore(), Metrics()
    rec = recorder(store, log_dir, m1)
    rec.open()
    rec.start()
    for i in range(250):
        rec.submit(row(i))
    rec.stop()  # the store is down: nothing written, all in the log
    assert store.rows == {}
    assert counter(m1, "switchboard_decisions_dropped_total") == 0
    assert "250 decisions not yet stored stay in the log" in caplog.text

    store.up = True
    m2 = Metrics()
    again = recorder(store, log_dir, m2)
    assert again.open() == 250
    assert sorted(store.rows) == [f"id{i:05d}" for i in range(250)]
    assert store.rows["id00007"].created_at.tzinfo is not None  # times survive the round trip
    assert counter(m2, "switchboard_decisions_written_total") == 250
    again.start()
    again.stop()
    third = recorder(store, log_dir, Metrics())
    assert third.open() == 0  # the mark says all is stored: a second start is a no-op
    third.stop()


def test_a_log_that_cannot_be_written_is_reported_without_its_path_and_stop_drops(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    store, metrics = FlakyStore(), Metrics()
    rec = recorder(store, blocker / "secret-name" / "log", metrics)
    assert rec.open() == 0
    reason = rec.log_error
    assert reason is not None and reason.startswith(("FileExistsError", "NotADirectoryError"))
    assert "secret-name" not in reason and str(tmp_path) not in reason
    rec.start()
    for i in range(40):
        rec.submit(row(i))
    rec.stop()
    assert counter(metrics, "switchboard_decisions_dropped_total") == 40
    assert "dropped 40 decisions at shutdown" in caplog.text


def test_a_start_stores_for_a_bounded_time_and_the_drainer_does_the_rest(
    tmp_path: Path,
) -> None:
    store = FlakyStore()
    log_dir = tmp_path / "log"
    rec = recorder(store, log_dir, Metrics(), batch=10)
    rec.open()
    rec.start()
    for i in range(300):
        rec.submit(row(i))
    rec.stop()
    store.up, store.delay_s = True, 0.01
    again = recorder(store, log_dir, Metrics(), batch=10)
    first = again.open(budget_s=0.05)
    assert 0 < first < 300 and again.backlog() is not None
    again.start()
    assert again.flush(30)
    assert len(store.rows) == 300 and again.backlog() is None
    again.stop()


def test_default_spill_path_is_found_again_by_the_same_settings() -> None:
    sqlite = Settings(database_url="sqlite:////var/lib/sb/switchboard.db")
    assert str(sqlite.resolved_spill_path()) == "/var/lib/sb/switchboard.db-spill.jsonl"
    assert str(sqlite.resolved_log_dir()) == "/var/lib/sb/switchboard.db-spill.jsonl.log"
    assert Settings(journal=False).resolved_log_dir() is None
    assert Settings(spill_limit_mb=0).resolved_log_dir() is None
    pg = "postgresql+psycopg://sb@db/sb"
    a, b = Settings(database_url=pg), Settings(database_url=pg + "2")
    assert a.resolved_spill_path() == Settings(database_url=pg).resolved_spill_path()
    assert a.resolved_spill_path() != b.resolved_spill_path()
    assert not a.resolved_spill_path().is_absolute()  # the working directory
    assert str(Settings(spill_path="/data/s.jsonl").resolved_spill_path()) == "/data/s.jsonl"


def test_flush_waiters_do_not_make_the_writer_busy_loop() -> None:
    """Ten threads waiting for flushes while the store is down: the writer keeps to
    its backoff (before: every waiter's wake-up was a new attempt, thousands a second)."""
    store = FlakyStore()
    rec = recorder(store, None, Metrics())
    rec.open()
    rec.start()
    rec.submit(row(0))
    stop = threading.Event()

    def waiter() -> None:
        while not stop.is_set():
            rec.flush(0.05)

    threads = [threading.Thread(target=waiter) for _ in range(10)]
    for t in threads:
        t.start()
    time.sleep(3.0)
    stop.set()
    for t in threads:
        t.join(5)
    attempts = store.calls
    store.up = True
    rec.stop()
    # backoff 0.1, 0.2, 0.4, 0.8, 1.6 s: about 6 attempts in 3 s
    assert attempts <= 10, attempts


# ------------------------------------------------- SIGTERM with the database down


@pytest.mark.postgres
def test_sigterm_while_database_down_keeps_the_log_and_restart_stores_all(
    tmp_path: Path,
) -> None:
    """Before: the recorder gave up after 30 s and the process exited with every
    buffered decision lost, nothing logged, no metric moved (6,043 of 6,043)."""
    pg = PrivatePostgres()
    spill = tmp_path / "volume" / "spill.jsonl"  # the log: volume/spill.jsonl.log/
    env = {"SWITCHBOARD_SPILL_PATH": str(spill), "SWITCHBOARD_SHUTDOWN_FLUSH_S": "2"}
    try:
        pg.init().start()
        service = ServiceProcess(pg.url, env=env).start(tmp_path)
        try:
            load = SelectLoad([service.url], cluster="spill", threads=2, pause_s=0.002)
            load.start()
            load.wait_for(100)
            pg.stop("fast")
            wait_until(lambda: readyz(service)[1]["store"] == "degraded", 10, what="degraded")
            load.wait_for(len(load.answers) + 300)
            load.stop()
            assert not load.failures, load.failures[:5]
            # on disk while the database is down, before any shutdown
            buffered = readyz(service)[1]["decisions_buffered"]
            assert buffered > 0 and metric(service, "switchboard_decision_log_batches_total") > 0
            t0 = time.monotonic()
            assert service.proc is not None
            service.proc.send_signal(signal.SIGTERM)
            assert service.proc.wait(30) in (0, -signal.SIGTERM)  # uvicorn re-raises it
            exit_s = time.monotonic() - t0
        finally:
            service.stop()
        log = service.log_path.read_text() if service.log_path else ""
        kept = re.search(r"(\d+) decisions not yet stored stay in the log", log)
        assert kept is not None and int(kept[1]) >= buffered, log[-2000:]
        spilled = int(kept[1])

        pg.start()
        again = ServiceProcess(pg.url, env=env).start(tmp_path)
        try:
            replayed = metric(again, "switchboard_decisions_written_total")
        finally:
            again.stop()
        stored = stored_decision_ids(pg.url, "spill")
        print(
            f"\nSIGTERM with the database down: {len(load.answers)} answers, {buffered:.0f} "
            f"waiting before SIGTERM, exit after {exit_s:.1f}s, {spilled} kept in the log; "
            f"restart stored {replayed:.0f}; stored {len(stored)} of {len(load.answers)}"
        )
        assert stored == set(load.answers)
        assert replayed == spilled
    finally:
        pg.cleanup()


# ---------------------------------------------------- backoff, staleness, readyz


def write_attempts(service: ServiceProcess) -> float:
    """Failed decision writes so far (each one a connection attempt to the database)."""
    text = httpx.get(service.url + "/metrics", timeout=5).text
    key = 'switchboard_store_errors_total{op="record_decisions"}'
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(key))


@pytest.mark.serial
@pytest.mark.postgres
def test_outage_backoff_staleness_and_readyz_without_connection_details(
    tmp_path: Path,
) -> None:
    """Database down for ~4 s while readers wait for flushes. Before: 8,896 connection
    attempts in 9 s (a busy loop); /readyz named the database host and port; no
    replica ever reported how old its configuration was."""
    pg = PrivatePostgres()
    try:
        pg.init().start()
        plain, strict = start_together(
            tmp_path,
            ServiceProcess(pg.url),
            ServiceProcess(pg.url, env={"SWITCHBOARD_MAX_CONFIG_STALENESS_S": "1"}),
        )
        try:
            assert readyz(plain)[1]["config_age_s"] < 2
            assert readyz(strict)[0] == 200
            load = SelectLoad([plain.url], cluster="backoff", threads=1, pause_s=0.01)
            load.start()
            load.wait_for(20)
            pg.stop("fast")
            wait_until(lambda: readyz(plain)[1]["store"] == "degraded", 10, what="degraded")
            errors0 = write_attempts(plain)
            stop = threading.Event()

            def reader() -> None:  # every listing waits for a flush first
                with httpx.Client(headers={"Authorization": f"Bearer {ADMIN}"}) as c:
                    while not stop.is_set():
                        c.get(plain.url + "/v1/selections", params={"limit": 1}, timeout=10)

            readers = [threading.Thread(target=reader) for _ in range(4)]
            for t in readers:
                t.start()
            time.sleep(4.0)
            stop.set()
            for t in readers:
                t.join(15)
            attempts = write_attempts(plain) - errors0

            status, body = readyz(plain)
            text = httpx.get(plain.url + "/readyz").text
            strict_status, strict_body = readyz(strict)
            load.stop()
            pg.start()
            wait_until(lambda: readyz(strict)[0] == 200, 15, interval=0.1, what="ready again")
            age_after = readyz(strict)[1]["config_age_s"]
        finally:
            plain.stop()
            strict.stop()
        print(
            f"\noutage: {attempts:.0f} decision-write attempts in 4 s with 4 readers "
            f"waiting for flushes; readyz plain {status} "
            f"(config_age_s {body['config_age_s']}), with a 1 s maximum {strict_status}; "
            f"after recovery config_age_s {age_after}"
        )
        # backoff 0.1, 0.2, ... 2 s: at most 7 attempts in 4 s, however many wait
        assert attempts <= 8, attempts
        assert status == 200 and body["store"] == "degraded" and body["config_age_s"] > 3
        assert strict_status == 503 and strict_body["config_stale"] is True
        assert body["store_error"] == "OperationalError"
        assert "127.0.0.1" not in text and str(pg.port) not in text and "postgres" not in text
        assert age_after < 2
    finally:
        pg.cleanup()


# ------------------------------------------------- kill -9 at the maximum rate


async def _max_rate(port: int, deadline: float, answers: list[tuple[float, str]]) -> None:
    """64 keep-alive connections posting distinct pods as fast as the replica answers."""
    payloads: list[bytes] = []
    for i in range(20_000):
        body = json.dumps(select_body("kill9max", f"pod-{i}")).encode()
        payloads.append(
            b"POST /v1/select HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            + ADMIN.encode()
            + b"\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
    nxt = iter(payloads)

    async def conn() -> None:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return
        try:
            while time.monotonic() < deadline:
                payload = next(nxt, None)
                if payload is None:
                    return
                writer.write(payload)
                head = await reader.readuntil(b"\r\n\r\n")
                length, decision = 0, None
                for line in head.split(b"\r\n")[1:]:
                    k, _, v = line.partition(b":")
                    k = k.strip().lower()
                    if k == b"content-length":
                        length = int(v)
                    elif k == b"x-decision-id":
                        decision = v.strip().decode()
                await reader.readexactly(length)
                if head.startswith(b"HTTP/1.1 200") and decision:
                    answers.append((time.monotonic(), decision))
        except (OSError, asyncio.IncompleteReadError):
            return  # the replica was killed
        finally:
            writer.close()

    await asyncio.gather(*(conn() for _ in range(64)))


@pytest.mark.serial
@pytest.mark.postgres
def test_kill9_at_maximum_rate_loses_only_the_last_100ms(
    pg_url_factory: Callable[[], str], tmp_path: Path
) -> None:
    """Before: at full speed kill -9 lost 8,559 of 15,000 acknowledged decisions,
    some answered 2.1 s before the kill (the writer was slower than the service). Lost
    is what is not stored once the next replica started on the same log: what the
    drainer had not stored yet at the kill, the log holds."""
    url = pg_url_factory()
    # the killed replica leaves its log: in the test's directory, not the cwd
    env = {"SWITCHBOARD_SPILL_PATH": str(tmp_path / "spill.jsonl")}
    service = ServiceProcess(url, env=env).start(tmp_path)
    answers: list[tuple[float, str]] = []
    killed: list[float] = []
    assert service.proc is not None
    proc = service.proc

    def killer() -> None:
        wait_until(lambda: len(answers) >= 500, 30, what="load running")
        time.sleep(3.0)  # sustained maximal load
        proc.kill()
        killed.append(time.monotonic())

    k = threading.Thread(target=killer)
    k.start()
    try:
        asyncio.run(_max_rate(service.port, time.monotonic() + 30, answers))
    finally:
        k.join(60)
        service.stop()
    assert killed and proc.wait(10) == -9
    # the next start on the same log stores what the killed replica's drainer had not
    again = ServiceProcess(url, env=env).start(tmp_path)
    try:
        wait_until(lambda: readyz(again)[1]["decisions_buffered"] == 0, 60, what="drained")
        behind = metric(again, "switchboard_decisions_written_total")
    finally:
        again.stop()
    t_kill = killed[0]
    first = answers[0][0]
    rate = sum(1 for t, _ in answers if t <= t_kill) / (t_kill - first)
    stored = stored_decision_ids(url, "kill9max")
    lost = [(t_kill - t, d) for t, d in answers if d not in stored]
    window = max((age for age, _ in lost), default=0.0)
    print(
        f"\nkill -9 at maximum rate: {len(answers)} answers at {rate:.0f}/s, "
        f"{len(lost)} lost, all answered in the last {window * 1000:.0f} ms before the kill; "
        f"the restart stored {behind:.0f} from the log"
    )
    assert len(answers) > 1000
    # a few ms by design (the log's 3 ms interval and its fdatasync), whatever the
    # drainer had stored; the contract's bound is 100 ms
    assert window <= 0.1, sorted(lost)[-5:]


def test_the_old_count_limit_still_applies_and_says_it_is_deprecated(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from mla_switchboard.service.runtime import Runtime

    settings = Settings(database_url=f"sqlite:///{tmp_path / 'sb.db'}", buffer_limit=5000)
    runtime = Runtime(settings)
    runtime.start()
    try:
        assert runtime.recorder._max_rows == 5000  # under the 128 MB budget's count
    finally:
        runtime.stop()
    assert "SWITCHBOARD_BUFFER_LIMIT is deprecated" in caplog.text
    assert "SWITCHBOARD_BUFFER_LIMIT_MB (128)" in caplog.text
